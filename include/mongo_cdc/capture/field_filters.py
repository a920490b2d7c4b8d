"""Debezium's ``field.exclude.list`` and ``field.renames``, and ``field.hash.list``: rewriting
documents before they land.

An entry names ``<db>.<collection>.<field>[.<nested>...]`` (``config.field_rules`` parses the
entries; this module applies them). A field path reaches into embedded documents and into every
sub-document of an array on its way (``orders.items.sku`` is each item's ``sku``). Excluded fields
go first, then the hashes (on the names the documents have), then the renames one after the other,
each to the result of the previous one.

A hashed field's value becomes the string of its keyed hash (``mongo_cdc.field_hashing``). A
document or an array there keeps its structure and has every value inside it hashed instead: an
update that sets a part of it (``contacts.0.email``, ``phones.1``) then hashes to what the whole
value's hashing gave, so the state folded from update descriptions equals the one from full
documents.

The same rules rewrite ``before`` and ``after`` (snapshot reads and change events) and
``updateDescription``, whose paths are dotted and may hold array positions (``items.3.sku``): a
position matches any array element, like the walk above.

Documents are BSON bytes in and out, rewritten by elements (``mongo_cdc.bson_elements``): every
element a rule does not remove or rename keeps its bytes, so no value changes type (the deprecated
BSON types included) and no field name is read as anything but a name (a ``$ref``/``$id`` pair is a
document like any other).

Only a namespace with a rule gets a ``CollectionFieldRules``; every other one gets None, so the
snapshot's hot path keeps its per-document cost when nothing applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mongo_cdc.bson_elements import DOCUMENT, STRING, Container
from mongo_cdc.config.field_rules import HASH_LIST_KEY, RENAMES_KEY, FieldRule
from mongo_cdc.field_hashing import HashKey

if TYPE_CHECKING:
    from mongo_cdc.config import SourceConfig


class FieldRenameConflict(ValueError):
    """A rename would overwrite a field the document already has; Debezium refuses it too."""


class HashKeyMissing(ValueError):
    """``field.hash.list`` names a collection's field, and no key was given to hash it with (the
    Airflow layer gives it: ``SourceConfig.with_hash_key``)."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f"{HASH_LIST_KEY} hashes fields of {namespace}, but no key was given: the key is the "
            "password of the Airflow connection named by field.hash.connection.id"
        )


class FieldFilters:
    """Every rule of a source, and each namespace's own rules once looked up."""

    def __init__(self, rules: Sequence[FieldRule] = (), hash_key: HashKey | None = None) -> None:
        self.rules = tuple(sorted(rules, key=_rule_order))
        self.hash_key = hash_key
        self._by_namespace: dict[str, CollectionFieldRules | None] = {}

    def for_collection(self, db: str, collection: str) -> CollectionFieldRules | None:
        namespace = f"{db}.{collection}"
        if namespace in self._by_namespace:
            return self._by_namespace[namespace]
        rules = tuple(rule for rule in self.rules if rule.namespace.fullmatch(namespace))
        if self.hash_key is None and any(rule.hashed for rule in rules):
            raise HashKeyMissing(namespace)
        found = CollectionFieldRules(namespace, rules, self.hash_key) if rules else None
        self._by_namespace[namespace] = found
        return found


def _rule_order(rule: FieldRule) -> int:
    """Exclusions first, then renames in their order (Debezium's order); the hashes between them,
    so that they name the fields as the documents do (``sorted`` keeps each kind's order)."""
    if rule.hashed:
        return 1
    return 0 if rule.new_name is None else 2


def collection_field_rules(config: SourceConfig, db: str, collection: str) -> CollectionFieldRules | None:
    """The source's rules (``field.exclude.list``, ``field.hash.list`` with the source's key, then
    ``field.renames``) that apply to the collection; HashKeyMissing if a hash applies and the
    source has no key."""
    rules = config.field_exclude + config.field_hash + config.field_renames
    return _field_filters(rules, config.field_hash_key).for_collection(db, collection)


@lru_cache(maxsize=64)
def _field_filters(rules: tuple[FieldRule, ...], hash_key: HashKey | None) -> FieldFilters:
    """One ``FieldFilters`` per rule set and key, so its per-collection lookups are kept across calls."""
    return FieldFilters(rules, hash_key)


