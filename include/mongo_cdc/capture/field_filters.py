"""Debezium's ``field.exclude.list`` and ``field.renames``: rewriting documents before they land.

An entry names ``<db>.<collection>.<field>[.<nested>...]`` (``config.field_rules`` parses the
entries; this module applies them). A field path reaches into embedded documents and into every
sub-document of an array on its way (``orders.items.sku`` is each item's ``sku``). Excluded fields
go first, then the renames apply one after the other, each to the result of the previous one.

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

from mongo_cdc.bson_elements import DOCUMENT, Container
from mongo_cdc.config.field_rules import RENAMES_KEY, FieldRule

if TYPE_CHECKING:
    from mongo_cdc.config import SourceConfig


class FieldRenameConflict(ValueError):
    """A rename would overwrite a field the document already has; Debezium refuses it too."""


class FieldFilters:
    """Every rule of a source, and each namespace's own rules once looked up."""

    def __init__(self, rules: Sequence[FieldRule] = ()) -> None:
        # exclusions first, then renames in their order: Debezium's order
        self.rules = tuple(sorted(rules, key=lambda rule: rule.new_name is not None))
        self._by_namespace: dict[str, CollectionFieldRules | None] = {}

    def for_collection(self, db: str, collection: str) -> CollectionFieldRules | None:
        namespace = f"{db}.{collection}"
        try:
            return self._by_namespace[namespace]
        except KeyError:
            rules = tuple(rule for rule in self.rules if rule.namespace.fullmatch(namespace))
            found = CollectionFieldRules(namespace, rules) if rules else None
            self._by_namespace[namespace] = found
            return found


def collection_field_rules(config: SourceConfig, db: str, collection: str) -> CollectionFieldRules | None:
    """The source's rules (``field.exclude.list``, then ``field.renames``) that apply to the collection."""
    return _field_filters(config.field_exclude + config.field_renames).for_collection(db, collection)


@lru_cache(maxsize=64)
def _field_filters(rules: tuple[FieldRule, ...]) -> FieldFilters:
    """One ``FieldFilters`` per rule set, so its per-collection lookups are kept across calls."""
    return FieldFilters(rules)


class CollectionFieldRules:
    """The rules of one collection, applied to its documents and update descriptions."""

    def __init__(self, namespace: str, rules: tuple[FieldRule, ...]) -> None:
        self.namespace = namespace
        self.rules = rules

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
    parts = path.encode().split(b".")
    reach = _reach(parts, rule.names)
    if reach is None or reach[0] < len(rule.names):  # elsewhere, or a parent: the parent stays
        return path
    if rule.encoded_new_name is None:
        return None
    return _renamed_path(parts, reach[1], rule.encoded_new_name).decode()
