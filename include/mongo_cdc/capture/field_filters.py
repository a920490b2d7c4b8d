"""Debezium's ``field.exclude.list`` and ``field.renames``: rewriting documents before they land.

An entry names ``<db>.<collection>.<field>[.<nested>...]``; ``*`` in the database or collection
part matches any characters (so a collection whose name holds a dot is reachable only through a
wildcard, as in Debezium). A field path reaches into embedded documents and into every
sub-document of an array on its way (``orders.items.sku`` is each item's ``sku``). Excluded fields
go first, then the renames apply one after the other, each to the result of the previous one.

The same rules rewrite ``after`` (snapshot reads and change events) and ``updateDescription``,
whose paths are dotted and may hold array positions (``items.3.sku``): a position matches any
array element, like the walk above.

Only a namespace with a rule gets a ``CollectionFieldRules``; every other one gets None, so the
snapshot's hot path keeps its per-document cost when nothing applies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EXCLUDE_KEY = "field.exclude.list"
RENAMES_KEY = "field.renames"
_EXCLUDE_FORMAT = "<database>.<collection>.<field>[.<nested field>...]"
_RENAME_FORMAT = f"{_EXCLUDE_FORMAT}:<new name>"


class FieldRenameConflict(ValueError):
    """A rename would overwrite a field the document already has; Debezium refuses it too."""


@dataclass(frozen=True)
class FieldRule:
    """One entry: ``new_name`` None excludes the field at ``path``, otherwise renames its last part."""

    entry: str
    namespace: re.Pattern
    path: tuple[str, ...]
    new_name: str | None = None


def parse_rules(key: str, value: Any) -> tuple[FieldRule, ...]:
    """The entries of ``field.exclude.list`` or ``field.renames`` (a list or a comma-separated string).

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
                f"key '{key}' has {entry!r}: the document key '_id' cannot be excluded or renamed"
            )
        namespace = re.compile(".*".join(re.escape(piece) for piece in f"{parts[0]}.{parts[1]}".split("*")))
        rules.append(FieldRule(entry, namespace, tuple(parts[2:]), new_name if renames else None))
    return tuple(rules)


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


class CollectionFieldRules:
    """The rules of one collection, applied to its documents and update descriptions."""

    def __init__(self, namespace: str, rules: tuple[FieldRule, ...]) -> None:
        self.namespace = namespace
        self.rules = rules

    def document(self, document: dict[str, Any]) -> dict[str, Any]:
        """``document`` rewritten; it is changed in place where that keeps its field order."""
        for rule in self.rules:
            document = self._at(document, rule, 0)
        return document

    def update_description(self, description: dict[str, Any]) -> dict[str, Any]:
        """A change stream ``updateDescription`` rewritten: a new dict, whose ``updatedFields`` values
        (sub-documents) are rewritten in place like ``document``."""
        updated = dict(description.get("updatedFields") or {})
        removed = list(description.get("removedFields") or [])
        truncated = list(description.get("truncatedArrays") or [])
        for rule in self.rules:
            updated = self._updated_fields(updated, rule)
            removed = [path for p in removed if (path := _rewritten_path(p, rule)) is not None]
            truncated = [
                {**entry, "field": path}
                for entry in truncated
                if (path := _rewritten_path(entry["field"], rule)) is not None
            ]
        return {
            **description,
            "updatedFields": updated,
            "removedFields": removed,
            "truncatedArrays": truncated,
        }

    def _at(self, document: dict[str, Any], rule: FieldRule, depth: int) -> dict[str, Any]:
        name = rule.path[depth]
        if name not in document:
            return document
        if depth + 1 < len(rule.path):
            document[name] = self._within(document[name], rule, depth + 1)
            return document
        if rule.new_name is None:
            del document[name]
            return document
        return self._renamed(document, name, rule)

    def _within(self, value: Any, rule: FieldRule, depth: int) -> Any:
        if isinstance(value, dict):
            return self._at(value, rule, depth)
        if isinstance(value, list):
            return [self._within(item, rule, depth) for item in value]
        return value

    def _renamed(self, document: dict[str, Any], name: str, rule: FieldRule) -> dict[str, Any]:
        if rule.new_name in document:
            raise FieldRenameConflict(
                f"{RENAMES_KEY} entry {rule.entry!r}: a document of {self.namespace} already has a field "
                f"{rule.new_name!r} next to {name!r}, and renaming would overwrite it; "
                "pick a new name that no document uses"
            )
        return {rule.new_name if key == name else key: value for key, value in document.items()}

    def _updated_fields(self, updated: dict[str, Any], rule: FieldRule) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for path, value in updated.items():
            parts = path.split(".")
            reach = _reach(parts, rule.path)
            if reach is None:
                result[path] = value
            elif reach[0] < len(rule.path):  # the update sets a parent: rewrite inside its new value
                result[path] = self._within(value, rule, reach[0])
            elif rule.new_name is not None:  # the rule's field itself, or something inside it
                renamed = _renamed_path(parts, reach[1], rule.new_name)
                if renamed in updated:
                    raise FieldRenameConflict(
                        f"{RENAMES_KEY} entry {rule.entry!r}: an update of {self.namespace} sets both "
                        f"{path!r} and {renamed!r}; pick a new name that no document uses"
                    )
                result[renamed] = value
        return result


def _reach(parts: list[str], rule_path: tuple[str, ...]) -> tuple[int, int] | None:
    """How far a dotted update path follows the rule's path, or None if it leads elsewhere.

    ``(fields matched, index in parts of the last one)``. ``len(rule_path)`` fields matched: the
    path is the rule's field or lies inside it; fewer: the path ends at a parent of it. Array
    positions in the path (digits the rule does not name) match any element.
    """
    depth = last = 0
    for index, part in enumerate(parts):
        if depth == len(rule_path):
            break
        if part == rule_path[depth]:
            depth, last = depth + 1, index
        elif not part.isdigit():
            return None
    return depth, last


def _renamed_path(parts: list[str], index: int, new_name: str) -> str:
    return ".".join([*parts[:index], new_name, *parts[index + 1 :]])


def _rewritten_path(path: str, rule: FieldRule) -> str | None:
    """A dotted path (``removedFields``, ``truncatedArrays``) after the rule; None if excluded."""
    parts = path.split(".")
    reach = _reach(parts, rule.path)
    if reach is None or reach[0] < len(rule.path):  # elsewhere, or a parent: the parent stays
        return path
    return None if rule.new_name is None else _renamed_path(parts, reach[1], rule.new_name)