class CollectionFieldRules:
    """The rules of one collection, applied to its documents and update descriptions."""

    def __init__(self, namespace: str, rules: tuple[FieldRule, ...], hash_key: HashKey | None = None) -> None:
        self.namespace = namespace
        self.rules = rules
        self.hash_key = hash_key

    def document(self, data: bytes) -> bytes:
        """The BSON document ``data`` rewritten: its own bytes where no rule applies."""
        opened: Container | None = None
        for rule in self.rules:
            # a field a rule names is there only if its name is, followed by the NUL ending it;
            # once a rule has renamed a field, the names are no longer those of ``data``
            if opened is None and rule.names[0] + b"\x00" not in data:
                continue
            if opened is None:
                opened = Container(DOCUMENT, data)
            self._at(opened, rule, 0)
        return opened.to_bytes() if opened is not None else data

    def update_description(self, description: dict[str, Any]) -> dict[str, Any]:
        """A raw row's ``updateDescription`` (``updatedFields`` BSON whose names are dotted paths,
        ``removedFields``, ``truncatedArrays``) rewritten, as a new dict."""
        updated_fields = description.get("updatedFields")
        updated = Container(DOCUMENT, updated_fields) if updated_fields else None
        removed = list(description.get("removedFields") or [])
        truncated = list(description.get("truncatedArrays") or [])
        for rule in self.rules:
            if updated is not None:
                self._updated_fields(updated, rule)
            removed = [path for p in removed if (path := _rewritten_path(p, rule)) is not None]
            truncated = [
                {**entry, "field": path}
                for entry in truncated
                if (path := _rewritten_path(entry["field"], rule)) is not None
            ]
        return {
            **description,
            "updatedFields": updated.to_bytes() if updated is not None else updated_fields,
            "removedFields": removed,
            "truncatedArrays": truncated,
        }

    def _at(self, document: Container, rule: FieldRule, depth: int) -> None:
        position = document.position(rule.names[depth])
        if position is None:
            return
        if depth + 1 < len(rule.names):
            self._within(document, position, rule, depth + 1)
        elif rule.hashed:
            self._hash(document, position)
        elif rule.new_name is None:
            document.remove(position)
        elif document.position(rule.encoded_new_name) is not None:
            raise FieldRenameConflict(
                f"{RENAMES_KEY} entry {rule.entry!r}: a document of {self.namespace} already has a field "
                f"{rule.new_name!r} next to {rule.path[depth]!r}, and renaming would overwrite it; "
                "pick a new name that no document uses"
            )
        else:
            document.rename(position, rule.encoded_new_name)

    def _within(self, container: Container, position: int, rule: FieldRule, depth: int) -> None:
        """The rule applied inside the value at ``position``: a document, every element of an array."""
        inner = container.opened(position)
        if inner is None:
            return
        if inner.kind == DOCUMENT:
            self._at(inner, rule, depth)
            return
        for element in range(len(inner)):
            self._within(inner, element, rule, depth)

    def _hash(self, container: Container, position: int) -> None:
        """The value at ``position`` hashed: a document's or array's every value, its structure kept."""
        inner = container.opened(position)
        if inner is None:
            assert self.hash_key is not None  # FieldFilters.for_collection refuses hashes without a key
            hashed = self.hash_key.hashed_string(container.kinds[position], container.value(position))
            container.replace(position, STRING, hashed)
            return
        for element in range(len(inner)):
            self._hash(inner, element)

    def _updated_fields(self, updated: Container, rule: FieldRule) -> None:
        paths = set(updated.names)
        for position in reversed(range(len(updated))):  # from the end: removing keeps the rest in place
            path = updated.names[position]
            parts = path.split(b".")
            reach = _reach(parts, rule.names)
            if reach is None:
                continue
            if reach[0] < len(rule.names):  # the update sets a parent: rewrite inside its new value
                self._within(updated, position, rule, reach[0])
            elif rule.hashed:  # the rule's field itself, or a part of it
                self._hash(updated, position)
            elif rule.new_name is None:
                updated.remove(position)
            else:  # the rule's field itself, or something inside it
                renamed = _renamed_path(parts, reach[1], rule.encoded_new_name)
                if renamed in paths:
                    raise FieldRenameConflict(
                        f"{RENAMES_KEY} entry {rule.entry!r}: an update of {self.namespace} sets both "
                        f"{path.decode(errors='replace')!r} and {renamed.decode(errors='replace')!r}; "
                        "pick a new name that no document uses"
                    )
                updated.rename(position, renamed)


def _reach(parts: list[bytes], rule_names: tuple[bytes, ...]) -> tuple[int, int] | None:
    """How far a dotted update path follows the rule's path, or None if it leads elsewhere.

    ``(fields matched, index in parts of the last one)``. ``len(rule_names)`` fields matched: the
    path is the rule's field or lies inside it; fewer: the path ends at a parent of it. Array
    positions in the path (digits the rule does not name) match any element.
    """
    depth = last = 0
    for index, part in enumerate(parts):
        if depth == len(rule_names):
            break
        if part == rule_names[depth]:
            depth, last = depth + 1, index
        elif not part.isdigit():
            return None
    return depth, last


def _renamed_path(parts: list[bytes], index: int, new_name: bytes) -> bytes:
    return b".".join([*parts[:index], new_name, *parts[index + 1 :]])


def _rewritten_path(path: str, rule: FieldRule) -> str | None:
    """A dotted path (``removedFields``, ``truncatedArrays``) after the rule; None if excluded."""
    if rule.hashed:  # a hashed field keeps its name
        return path
    parts = path.encode().split(b".")
    reach = _reach(parts, rule.names)
    if reach is None or reach[0] < len(rule.names):  # elsewhere, or a parent: the parent stays
        return path
    if rule.encoded_new_name is None:
        return None
    return _renamed_path(parts, reach[1], rule.encoded_new_name).decode()
