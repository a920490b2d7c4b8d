"""The model sequences' time-series collection: its steps, what each run must have landed of it, and
the checks (docs/semantics.md, "Time-series collections").

A time-series collection is not streamed: each run reads the measurements of its window, and a
reconcile (the trigger param ``verify``) lands what the windows cannot see. So the model checks:

* **after a reconcile**, the state holds exactly MongoDB's measurements, byte for byte;
* **between reconciles**, what the windows read: every measurement inserted on time or late inside
  the lateness window (or before the collection's first read, which copies it) is in the state as
  MongoDB returns it, and none inserted later than the lateness allows after that first read is;
  measurements an ``updateMany`` or ``deleteMany`` touched since the last reconcile are left out
  (only the reconcile lands those changes, and the model does not say what the state holds then);
* **after every run**, no measurement landed twice: each ``_id`` has at most one ``r`` or ``c`` row
  and at most one ``d`` row, in the raw table and in the changes table.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import bson
from bson import ObjectId
from bson.raw_bson import RawBSONDocument

from mongo_cdc import extjson
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.time_series import capture_time_series

TIME_SERIES = "ts"
# how long before the server's clock a measurement is timed: within the default lateness
# (time.series.lateness.seconds, an hour) or beyond it
LATE_SECONDS = {"now": 0, "inside": 60, "beyond": 2 * 3600}
RAW_BSON = bson.CodecOptions(document_class=RawBSONDocument)


@dataclass
class Measure:
    """A measurement of ``meta`` timed ``late`` before the server's clock (``LATE_SECONDS``)."""

    meta: str
    late: str


@dataclass
class UpdateMeta:
    """``updateMany`` of the measurements of ``meta``: their ``metaField`` set to ``to``."""

    meta: str
    to: str


@dataclass
class DeleteMeta:
    """``deleteMany`` of the measurements of ``meta``."""

    meta: str


@dataclass
class Reconcile:
    """A Run whose time-series pass reconciles, as the trigger param ``verify`` asks."""


TIME_SERIES_WRITES = (Measure, UpdateMeta, DeleteMeta)


@dataclass
class TimeSeriesModel:
    """What the lake must hold of the time-series collection (created at its first write)."""

    db: Any  # the sequence's pymongo Database
    created: bool = False
    read: bool = False  # a run has read the collection: a watermark bounds the next windows
    measured: int = 0
    # measurements the state must hold as MongoDB returns them, and ones it must not hold yet
    landed: set[ObjectId] = field(default_factory=set)
    withheld: set[ObjectId] = field(default_factory=set)

    def apply(self, write: Any) -> None:
        if not self.created:
            self.db.create_collection(TIME_SERIES, timeseries={"timeField": "t", "metaField": "m"})
            self.created = True
        collection = self.db[TIME_SERIES]
        if isinstance(write, Measure):
            # the server's clock, which each run's window ends at (to the millisecond: a BSON date)
            now = self.db.client.admin.command("hello")["localTime"]
            self.measured += 1
            at = now - dt.timedelta(seconds=LATE_SECONDS[write.late])
            key = collection.insert_one({"t": at, "m": write.meta, "v": self.measured}).inserted_id
            (self.withheld if write.late == "beyond" and self.read else self.landed).add(key)
            return
        touched = {doc["_id"] for doc in collection.find({"m": write.meta}, {"_id": 1})}
        self.landed -= touched
        self.withheld -= touched
        if isinstance(write, UpdateMeta):
            collection.update_many({"m": write.meta}, {"$set": {"m": write.to}})
        else:
            collection.delete_many({"m": write.meta})

    def capture(self, capture: ReplicaSetCapture, reconcile: bool) -> None:
        """The run's time-series pass (after the pull, before the transform, as in a DAG run)."""
        if self.created:
            capture_time_series(capture, reconcile)
            self.read = True

    def check(self, runs: int, reconciled: bool, rows: Any, raw_rows: Any) -> None:
        """After a run: ``rows(zone, name, columns)`` and ``raw_rows(name, columns)`` read the lake."""
        if not self.created:
            return
        held = list(self.db.get_collection(TIME_SERIES, codec_options=RAW_BSON).find())
        stored = {extjson.encode_str(doc["_id"]): doc.raw for doc in held}
        state_rows = rows("state", TIME_SERIES, ["__id", "__doc_bson"])
        state = {row["__id"]: row["__doc_bson"] for row in state_rows}
        assert len(state) == len(state_rows), f"run {runs}: {TIME_SERIES}: a measurement has two state rows"
        if reconciled:
            assert state == stored, f"run {runs}: after the reconcile the state is not the collection"
            self.landed = {doc["_id"] for doc in held}  # each stays as it is until a write touches it
            self.withheld = set()
        else:
            for key in self.landed:
                encoded = extjson.encode_str(key)
                assert state.get(encoded) == stored[encoded], f"run {runs}: measurement {key} not landed"
            early = sorted(str(key) for key in self.withheld if extjson.encode_str(key) in state)
            assert not early, f"run {runs}: measurements beyond the lateness landed early: {early}"
        raw = [(json.loads(row["key"])["id"], row["op"]) for row in raw_rows(TIME_SERIES, ["key", "op"])]
        changes = [(row["_id"], row["__op"]) for row in rows("changes", TIME_SERIES, ["_id", "__op"])]
        for table, found in (("raw", raw), ("changes", changes)):
            once = Counter((str(key), "c" if op == "r" else op) for key, op in found if op in ("r", "c", "d"))
            twice = sorted(pair for pair, count in once.items() if count > 1)
            assert not twice, f"run {runs}: {TIME_SERIES}: {table} rows landed twice: {twice[:3]}"
