"""Offsets checked against the lake through real DAG runs: healed when behind it, refused (with the
command that fixes it) when they disagree with it, and no event lost either way."""

from __future__ import annotations

import json
import re

from airflow.models import Variable
from cdc_support import assert_state_equals_collection
from datagen import COLLECTIONS, FALLBACK_FIELDS, load, random_writes

from mongo_cdc.capture.offsets import offset_key
from mongo_cdc.capture.snapshot import current_position


def _offset(source) -> dict:
    return json.loads(Variable.get(offset_key(source.name, "rs0")))


def _assert_every_event_once(source, client, writes) -> None:
    for collection in COLLECTIONS:
        assert source.streamed_events(collection) == writes.of(collection)
        assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])


def test_an_offset_restored_from_an_old_backup_or_lowered_by_hand_is_healed(cdc_source, replica_set, db_name):
    source = cdc_source(db_name, **{"max.batch.size": 50})
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 50, "orders": 50, "products": 50})
        source.run(skip_spark=True)
        backup = Variable.get(offset_key(source.name, "rs0"))
        writes = random_writes(db, 200, seed=1)
        source.run(skip_spark=True)
        committed = source.lake.committed()["rs0"]
        assert json.loads(backup)["batch_seq"] < committed

        Variable.set(offset_key(source.name, "rs0"), backup)  # restored from the backup
        more = random_writes(db, 100, seed=2)
        source.run(skip_spark=True)
        assert _offset(source)["batch_seq"] > committed  # healed to the lake's batch, then went on

        lowered = {**_offset(source), "batch_seq": 1}  # a hand edit
        Variable.set(offset_key(source.name, "rs0"), json.dumps(lowered))
        source.run()
        assert _offset(source)["batch_seq"] == source.lake.committed()["rs0"]
        writes.events.extend(more.events)
        _assert_every_event_once(source, client, writes)


def test_a_token_from_another_replica_set_is_refused_and_the_documented_fix_works(
    cdc_source, replica_set, small_oplog, db_name, capfd
):
    source = cdc_source(db_name)
    with replica_set.client() as client, small_oplog.client() as other:
        db = client[db_name]
        load(db, {"customers": 50, "orders": 50, "products": 50})
        source.run(skip_spark=True)
        key = offset_key(source.name, "rs0")
        stored = _offset(source)
        foreign = current_position(other)
        edited = {**stored, "resume_token": {"_data": foreign["_data"]}}
        edited["cluster_time"] = int(foreign["_data"][2:18], 16)
        Variable.set(key, json.dumps(edited))
        writes = random_writes(db, 150, seed=3)

        capfd.readouterr()
        run = source.run(expect="failed", skip_spark=True)
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states["shard_sync.snapshot"] == "failed"
        output = "".join(capfd.readouterr())
        assert "belongs to another replica set" in output
        assert json.loads(Variable.get(key))["cluster_time"] == edited["cluster_time"]  # nothing overwritten

        # the fix the message gives, as an on-call would paste it
        fix = re.search(rf"airflow variables set {re.escape(key)} '(\{{.*?\}})'", output)
        assert fix is not None, output[-2000:]
        Variable.set(key, fix.group(1))
        source.run()
        _assert_every_event_once(source, client, writes)
