"""Issue 2 acceptance (c) and (d): no write lost around a snapshot, no duplicate or gap after a crash."""

from __future__ import annotations

import json
import os
import threading

from airflow.models import Variable
from cdc_support import assert_state_equals_collection
from datagen import COLLECTIONS, FALLBACK_FIELDS, load, random_writes

from mongo_cdc.offsets import OffsetKeeper, offset_key


def test_writes_made_while_the_snapshot_copies_are_not_lost(cdc_source, replica_set, db_name, monkeypatch):
    source = cdc_source(db_name, **{"snapshot.fetch.size": 50, "snapshot.max.threads": 1})
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 1500, "orders": 1500, "products": 1500})
        writer: dict[str, object] = {}
        begin_batch = OffsetKeeper.begin_batch

        def begin_then_write_concurrently(self, offset, paths):
            staged = begin_batch(self, offset, paths)
            if staged.snapshot.get("status") == "running" and "thread" not in writer:
                # the position is recorded; the copy starts now, with these writes racing it
                thread = threading.Thread(target=lambda: writer.update(log=random_writes(db, 400, seed=3)))
                writer["thread"] = thread
                thread.start()
            return staged

        monkeypatch.setattr(OffsetKeeper, "begin_batch", begin_then_write_concurrently)
        source.run()
        writer["thread"].join()
        monkeypatch.undo()
        source.run()  # streams whatever the first run's pull did not reach yet
        log = writer["log"]
        for collection in COLLECTIONS:
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
            assert source.streamed_events(collection) == log.of(collection)


def test_crash_after_landing_before_commit_leaves_no_duplicate_or_gap(
    cdc_source, replica_set, db_name, monkeypatch
):
    source = cdc_source(db_name, **{"max.batch.size": 40})
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 100, "orders": 100, "products": 100})
        source.run(skip_spark=True)
        log = random_writes(db, 400, seed=9)
        commit = OffsetKeeper.commit
        batches = {"committed": 0}

        def crash_on_third_batch(self, offset, **changes):
            if "batch_seq" in changes:
                if batches["committed"] == 2:
                    raise RuntimeError("injected crash: batch landed, offset not committed")
                batches["committed"] += 1
            return commit(self, offset, **changes)

        monkeypatch.setattr(OffsetKeeper, "commit", crash_on_third_batch)
        source.run(expect="failed", skip_spark=True)
        monkeypatch.undo()

        key = offset_key(source.name, "rs0")
        crashed = json.loads(Variable.get(key))
        assert crashed["pending"] and all(os.path.exists(p) for p in crashed["pending"])
        assert crashed["batch_seq"] == 1 + 2  # the snapshot plus two committed batches

        # The retry lands smaller batches (as after a config change), so the crashed batch's files
        # are not simply overwritten under the same names: only the pending protocol removes them.
        source = cdc_source(db_name, **{"max.batch.size": 7})
        source.run(skip_spark=True)
        recovered = json.loads(Variable.get(key))
        assert recovered["pending"] == []
        for collection in COLLECTIONS:
            assert source.streamed_events(collection) == log.of(collection)
