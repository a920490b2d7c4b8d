"""A streaming replica set moved to another op-time (``stream_move``), on a real replica set: moved
back, the events it reads again land no second raw row, and the events after the lake's position
land once; moved forward, it is refused unless unread events may be skipped, which the batch log
records; a move to an op-time the oplog no longer holds is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bson import Timestamp
from cdc_support import overwrite_the_oplog_past

from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_move import REWIND, SKIP, StreamMoveError, move_stream
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.values import op_time_text
from mongo_cdc.lake import pack_cluster_time
from mongo_cdc_dev.testing.lake import database_source, memory_keeper


def _config(tmp_path: Path, database: str, **settings: object) -> SourceConfig:
    return database_source("moved", tmp_path / "lake", database, snapshot_mode="no_data", **settings)


def _landed(keeper, database: str) -> list[tuple[str, str]]:
    """(``_id``, op) of every landed event, in oplog order: a duplicate shows as a repeat."""
    rows = keeper.lake.committed_raw(f"{database}.docs").to_pylist()
    ordered = sorted(rows, key=lambda row: (row["cluster_time"], row["event_order"], row["op"] is None))
    return [(json.loads(row["key"])["id"], row["op"]) for row in ordered if row["op"] is not None]


def _streaming(client, config: SourceConfig, rs: str):
    """A keeper of ``rs``'s offset, its stream started from now."""
    keeper = memory_keeper(config, rs)
    start_without_snapshot(client, rs, keeper)
    return keeper


def _written_at(client, database: str, write) -> Timestamp:
    with client.start_session(causal_consistency=True) as session:
        write(client[database].docs, session)
        return session.operation_time


def test_moved_back_the_replayed_events_land_no_second_row(replica_set, db_name, tmp_path):
    config = _config(tmp_path, db_name)
    rs = replica_set.name
    with make_client(replica_set.uri) as client:
        keeper = _streaming(client, config, rs)
        first = _written_at(client, db_name, lambda docs, s: docs.insert_one({"_id": 1}, session=s))
        with client.start_session() as session, session.start_transaction():  # events sharing a cluster time
            client[db_name].docs.insert_many([{"_id": 2}, {"_id": 3}], session=session)
        _written_at(
            client, db_name, lambda docs, s: docs.update_one({"_id": 1}, {"$set": {"x": 1}}, session=s)
        )
        pull_changes(ReplicaSetCapture(client, config, keeper))
        landed = _landed(keeper, db_name)
        assert landed == [("1", "c"), ("2", "c"), ("3", "c"), ("1", "u")]

        before = keeper.load()
        moved = move_stream(client, rs, keeper, first, skip_unread=False)
        rewind = keeper.lake.last_batch(rs)
        assert (rewind.kind, rewind.seq, rewind.cluster_time) == (
            REWIND,
            before.batch_seq + 1,
            pack_cluster_time(first.time, first.inc),
        )
        assert moved.resume_token == rewind.resume_token and moved.batch_seq == rewind.seq

        _written_at(client, db_name, lambda docs, s: docs.delete_one({"_id": 2}, session=s))
        result = pull_changes(ReplicaSetCapture(client, config, keeper)).to_dict()
    assert result["replayed_dropped"] == 4  # the lake's own events, read again
    assert result["events"] == {f"{db_name}.docs": {"d": 1}}
    assert _landed(keeper, db_name) == [*landed, ("2", "d")]


def test_a_move_forward_is_refused_unless_unread_events_may_be_skipped(replica_set, db_name, tmp_path):
    config = _config(tmp_path, db_name)
    rs = replica_set.name
    with make_client(replica_set.uri) as client:
        keeper = _streaming(client, config, rs)
        _written_at(client, db_name, lambda docs, s: docs.insert_one({"_id": "read"}, session=s))
        pull_changes(ReplicaSetCapture(client, config, keeper))
        at = keeper.load()
        _written_at(client, db_name, lambda docs, s: docs.insert_one({"_id": "unread"}, session=s))
        ahead = _written_at(client, db_name, lambda docs, s: docs.insert_one({"_id": "kept"}, session=s))

        with pytest.raises(StreamMoveError) as refused:
            move_stream(client, rs, keeper, ahead, skip_unread=False)
        message = str(refused.value)
        assert message.startswith(f'replica set {rs}: param "stream_from" is op-time {op_time_text(ahead)} (')
        assert 'Trigger again with "skip_unread": true to skip them' in message
        assert keeper.load() == at and keeper.lake.last_batch(rs).seq == at.batch_seq  # nothing moved

        move_stream(client, rs, keeper, ahead, skip_unread=True)
        assert keeper.lake.last_batch(rs).kind == SKIP
        pull_changes(ReplicaSetCapture(client, config, keeper))
    assert _landed(keeper, db_name) == [('"read"', "c"), ('"kept"', "c")]


def test_a_move_to_an_op_time_the_oplog_no_longer_holds_is_refused(small_oplog, tmp_path):
    config = _config(tmp_path, "shop")
    rs = small_oplog.name
    with make_client(small_oplog.uri) as client:
        keeper = memory_keeper(config, rs)
        gone = _written_at(client, "shop", lambda docs, s: docs.insert_one({"_id": 1}, session=s))
        start_without_snapshot(client, rs, keeper)
        overwrite_the_oplog_past(client, pack_cluster_time(gone.time, gone.inc))
        at = keeper.load()
        with pytest.raises(StreamMoveError) as refused:
            move_stream(client, rs, keeper, gone, skip_unread=True)
    message = str(refused.value)
    assert f'param "stream_from" is op-time {op_time_text(gone)} (' in message
    assert (
        "older than the oplog's first entry" in message and 'Trigger again with "stream_from": "' in message
    )
    assert keeper.load() == at


def test_a_replica_set_without_a_stream_cannot_be_moved(replica_set, db_name, tmp_path):
    config = _config(tmp_path, db_name)
    with make_client(replica_set.uri) as client:
        keeper = memory_keeper(config, replica_set.name)
        with pytest.raises(StreamMoveError, match="has no stream to move yet"):
            move_stream(client, replica_set.name, keeper, Timestamp(1, 0), skip_unread=False)


def test_after_a_move_back_a_move_short_of_the_lakes_position_skips_nothing_unread(
    replica_set, db_name, tmp_path
):
    config = _config(tmp_path, db_name)
    rs = replica_set.name
    with make_client(replica_set.uri) as client:
        keeper = _streaming(client, config, rs)
        first = _written_at(client, db_name, lambda docs, s: docs.insert_one({"_id": 1}, session=s))
        second = _written_at(client, db_name, lambda docs, s: docs.insert_one({"_id": 2}, session=s))
        pull_changes(ReplicaSetCapture(client, config, keeper))
        move_stream(client, rs, keeper, first, skip_unread=False)
        # forward of the stream, but not of the lake: no skip_unread needed
        move_stream(client, rs, keeper, second, skip_unread=False)
        assert [batch.kind for batch in keeper.lake.batches()][-2:] == [REWIND, REWIND]
        result = pull_changes(ReplicaSetCapture(client, config, keeper)).to_dict()
    assert result["replayed_dropped"] == 1
    assert _landed(keeper, db_name) == [("1", "c"), ("2", "c")]
