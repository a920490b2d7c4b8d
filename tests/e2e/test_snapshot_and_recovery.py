"""No write lost around a snapshot; no duplicate or gap after a crash at either step of a batch's landing."""

from __future__ import annotations

import json
import threading

import pytest
from airflow.models import Variable
from cdc_support import assert_state_equals_collection
from datagen import COLLECTIONS, FALLBACK_FIELDS, load, random_writes

from mongo_cdc.capture.offsets import OffsetKeeper, offset_key
from mongo_cdc.lake.landing import SourceLake


def test_writes_made_while_the_snapshot_copies_are_not_lost(cdc_source, replica_set, db_name, monkeypatch):
    source = cdc_source(db_name, **{"snapshot.fetch.size": 50, "snapshot.max.threads": 1})
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 1500, "orders": 1500, "products": 1500})
        writer: dict[str, object] = {}
        commit = OffsetKeeper.commit

        def commit_then_write_concurrently(self, offset, **changes):
            committed = commit(self, offset, **changes)
            if committed.snapshot.get("status") == "running" and "thread" not in writer:
                # the position is recorded; the copy starts now, with these writes racing it
                thread = threading.Thread(target=lambda: writer.update(log=random_writes(db, 400, seed=3)))
                writer["thread"] = thread
                thread.start()
            return committed

        monkeypatch.setattr(OffsetKeeper, "commit", commit_then_write_concurrently)
        source.run()
        writer["thread"].join()
        monkeypatch.undo()
        source.run()  # streams whatever the first run's pull did not reach yet
        log = writer["log"]
        for collection in COLLECTIONS:
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
            assert source.streamed_events(collection) == log.of(collection)


@pytest.mark.parametrize("crash_at", ["lake commit", "offset write"])
def test_a_crash_while_a_batch_lands_leaves_no_duplicate_or_gap(
    cdc_source, replica_set, db_name, monkeypatch, crash_at
):
    """Crash after the batch's rows are in the raw tables but before the batch log commits it (the
    retry replaces those rows), or after the lake committed it but before the Variable moved (the
    retry heals the Variable from the lake)."""
    source = cdc_source(db_name, **{"max.batch.size": 40})
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 100, "orders": 100, "products": 100})
        source.run(skip_spark=True)
        key = offset_key(source.name, "rs0")
        before = json.loads(Variable.get(key))["batch_seq"]
        log = random_writes(db, 400, seed=9)
        batches = {"committed": 0}
        if crash_at == "lake commit":
            target, original = SourceLake, SourceLake.commit

            def crashing(self, batch):
                if batch.kind == "stream":
                    if batches["committed"] == 2:
                        raise RuntimeError("injected crash: rows landed, batch not committed")
                    batches["committed"] += 1
                return original(self, batch)
        else:
            target, original = OffsetKeeper, OffsetKeeper.commit

            def crashing(self, offset, **changes):
                if "batch_seq" in changes:
                    if batches["committed"] == 2:
                        raise RuntimeError("injected crash: batch committed in the lake, offset not written")
                    batches["committed"] += 1
                return original(self, offset, **changes)

        monkeypatch.setattr(target, "commit", crashing)
        source.run(expect="failed", skip_spark=True)
        monkeypatch.undo()

        crashed = json.loads(Variable.get(key))
        assert crashed["batch_seq"] == before + 2  # two batches committed before the crash
        assert source.lake.committed()["rs0"] == before + (2 if crash_at == "lake commit" else 3)

        # The retry lands smaller batches (as after a config change), so the crashed batch is read
        # again with other boundaries: rows it left are replaced, not doubled.
        source = cdc_source(db_name, **{"max.batch.size": 7})
        source.run()
        for collection in COLLECTIONS:
            assert source.streamed_events(collection) == log.of(collection)
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
