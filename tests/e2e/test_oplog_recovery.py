"""A shard whose position left the oplog, healed instead of copied again (``snapshot.mode``
``when_needed``, ``oplog.lost.recovery`` ``heal``, the default), end to end: Airflow dag.test, a
mongod whose 1 MB oplog is truncated within seconds, real Spark.

The lake misses inserts, updates and deletes while its position falls off the oplog; the next run
starts the stream again at a new position and heals only the documents that differ, each as one
change row of the operation its difference implies, marked ``source.sequence`` ``recovery``.
"""

from __future__ import annotations

import os
from collections import Counter

from airflow.models import Variable
from cdc_support import assert_state_equals_collection, overwrite_the_oplog_past
from conftest import make_source

from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.offsets import OffsetKeeper, offset_key, parse_offset
from mongo_cdc.capture.oplog_recovery import (
    HEAL_BATCH,
    RECOVER_BATCH,
    RECOVERY_SEQUENCE,
    begin_recovery,
    recovery_pending,
)
from mongo_cdc.config import load_sources

RS = "rs_small"
SETTINGS = {"snapshot.mode": "when_needed", "add.fields": ["op", "source.ts_ms", "source.sequence"]}


class _Variables:
    """The offset Variables as this test process reads them (the task SDK's need a running task)."""

    def get(self, key: str) -> str | None:
        return Variable.get(key, default_var=None)

    def set(self, key: str, value: str) -> None:
        Variable.set(key, value)


def _position(source) -> int:
    """The cluster time of the stored resume position (a pull that found nothing moves the token,
    not the offset's cluster_time)."""
    key = offset_key(source.name, RS)
    return token_cluster_time(parse_offset(key, Variable.get(key)).resume_token)


def _healed(source, collection: str) -> dict[str, str]:
    """The recovery's change rows, tombstones left out: document _id -> op (every _id once)."""
    rows = [row for row in _events(source, collection) if row["__source_sequence"] == RECOVERY_SEQUENCE]
    ops = {row["_id"]: row["__op"] for row in rows}
    assert len(ops) == len(rows), "a document healed twice"
    return ops


def _events(source, collection: str) -> list[dict]:
    """The changes table's rows, tombstones left out."""
    return [row for row in source.change_rows(collection) if row["__op"] is not None]


def _assert_no_duplicates(source, collection: str) -> None:
    raw = Counter(
        (r["key"], r["op"], r["cluster_time"], r["event_order"]) for r in source.raw_rows(collection)
    )
    assert not [row for row, count in raw.items() if count > 1]
    changes = Counter(
        (row["_id"], row["__op"], row["__cluster_time"], row["__event_order"])
        for row in source.change_rows(collection)
    )
    assert not [row for row, count in changes.items() if count > 1]


def test_a_lost_oplog_heals_only_the_documents_that_differ(airflow_db, small_oplog, tmp_path):
    source = make_source(tmp_path, small_oplog.uri, "oplog_heal", **SETTINGS)
    with small_oplog.client() as client:
        items = client[source.database].items
        items.insert_many([{"_id": n, "name": f"item {n}", "qty": n} for n in range(300)])
        source.run()  # the initial snapshot
        items.insert_one({"_id": 1000, "name": "streamed"})
        source.run()  # streams
        before = len(_events(source, "items"))
        snapshots = [b.seq for b in source.lake.batches() if b.kind == "snapshot"]

        # the lake misses these while its position leaves the oplog
        inserted = [2000, 2001, 2002]
        items.insert_many([{"_id": n, "name": f"missed {n}"} for n in inserted])
        updated = [3, 4, 5, 1000]
        items.update_many({"_id": {"$in": updated}}, {"$set": {"qty": -1}})
        deleted = [7, 8]
        items.delete_many({"_id": {"$in": deleted}})
        items.insert_one({"_id": 2100})  # came and went: no change row for it
        items.delete_one({"_id": 2100})
        items.update_one({"_id": 9}, {"$set": {"qty": 9}})  # a write that changed nothing
        overwrite_the_oplog_past(client, _position(source))

        source.run()  # default oplog.lost.recovery: heal
        assert_state_equals_collection(source, client, "items")
        expected = {n: "c" for n in inserted} | {n: "u" for n in updated}
        expected |= {n: "d" for n in deleted}
        assert _healed(source, "items") == expected
        # one change row per differing document and none for the others (nor a copy's reads)
        assert len(_events(source, "items")) == before + len(expected)
        _assert_no_duplicates(source, "items")
        batches = [b for b in source.lake.batches() if b.rs == RS]
        assert [b.seq for b in batches if b.kind == "snapshot"] == snapshots, "nothing copied again"
        kinds = [b.kind for b in batches]
        assert kinds.index(RECOVER_BATCH) < kinds.index(HEAL_BATCH)
        assert not recovery_pending(source.lake, RS)

        # the stream goes on from the new position; the recovery is over, so nothing is healed again
        items.update_one({"_id": 10}, {"$set": {"qty": 100}})
        source.run()
        assert_state_equals_collection(source, client, "items")
        assert _healed(source, "items") == expected
        assert [b.kind for b in source.lake.batches() if b.rs == RS].count(HEAL_BATCH) == 1
        _assert_no_duplicates(source, "items")


def test_a_recovery_a_run_did_not_finish_is_healed_by_the_next(airflow_db, small_oplog, tmp_path):
    """The stream was started again (a ``recover`` batch) but no verify healed it (the run failed
    after ``snapshot_start``): the next run, its position in the oplog, heals."""
    source = make_source(tmp_path, small_oplog.uri, "oplog_heal_again", **SETTINGS)
    with small_oplog.client() as client:
        items = client[source.database].items
        items.insert_many([{"_id": n, "qty": n} for n in range(50)])
        source.run()
        items.delete_one({"_id": 1})
        items.insert_one({"_id": 100})
        overwrite_the_oplog_past(client, _position(source))
        configs, errors = load_sources(os.environ["MONGO_CDC_SOURCES_DIR"])
        assert not errors
        keeper = OffsetKeeper(_Variables(), configs[0].name, RS, source.lake)
        assert begin_recovery(client, RS, keeper) is not None
        assert recovery_pending(source.lake, RS)
        assert begin_recovery(client, RS, keeper) is None, "a stream in the oplog is not moved again"

        source.run()
        assert_state_equals_collection(source, client, "items")
        assert _healed(source, "items") == {1: "d", 100: "c"}
        assert not recovery_pending(source.lake, RS)
        _assert_no_duplicates(source, "items")
