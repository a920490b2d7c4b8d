"""Model sequences over every kind of collection the source captures differently: ``KindsSequence``
plays ``model_support``'s steps with hashed fields (``model_hashing``) and a time-series collection
(``model_time_series``) beside the streamed collections.

Its source hashes ``model_hashing.HASHED``'s fields, so each state table must hold the model's
documents with those values hashed, and after the last run no raw, changes or state row of any
collection holds a clear value at a hashed path (before and after images, ``updatedFields``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from model_hashing import HASH_KEY, clear_values, expected_document, hash_entries
from model_support import COLLECTIONS, Run, Sequence
from model_time_series import TIME_SERIES_WRITES, Reconcile, TimeSeriesModel

from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.config.field_rules import HASH_LIST_KEY, parse_rules
from mongo_cdc.field_hashing import HashKey
from mongo_cdc.lake.landing import SourceLake


@dataclass
class KindsSequence(Sequence):
    """A ``Sequence`` whose source hashes fields and which may write a time-series collection."""

    reconciling: bool = False  # the Run being played is a Reconcile

    def __post_init__(self) -> None:
        super().__post_init__()
        rules = parse_rules(HASH_LIST_KEY, hash_entries(self.database))
        self.config = replace(self.config, field_hash=rules).with_hash_key(HashKey(HASH_KEY))
        self.time_series = TimeSeriesModel(self.db)

    def check(self, steps: list[Any]) -> None:
        super().check(steps)
        self._check_no_clear_value()

    def apply(self, step: Any) -> None:
        if isinstance(step, TIME_SERIES_WRITES):
            self.time_series.apply(step)
        elif isinstance(step, Reconcile):
            self.reconciling = True
            try:
                super().apply(Run())
            finally:
                self.reconciling = False
        else:
            super().apply(step)

    def _transform(self) -> None:
        # the time-series pass ends the capture, after the pull or the snapshot's commit, as a DAG
        # run's shard_sync.snapshot does
        self.time_series.capture(ReplicaSetCapture(self.client, self.config, self.keeper), self.reconciling)
        super()._transform()

    def _run(self) -> None:
        super()._run()
        source_lake = SourceLake(self.location, self.prefix)

        def raw_rows(name: str, columns: list[str]) -> list[dict]:
            return source_lake.committed_raw(f"{self.database}.{name}", columns).to_pylist()

        self.time_series.check(self.runs, self.reconciling, self._rows, raw_rows)

    def _expected_state(self, name: str) -> dict[Any, bytes]:
        return {key: expected_document(name, doc) for key, doc in self.model.get(name, {}).items()}

    def _check_no_clear_value(self) -> None:
        source_lake = SourceLake(self.location, self.prefix)
        for name in COLLECTIONS:
            raw = source_lake.committed_raw(
                f"{self.database}.{name}", ["before", "after", "updateDescription"]
            )
            documents = [*raw.column("before").to_pylist(), *raw.column("after").to_pylist()]
            # (a table of drops and renames alone has no document column)
            documents += [row.get("__doc_bson") for row in self._rows("changes", name)]
            documents += [row["__doc_bson"] for row in self._rows("state", name, ["__doc_bson"])]
            found = [value for document in documents if document for value in clear_values(name, document)]
            for description in raw.column("updateDescription").to_pylist():
                if description and description["updatedFields"]:
                    found += clear_values(name, description["updatedFields"], dotted=True)
            assert not found, f"{name}: clear values at hashed paths in the lake: {found[:3]}"
