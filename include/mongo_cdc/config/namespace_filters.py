"""Which namespaces a source captures: its database and collection filters (Debezium's
``database.*`` and ``collection.*`` lists) and the rules beside them, as methods ``SourceConfig``
inherits (the filters are its fields)."""

from __future__ import annotations

import re
from functools import cached_property

# Databases MongoDB uses for itself; Debezium never captures them either.
SYSTEM_DATABASES = frozenset({"admin", "local", "config"})


class NamespaceFilters:
    """The filters' answers for a ``SourceConfig``: what it captures, and what it copies."""

    database_include: tuple[re.Pattern, ...]
    database_exclude: tuple[re.Pattern, ...]
    collection_include: tuple[re.Pattern, ...]
    collection_exclude: tuple[re.Pattern, ...]
    snapshot_include: tuple[re.Pattern, ...]

    def captures_database(self, db: str) -> bool:
        if db in SYSTEM_DATABASES:
            return False
        if self.database_include:
            return any(p.fullmatch(db) for p in self.database_include)
        return not any(p.fullmatch(db) for p in self.database_exclude)

    def captures_collection(self, db: str, collection: str) -> bool:
        captured = self._captured_namespaces.get((db, collection))
        if captured is None:
            captured = self._captured_namespaces[(db, collection)] = self._matches_collection(db, collection)
        return captured

    @cached_property
    def _captured_namespaces(self) -> dict[tuple[str, str], bool]:
        """``captures_collection``'s answers so far: a pull asks for every event it reads."""
        return {}

    def _matches_collection(self, db: str, collection: str) -> bool:
        return not collection.startswith("system.") and self.filters_match(db, collection)

    def filters_match(self, db: str, collection: str) -> bool:
        """Whether the database and collection filters name ``db.collection``, before the rule that
        no ``system.*`` collection is captured: discovery reports those it leaves out."""
        if not self.captures_database(db):
            return False
        namespace = f"{db}.{collection}"
        if self.collection_include:
            return any(p.fullmatch(namespace) for p in self.collection_include)
        return not any(p.fullmatch(namespace) for p in self.collection_exclude)

    def snapshots_collection(self, db: str, collection: str) -> bool:
        """Captured and copied by snapshots (``snapshot.include.collection.list``), not only streamed."""
        if not self.captures_collection(db, collection):
            return False
        namespace = f"{db}.{collection}"
        return not self.snapshot_include or any(p.fullmatch(namespace) for p in self.snapshot_include)
