"""A source with ``snapshot.mode: no_data`` and ``capture.start.op.time`` between two writes, through
real DAG runs (Airflow dag.test, a real mongod, real Spark): the raw table and the state hold exactly
the writes from that op-time on, each landed once, and the next run streams on from there. A start the
oplog no longer holds fails the run's snapshot_start at once, naming the oplog's first op-time. A
stream the trigger moves back (``stream_from``) lands no raw row, change row or state version twice."""

from __future__ import annotations

import os
import time

from airflow.models import Variable
from cdc_support import assert_state_equals_documents, documents, overwrite_the_oplog_past
from conftest import make_source
from deltalake import DeltaTable

from mongo_cdc.capture.offsets import offset_key, parse_offset
from mongo_cdc.lake import pack_cluster_time, table_path


def _next_second() -> int:
    """Wait until the clock's next whole second and return it: writes after it have op-times at or
    past it, writes before it op-times before it (one mongod: its clock is this machine's)."""
    now = time.time()
    time.sleep(int(now) + 1 - now)
    return int(now) + 1


def test_a_no_data_source_started_at_an_op_time_lands_exactly_the_writes_from_it(
    airflow_db, replica_set, tmp_path
):
    database = "op_time_start"
    with replica_set.client() as client:
        client.drop_database(database)
        docs = client[database].docs
        docs.insert_one({"_id": "before", "n": 0})
        docs.update_one({"_id": "before"}, {"$inc": {"n": 1}})
        start = _next_second()
        docs.insert_many([{"_id": "after", "n": 1}, {"_id": "later", "n": 2}])
        docs.update_one({"_id": "after"}, {"$set": {"n": 10}})
        docs.update_one({"_id": "before"}, {"$set": {"n": 20}})  # a document first written before
        settings = {"snapshot.mode": "no_data", "capture.start.op.time": start}
        source = make_source(tmp_path, replica_set.uri, database, **settings)
        source.run()

        key = offset_key(source.name, replica_set.name)
        offset = parse_offset(key, Variable.get(key))
        assert offset.snapshot["start"] == {"from": "capture.start.op.time", "op_time": f"{start}:0"}
        [started] = [batch for batch in source.lake.batches() if batch.kind == "start"]
        assert started.cluster_time == pack_cluster_time(start, 0)
        # every event from the op-time, once, and none before it
        assert source.streamed_events("docs") == [
            ('"after"', "c"),
            ('"later"', "c"),
            ('"after"', "u"),
            ('"before"', "u"),
        ]
        assert all(row["cluster_time"] >= pack_cluster_time(start, 0) for row in source.raw_rows("docs"))
        # the state holds what the events from the op-time made: "before" only through its update
        assert_state_equals_documents(source, "docs", documents(client, database, "docs"))

        docs.delete_one({"_id": "later"})
        source.run()
        assert source.streamed_events("docs")[4:] == [('"later"', "d")]
        assert_state_equals_documents(source, "docs", documents(client, database, "docs"))


def test_a_start_older_than_the_oplog_fails_snapshot_start_naming_the_first_op_time(
    airflow_db, small_oplog, tmp_path, capfd
):
    with small_oplog.client() as client:
        gone = client.admin.command("ping")["operationTime"]
        overwrite_the_oplog_past(client, pack_cluster_time(gone.time, gone.inc))
        source = make_source(
            tmp_path,
            small_oplog.uri,
            "too_old",
            **{"snapshot.mode": "never", "capture.start.op.time": f"{gone.time}:{gone.inc}"},
        )
        capfd.readouterr()
        run = source.run(expect="failed", skip_spark=True)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["snapshot_start"] == "failed" and states["shard_sync.pull"] == "failed"
    output = "".join(capfd.readouterr())
    assert f"key 'capture.start.op.time' is at op-time {gone.time}:{gone.inc}" in output
    assert "older than the oplog's first entry" in output and "Set capture.start.op.time to '" in output
    assert Variable.get(offset_key(source.name, small_oplog.name), default_var=None) is None
    assert source.lake.last_batch(small_oplog.name) is None  # nothing was committed


def _table_version(source, zone: str, collection: str) -> int:
    """The Delta version of a derived table: a run that changes nothing in it leaves it."""
    return DeltaTable(
        os.path.join(source.lake_root, table_path(zone, source.prefix, source.database, collection))
    ).version()


def test_a_stream_moved_back_by_the_trigger_lands_no_raw_row_change_row_or_state_version_twice(
    airflow_db, replica_set, tmp_path
):
    database = "moved_back"
    with replica_set.client() as client:
        client.drop_database(database)
        source = make_source(tmp_path, replica_set.uri, database, **{"snapshot.mode": "no_data"})
        source.run(skip_spark=True)  # streaming starts now
        docs = client[database].docs
        with client.start_session(causal_consistency=True) as session:
            docs.insert_one({"_id": 1, "n": 1}, session=session)
            first = session.operation_time
        docs.insert_one({"_id": 2, "n": 2})
        docs.update_one({"_id": 1}, {"$set": {"n": 10}})
        source.run()
        raw, changes = source.raw_rows("docs"), source.change_rows("docs")
        assert len(changes) == 3
        versions = {zone: _table_version(source, zone, "docs") for zone in ("state", "changes")}

        # the trigger moves the stream back to the first write: all three events are read again
        source.run(conf={"stream_from": f"{first.time}:{first.inc}"})
        kinds = [batch.kind for batch in source.lake.batches()]
        assert kinds[-2:] == ["rewind", "position"]  # the move, then the pull's position past the lake's
        assert source.raw_rows("docs") == raw and source.change_rows("docs") == changes
        assert {zone: _table_version(source, zone, "docs") for zone in ("state", "changes")} == versions

        docs.delete_one({"_id": 2})
        source.run()
        assert source.streamed_events("docs") == [("1", "c"), ("2", "c"), ("1", "u"), ("2", "d")]
        assert len(source.change_rows("docs")) == 4
        assert_state_equals_documents(source, "docs", documents(client, database, "docs"))

        # moving forward past unread events is refused, naming the fix; nothing moves
        docs.insert_one({"_id": 3})
        ahead = client.admin.command("ping")["operationTime"]
        run = source.run(conf={"stream_from": f"{ahead.time}:{ahead.inc}"}, expect="failed", skip_spark=True)
        assert {ti.task_id: ti.state for ti in run.get_task_instances()}["snapshot_start"] == "failed"
        assert source.lake.batches()[-1].kind != "skip"
