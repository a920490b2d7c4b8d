"""The model's oracle of ``field.hash.list``: which fields the model sequences hash, what their
documents must land as, and the search for a clear value in a landed document.

It follows the documented rule (docs/semantics.md, "Hashed fields") on the model's own documents,
independently of the capture's code: a value at a hashed path becomes the hex HMAC-SHA-256, keyed by
``HASH_KEY``, of its BSON element's type byte and value bytes (as ``bson.encode`` writes them, which
``Sequence`` checks are MongoDB's bytes); a document or array there keeps its structure and has every
value inside it hashed; an array on the way has each of its sub-documents reached.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator
from typing import Any

import bson

HASH_KEY = b"the model's field.hash.list key"
# collection (a regex of its name) -> the paths hashed in it: a top-level field of c0, whatever type
# the draws give it, and a field inside the sub-documents that ``b`` holds in every collection
HASHED: dict[str, tuple[tuple[str, ...], ...]] = {"c0": (("a",),), ".*": (("b", "x"),)}
_HASH = re.compile("[0-9a-f]{64}")


def hash_entries(database: str) -> list[str]:
    """``HASHED`` as the source's ``field.hash.list`` entries for ``database``."""
    return [f"{database}.{'*' if coll == '.*' else coll}.{'.'.join(path)}" for coll, path in _rules()]


def _rules() -> Iterator[tuple[str, tuple[str, ...]]]:
    for coll, paths in HASHED.items():
        for path in paths:
            yield coll, path


def hashed_paths(coll: str) -> set[tuple[str, ...]]:
    """The paths hashed in collection ``coll`` (by its name now: a renamed collection's new one)."""
    return {path for pattern, path in _rules() if re.fullmatch(pattern, coll)}


def _hashed_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _hashed_value(inner) for name, inner in value.items()}
    if isinstance(value, list):
        return [_hashed_value(inner) for inner in value]
    element = bson.encode({"v": value})  # int32 length, type byte, "v\0", value bytes, "\0"
    return hmac.new(HASH_KEY, element[4:5] + element[7:-1], hashlib.sha256).hexdigest()


def _hashed_at(value: Any, path: tuple[str, ...]) -> Any:
    if not path:
        return _hashed_value(value)
    if isinstance(value, dict):
        return {
            name: (_hashed_at(inner, path[1:]) if name == path[0] else inner) for name, inner in value.items()
        }
    if isinstance(value, list):
        return [_hashed_at(inner, path) for inner in value]
    return value


def expected_document(coll: str, document: dict) -> bytes:
    """The BSON the lake must hold for the model's ``document`` of ``coll``: its hashed fields hashed."""
    for path in sorted(hashed_paths(coll)):
        document = _hashed_at(document, path)
    return bson.encode(document)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for inner in value.values():
            yield from _leaves(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _leaves(inner)
    else:
        yield value


def _at(value: Any, path: tuple[str, ...]) -> Iterator[Any]:
    """The leaves of the values at ``path`` in ``value`` (through arrays on the way)."""
    if not path:
        yield from _leaves(value)
    elif isinstance(value, dict):
        if path[0] in value:
            yield from _at(value[path[0]], path[1:])
    elif isinstance(value, list):
        for inner in value:
            yield from _at(inner, path)


def clear_values(coll: str, document: bytes, dotted: bool = False) -> list[Any]:
    """The values at ``coll``'s hashed paths in ``document`` that are not hashes. ``dotted``: the
    document is an ``updatedFields`` one, whose names are dotted paths (``a.0``, ``b.x``, ``b``)."""
    found = []
    for name, value in bson.decode(document).items():
        parts = tuple(name.split(".")) if dotted else (name,)
        for path in hashed_paths(coll):
            shared = path[: len(parts)]
            if parts[: len(path)] == path:  # the hashed field, or a part of it
                found.extend(_at(value, ()))
            elif parts == shared:  # a parent of the hashed field
                found.extend(_at(value, path[len(parts) :]))
    return [leaf for leaf in found if not (isinstance(leaf, str) and _HASH.fullmatch(leaf))]
