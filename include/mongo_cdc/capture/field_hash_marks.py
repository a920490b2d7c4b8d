"""The key and ``field.hash.list`` entries a collection's hashes were made with, kept in its raw table,
and the refusal to land rows hashed otherwise into it.

A hash is joinable only with hashes of the same key, so one table must never hold two keys' (or
two lists') values. Each raw table records its collection's mark as a table property
(``FIELD_HASH_PROPERTY``): the key's check (``HashKey.check``, never the key) and the entries that
apply to the collection, as JSON; empty or absent when none does. Before rows of a collection land,
``FieldHashMarks.check`` compares the mark this run would write with the table's and refuses a
difference (``FieldHashChanged``, naming the fix); a table that does not exist yet is created with
this run's mark. A snapshot copying the whole collection again (a re-snapshot) ``adopt``s the mark:
the state it reconciles is all of the new mark, so streaming may go on under it. The raw and changes
tables keep their older rows as they were hashed then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from mongo_cdc.capture.field_filters import HashKeyMissing
from mongo_cdc.config import SourceConfig, SourceConfigError
from mongo_cdc.config.field_rules import HASH_LIST_KEY
from mongo_cdc.lake.landing import SourceLake

# The raw table property holding the mark (a sibling of the table's other mongo_cdc.* properties).
FIELD_HASH_PROPERTY = "mongo_cdc.field.hash"


class FieldHashChanged(SourceConfigError):
    """A collection's raw table was landed under another ``field.hash.list`` key or list."""


def field_hash_mark(config: SourceConfig, namespace: str) -> str:
    """The mark of ``namespace`` under ``config``: "" when no ``field.hash.list`` entry applies."""
    entries = sorted(rule.entry for rule in config.field_hash if rule.namespace.fullmatch(namespace))
    if not entries:
        return ""
    if config.field_hash_key is None:
        raise HashKeyMissing(namespace)
    return json.dumps({"key": config.field_hash_key.check, "entries": entries}, separators=(",", ":"))


class FieldHashMarks:
    """One capture step's checks of the raw tables it writes to: each table is read once."""

    def __init__(self, lake: SourceLake, config: SourceConfig) -> None:
        self.lake = lake
        self.config = config
        self._checked: set[str] = set()

    def check(self, namespaces: Iterable[str]) -> None:
        """Refuse (``FieldHashChanged``, naming every one) the namespaces whose raw table has another
        mark than this run's; a namespace with no raw table yet gets one with this run's mark."""
        changed = []
        for namespace in namespaces:
            if namespace in self._checked:
                continue
            wanted = field_hash_mark(self.config, namespace)
            properties = self.lake.raw_table_properties(namespace)
            if properties is None:
                if wanted:
                    self.lake.set_raw_table_properties(namespace, {FIELD_HASH_PROPERTY: wanted})
            elif (found := properties.get(FIELD_HASH_PROPERTY) or "") != wanted:
                changed.append(_change(self.config, namespace, found, wanted))
                continue
            self._checked.add(namespace)
        if changed:
            raise FieldHashChanged(_refusal(changed))

    def before_copy(self, namespace: str, whole: bool) -> None:
        """A snapshot is about to copy ``namespace``: a ``whole`` copy lands it again under this run's
        mark (``adopt``); a filtered one adds to what the table holds (``check``)."""
        if whole:
            self.adopt(namespace)
        else:
            self.check([namespace])

    def adopt(self, namespace: str) -> None:
        """Record this run's mark on ``namespace``'s raw table (created if need be): a whole copy of
        the collection is landing under it."""
        wanted = field_hash_mark(self.config, namespace)
        properties = self.lake.raw_table_properties(namespace)
        if (properties or {}).get(FIELD_HASH_PROPERTY, "") != wanted:
            self.lake.set_raw_table_properties(namespace, {FIELD_HASH_PROPERTY: wanted})
        self._checked.add(namespace)


def _change(config: SourceConfig, namespace: str, found: str, wanted: str) -> tuple[str, str]:
    """(namespace, what changed) for a table whose mark ``found`` is not this run's ``wanted``."""
    was, now = (json.loads(mark) if mark else {"key": None, "entries": []} for mark in (found, wanted))
    if was["entries"] != now["entries"]:
        return namespace, f"its {HASH_LIST_KEY} entries were {was['entries']}, now {now['entries']}"
    return namespace, f"the key (the password of connection '{config.field_hash_conn_id}') changed"


def _refusal(changed: list[tuple[str, str]]) -> str:
    names = json.dumps([namespace for namespace, _ in changed])
    return (
        "; ".join(f"{namespace}: {change}" for namespace, change in changed)
        + ". Landing on would mix two kinds of hashed values in one table. Re-snapshot these collections"
        f' to land them again as configured (trigger the DAG with {{"resnapshot": true, "collections": '
        f"{names}}}), or restore the previous {HASH_LIST_KEY} and key"
    )
