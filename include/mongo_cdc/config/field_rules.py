"""The entries of Debezium's ``field.exclude.list`` and ``field.renames``, and of our
``field.hash.list``: what a rule names.

An entry names ``<db>.<collection>.<field>[.<nested>...]``; ``*`` in the database or collection
part matches any characters (so a collection whose name holds a dot is reachable only through a
wildcard, as in Debezium). ``field.renames`` entries end with ``:<new name>``; ``field.hash.list``
entries have the form of ``field.exclude.list``'s.

The settings (``config.source``) hold the parsed rules; the capture applies them to documents
(``capture.field_filters``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

RENAMES_KEY = "field.renames"
HASH_LIST_KEY = "field.hash.list"
_EXCLUDE_FORMAT = "<database>.<collection>.<field>[.<nested field>...]"
_RENAME_FORMAT = f"{_EXCLUDE_FORMAT}:<new name>"


@dataclass(frozen=True)
class FieldRule:
    """One entry: ``hashed`` replaces the values at ``path`` by their keyed hashes; otherwise
    ``new_name`` None excludes the field at ``path``, and a name renames its last part."""

    entry: str
    namespace: re.Pattern
    path: tuple[str, ...]
    new_name: str | None = None
    hashed: bool = False

    @cached_property
    def names(self) -> tuple[bytes, ...]:
        """``path`` as BSON holds field names (UTF-8)."""
        return tuple(part.encode() for part in self.path)

    @cached_property
    def encoded_new_name(self) -> bytes | None:
        return self.new_name.encode() if self.new_name is not None else None


def parse_rules(key: str, value: Any) -> tuple[FieldRule, ...]:
    """The entries of ``field.exclude.list``, ``field.hash.list`` or ``field.renames`` (a list or a
    comma-separated string).

    ValueError naming the key, the entry and the expected format for a malformed entry.
    """
    renames = key == RENAMES_KEY
    expected = _RENAME_FORMAT if renames else _EXCLUDE_FORMAT
    if isinstance(value, str):
        entries = [item.strip() for item in value.split(",") if item.strip()]
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        entries = [item.strip() for item in value]
    else:
        raise ValueError(f"key '{key}' must be a list or a comma-separated string of {expected}")
    rules = []
    for entry in entries:
        name, separator, new_name = entry.partition(":") if renames else (entry, "", "")
        parts = name.split(".")
        if (
            len(parts) < 3
            or not all(parts)
            or (renames and (not separator or not new_name or "." in new_name or ":" in new_name))
        ):
            raise ValueError(f"key '{key}' has {entry!r}; expected {expected}")
        if parts[2] == "_id":
            raise ValueError(
                f"key '{key}' has {entry!r}: the document key '_id' cannot be excluded, hashed or renamed"
            )
        namespace = re.compile(".*".join(re.escape(piece) for piece in f"{parts[0]}.{parts[1]}".split("*")))
        rules.append(
            FieldRule(entry, namespace, tuple(parts[2:]), new_name if renames else None, key == HASH_LIST_KEY)
        )
    return tuple(rules)
