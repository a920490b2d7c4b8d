"""A stream without a copy starts where ``capture.start.op.time`` or ``capture.start.resume.token``
says (``stream_start``), on a real replica set: exactly the events from there land, once; a start the
oplog no longer holds is refused naming the oplog's first op-time; a replica set the lake already
holds starts from now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bson import Timestamp
from cdc_support import overwrite_the_oplog_past

from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.offsets import MemoryOffsetStore
from mongo_cdc.capture.oplog_window import oplog_start
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_start import StreamStartError, start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.values import OpTime, op_time_text
from mongo_cdc.lake import pack_cluster_time
from mongo_cdc_dev.testing.lake import database_source, memory_keeper


def _config(tmp_path: Path, db_name: str, **start: object) -> SourceConfig:
    return database_source("started", tmp_path / "lake", db_name, snapshot_mode="no_data", **start)


def _landed_ids(keeper, db_name: str) -> list[str]:
    """The ``_id`` (Extended JSON, as the raw rows' keys hold it) of every landed event, in oplog order."""
    rows = keeper.lake.committed_raw(f"{db_name}.docs").to_pylist()
    ordered = sorted(rows, key=lambda row: (row["cluster_time"], row["event_order"]))
    return [json.loads(row["key"])["id"] for row in ordered]


def _written_at(client, db_name: str, document_id: int) -> Timestamp:
    """The op-time of inserting ``{_id: document_id}`` (its session's operation time)."""
    with client.start_session(causal_consistency=True) as session:
        client[db_name].docs.insert_one({"_id": document_id}, session=session)
        return session.operation_time


def test_an_op_time_between_two_writes_lands_exactly_the_writes_from_it(replica_set, db_name, tmp_path):
    with make_client(replica_set.uri) as client:
        before = _written_at(client, db_name, 1)
        start = Timestamp(before.time, before.inc + 1)  # the first op-time after the first write
        config = _config(tmp_path, db_name, capture_start_op_time=start)
        keeper = memory_keeper(config, replica_set.name)
        at = _written_at(client, db_name, 2)
        _written_at(client, db_name, 3)

        offset = start_without_snapshot(client, replica_set.name, keeper, config)
        # the start batch, in the lake's batch log and the offset, is the op-time itself
        [started] = [batch for batch in keeper.lake.batches() if batch.rs == replica_set.name]
        assert (started.kind, started.cluster_time) == ("start", pack_cluster_time(start.time, start.inc))
        assert offset.snapshot == {
            "status": "complete",
            "skipped": True,
            "start": {"from": "capture.start.op.time", "op_time": op_time_text(start)},
        }
        assert start <= at

        result = pull_changes(ReplicaSetCapture(client, config, keeper))
        assert result.to_dict()["events"] == {f"{db_name}.docs": {"c": 2}}
        _written_at(client, db_name, 4)
        pull_changes(ReplicaSetCapture(client, config, keeper))
    keys = _landed_ids(keeper, db_name)
    assert keys == ["2", "3", "4"]


def test_a_resume_token_starts_after_its_event(replica_set, db_name, tmp_path):
    with make_client(replica_set.uri) as client, client[db_name].docs.watch() as stream:
        client[db_name].docs.insert_many([{"_id": i} for i in range(1, 4)])
        first = stream.next()
        assert first["documentKey"] == {"_id": 1}
        config = _config(tmp_path, db_name, capture_start_resume_token=first["_id"]["_data"])
        keeper = memory_keeper(config, replica_set.name)
        offset = start_without_snapshot(client, replica_set.name, keeper, config)
        assert offset.resume_token == first["_id"]
        assert offset.snapshot["start"] == {
            "from": "capture.start.resume.token",
            "op_time": op_time_text(first["clusterTime"]),
        }
        pull_changes(ReplicaSetCapture(client, config, keeper))
    assert _landed_ids(keeper, db_name) == ["2", "3"]


def test_a_token_the_server_cannot_resume_after_is_refused_naming_the_key(replica_set, db_name, tmp_path):
    config = _config(tmp_path, db_name, capture_start_resume_token="82" + "6B1523B000000012" + "2B02")
    with make_client(replica_set.uri) as client:
        keeper = memory_keeper(config, replica_set.name)
        with pytest.raises(StreamStartError) as refused:
            start_without_snapshot(client, replica_set.name, keeper, config)
    assert str(refused.value).startswith(
        f"<started>: key 'capture.start.resume.token' is not a resume token replica set {replica_set.name} "
        "can resume after ("
    )
    assert keeper.load() is None and keeper.lake.last_batch(replica_set.name) is None


def test_an_op_time_the_oplog_no_longer_holds_is_refused_naming_its_first_op_time(small_oplog, tmp_path):
    rs = small_oplog.name
    with make_client(small_oplog.uri) as client:
        gone = _written_at(client, "shop", 1)
        overwrite_the_oplog_past(client, pack_cluster_time(gone.time, gone.inc))
        config = _config(tmp_path, "shop", capture_start_op_time=gone)
        keeper = memory_keeper(config, rs)
        first_before = oplog_start(client).op_time
        with pytest.raises(StreamStartError) as refused:
            start_without_snapshot(client, rs, keeper, config)
        first_after = oplog_start(client).op_time  # mongod may go on truncating meanwhile
        message = str(refused.value)
        assert message.startswith(
            f"<started>: replica set {rs}: key 'capture.start.op.time' is at op-time {op_time_text(gone)} ("
        )
        assert "older than the oplog's first entry, " in message
        assert "the events before it are gone" in message
        assert keeper.load() is None and keeper.lake.last_batch(rs) is None  # nothing was committed

        # the first op-time is named as the key takes it
        named = message.split("Set capture.start.op.time to '")[1].split("' or later")[0]
        oldest = OpTime().parse("<started>", "capture.start.op.time", named)
        assert first_before <= oldest <= first_after
        assert f"older than the oplog's first entry, {named} (" in message

        # once the key is set to a time the oplog holds, the same replica set starts
        kept = _written_at(client, "shop", 2)
        config = _config(tmp_path, "shop", capture_start_op_time=kept)
        offset = start_without_snapshot(client, rs, keeper, config)
        assert offset.cluster_time == pack_cluster_time(kept.time, kept.inc)
        pull_changes(ReplicaSetCapture(client, config, keeper))
    assert _landed_ids(keeper, "shop") == ["2"]


def test_a_replica_set_the_lake_already_holds_starts_from_now(replica_set, db_name, tmp_path):
    with make_client(replica_set.uri) as client:
        start = _written_at(client, db_name, 1)
        config = _config(tmp_path, db_name, capture_start_op_time=start)
        keeper = memory_keeper(config, replica_set.name)
        start_without_snapshot(client, replica_set.name, keeper, config)
        pull_changes(ReplicaSetCapture(client, config, keeper))
        assert _landed_ids(keeper, db_name) == ["1"]

        # the offset deleted (a reset): the configured start would land {_id: 1} again
        reset = memory_keeper(config, replica_set.name, MemoryOffsetStore())
        offset = start_without_snapshot(client, replica_set.name, reset, config)
        assert "start" not in offset.snapshot
        assert token_cluster_time(offset.resume_token) > pack_cluster_time(start.time, start.inc)
        _written_at(client, db_name, 2)
        pull_changes(ReplicaSetCapture(client, config, reset))
    assert _landed_ids(reset, db_name) == ["1", "2"]
