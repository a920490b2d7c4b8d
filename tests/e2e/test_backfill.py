"""Backfills, as Airflow's backfill creates them, fill past hours and move nothing live (real mongod,
real Spark).

A backfill completes its past hours' raw and changes partitions: history older than the live
sync's first snapshot comes from the oplog, what the live sync landed is used as is; the offsets
and the state tables are never touched, and running it again changes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os

from airflow.models import Variable
from cdc_support import assert_state_equals_collection, overwrite_the_oplog_past
from conftest import make_source
from deltalake import DeltaTable

from mongo_cdc.capture.backfill import HOUR, BackfillResult, backfill_interval, hour_partitions
from mongo_cdc.capture.offsets import offset_key, parse_offset
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import load_source
from mongo_cdc.lake import HISTORY_SEQ, table_uri
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc_dev.testing.lake import memory_keeper


def _hour_of(moment: dt.datetime) -> dt.datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _changes(source, collection: str) -> list[tuple]:
    return sorted(
        (r["__cluster_time"], r["__event_order"], r["__op"], r["_id"]) for r in source.change_rows(collection)
    )


def _history_events(source, collection: str) -> list[tuple]:
    rows = [row for row in source.raw_rows(collection) if row["batch_seq"] == HISTORY_SEQ]
    return [(r["key"], r["op"]) for r in sorted(rows, key=lambda r: (r["cluster_time"], r["event_order"]))]


def _state_version(source, collection: str) -> int:
    return DeltaTable(
        table_uri(LakeLocation(source.lake_root), "state", source.prefix, source.database, collection)
    ).version()


def _backfill_this_hour(uri: str, source, rs: str, began: dt.datetime) -> BackfillResult:
    """What the Airflow backfill of the current hour will do once the hour is over (Airflow only
    creates backfill runs for finished intervals, and a test cannot wait for one)."""
    config = load_source(os.path.join(os.environ["MONGO_CDC_SOURCES_DIR"], f"{source.name}.yaml"))
    offset = parse_offset("offset", Variable.get(offset_key(source.name, rs)))
    with make_client(uri, {}) as client:
        # the backfill reads the replica set's name and lake from its keeper, never its offset
        capture = ReplicaSetCapture(client, config, memory_keeper(config, rs))
        return backfill_interval(capture, offset, began, dt.datetime.now(dt.timezone.utc))


def test_a_backfill_adds_the_history_before_the_first_snapshot_and_moves_nothing_live(
    cdc_source, replica_set, db_name
):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        began = dt.datetime.now(dt.timezone.utc)
        # history: written before the pipeline existed, so only the oplog has it
        items.insert_many([{"_id": 1, "v": "a"}, {"_id": 2, "v": "b"}])
        items.update_one({"_id": 1}, {"$set": {"v": "a2"}})
        items.delete_one({"_id": 2})
        source.run(skip_spark=True)  # the snapshot reads document 1 only
        items.insert_one({"_id": 3, "v": "c"})
        source.run()
        offset = Variable.get(offset_key(source.name, replica_set.name))
        state_version = _state_version(source, "items")
        live_changes = _changes(source, "items")
        assert [(op, _id) for _, _, op, _id in live_changes] == [("r", 1), ("c", 3)]

        # Airflow's backfill of the last finished hour: before this test's writes, nothing to add
        (run,) = source.backfill(_hour_of(began) - HOUR, _hour_of(began) - HOUR)
        assert run.run_type == "backfill"
        assert _changes(source, "items") == live_changes
        assert Variable.get(offset_key(source.name, replica_set.name)) == offset
        assert _state_version(source, "items") == state_version

        result = _backfill_this_hour(replica_set.uri, source, replica_set.name, began)
        assert result.history == "pulled"
        assert result.history_events == {f"{db_name}.items": {"c": 2, "u": 1, "d": 1}}
        history = [('{"id":"1"}', "c"), ('{"id":"2"}', "c"), ('{"id":"1"}', "u"), ('{"id":"2"}', "d")]
        assert [event for event in _history_events(source, "items") if event[1] is not None] == history
        assert Variable.get(offset_key(source.name, replica_set.name)) == offset

        # the backfill run's transform (--rebuild-hours) shows the history in the changes table,
        # never in the state
        source.transform(
            "--rebuild-hours", json.dumps(hour_partitions(began, dt.datetime.now(dt.timezone.utc)))
        )
        backfilled = _changes(source, "items")
        assert [(op, _id) for _, _, op, _id in backfilled] == [
            ("c", 1), ("c", 2), ("u", 1), ("d", 2), ("r", 1), ("c", 3)
        ]  # fmt: skip
        assert_state_equals_collection(source, client, "items")

        # again: the same history file, the same changes; and the live sync goes on unharmed
        _backfill_this_hour(replica_set.uri, source, replica_set.name, began)
        assert [event for event in _history_events(source, "items") if event[1] is not None] == history
        items.insert_one({"_id": 4, "v": "d"})
        source.run()
        assert _changes(source, "items")[:-1] == backfilled
        assert [(op, _id) for _, _, op, _id in _changes(source, "items")][-1] == ("c", 4)
        assert_state_equals_collection(source, client, "items")


def test_a_backfill_uses_what_was_landed_when_the_oplog_is_gone_and_fails_when_nothing_is_left(
    airflow_db, small_oplog, tmp_path, capfd
):
    source = make_source(tmp_path, small_oplog.uri, "backfill_lost")
    with small_oplog.client() as client:
        began = dt.datetime.now(dt.timezone.utc)
        client[source.database].items.insert_many([{"_id": i} for i in range(5)])
        source.run(skip_spark=True)
        client[source.database].items.insert_one({"_id": 5})
        source.run(skip_spark=True)
        offset = Variable.get(offset_key(source.name, "rs_small"))
        overwrite_the_oplog_past(client, parse_offset("offset", offset).cluster_time)

        # this hour: the oplog lost its start, the live sync's files are what is left
        assert _backfill_this_hour(small_oplog.uri, source, "rs_small", began).history == "unavailable"
        assert _history_events(source, "items") == []

        capfd.readouterr()
        long_ago = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
        source.backfill(long_ago, long_ago, expect="failed", skip_spark=True)
        output = "".join(capfd.readouterr())
        assert "cannot backfill 2024-01-01T00 to 2024-01-01T00" in output
        assert "neither holds these hours' changes" in output
        assert Variable.get(offset_key(source.name, "rs_small")) == offset
