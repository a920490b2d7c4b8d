"""The oplog-window guard warns, or refuses to start, before the committed position can leave the oplog,
on a real 1 MB oplog and through a real DAG run.

With an hourly schedule a 1 MB oplog holds far less than three intervals of writes, so the pull
warns naming the replica set and the fix; with ``oplog.headroom.fail`` it refuses to start while
the committed position is still in the oplog, leaving the offset as it was.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from airflow.models import Variable
from conftest import make_source

from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.offsets import offset_key
from mongo_cdc.capture.oplog_window import OplogHeadroomError, OplogWindow, measure
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

HOUR = 3600.0
KB = 1024


def _config(tmp_path: Path, **settings: object) -> SourceConfig:
    return database_source("guarded", tmp_path / "lake", "guarded", **settings)


def _fill_most_of_the_oplog(client) -> None:
    """~600 KB of a 1 MB oplog in one go: at that rate it holds seconds, and nothing is truncated yet."""
    client.oplog_filler.blobs.insert_many([{"blob": "x" * (100 * KB)} for _ in range(6)])


def _headroom_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "leaves the oplog in about" in r.getMessage()]


def test_the_headroom_formula():
    t = 1_000_000
    # half full after 100 s at 5 KB/s: a full 1 MB oplog would hold 200 s; the position is 30 s old
    half = OplogWindow("rs", t << 32, (t + 100) << 32, 500 * KB, 1000 * KB, (t + 70) << 32)
    assert (half.window_seconds, half.position_age_seconds) == (100, 30)
    assert (half.bytes_per_second, half.capacity_seconds, half.headroom_seconds) == (5 * KB, 200, 170)
    # full: the capacity is the window
    full = replace(half, used_bytes=1000 * KB)
    assert (full.capacity_seconds, full.headroom_seconds) == (100, 70)
    # a position older than the oldest entry is gone
    gone = replace(half, position=(t - 1) << 32)
    assert gone.position_lost and gone.headroom_seconds == 0
    assert gone.to_dict()["position_lost"] is True


def test_small_oplog_warns_and_the_fail_setting_stops_before_the_position_is_lost(
    small_oplog, tmp_path, caplog
):
    config = _config(tmp_path)
    rs = small_oplog.name
    with make_client(small_oplog.uri) as client:
        keeper = memory_keeper(config, rs)
        start_without_snapshot(client, rs, keeper)
        client.guarded.docs.insert_many([{"_id": i} for i in range(3)])
        _fill_most_of_the_oplog(client)
        before = keeper.load()

        with pytest.raises(OplogHeadroomError) as failure:
            pull_changes(
                ReplicaSetCapture(client, replace(config, oplog_headroom_fail=True), keeper), interval_s=HOUR
            )
        message = str(failure.value)
        assert message.startswith(f"replica set {rs}: the committed position ({keeper.key}) leaves the oplog")
        assert "less than 3 schedule intervals (1 h 00 min each" in message
        assert "replSetResizeOplog" in message and "run the DAG more often" in message
        assert f"offset '{keeper.key}' is unchanged and still in the oplog" in message
        assert keeper.load() == before
        assert not measure(client, rs, token_cluster_time(before.resume_token)).position_lost

        caplog.set_level(logging.INFO)
        result = pull_changes(ReplicaSetCapture(client, config, keeper), interval_s=HOUR).to_dict()
    [warning] = _headroom_warnings(caplog)
    assert warning.startswith(f"replica set {rs}: the committed position ({keeper.key})")
    assert result["events"] == {"guarded.docs": {"c": 3}}
    oplog = result["oplog"]  # measured after the pull, against the position it committed
    assert oplog["position_cluster_time"] == result["cluster_time"] > token_cluster_time(before.resume_token)
    assert oplog["max_bytes"] == 1024 * KB and oplog["used_bytes"] >= 600 * KB
    assert 0 < oplog["headroom_seconds"] < 3 * HOUR and oplog["position_lost"] is False


def test_ample_oplog_does_not_warn_and_zero_intervals_turn_the_warning_off(replica_set, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="mongo_cdc.capture.oplog_window")
    config = _config(tmp_path)
    with make_client(replica_set.uri) as client:
        keeper = memory_keeper(config, replica_set.name)
        start_without_snapshot(client, replica_set.name, keeper)
        # the test replica set's oplog is at least 990 MB: seconds-apart pulls are safe
        result = pull_changes(ReplicaSetCapture(client, config, keeper), interval_s=1).to_dict()
        assert result["oplog"]["headroom_seconds"] > 3
        # and with warn.intervals 0 even an hourly schedule stays quiet
        quiet = replace(config, oplog_headroom_warn_intervals=0, oplog_headroom_fail=True)
        assert pull_changes(ReplicaSetCapture(client, quiet, keeper), interval_s=HOUR).oplog is not None
    assert _headroom_warnings(caplog) == []


def test_dag_summary_carries_the_figures_and_the_fail_setting_fails_the_run(
    airflow_db, small_oplog, tmp_path, caplog, capsys
):
    source = make_source(tmp_path, small_oplog.uri, "guarded_dag")
    rs = small_oplog.name
    with make_client(small_oplog.uri) as client:
        client[source.database].docs.insert_many([{"_id": i} for i in range(3)])
        _fill_most_of_the_oplog(client)
        run = source.run(skip_spark=True)  # hourly schedule
        [warning] = _headroom_warnings(caplog)
        assert warning.startswith(f"replica set {rs}: the committed position (mongo_cdc.guarded_dag.{rs})")
        summary = run.get_task_instance("summary").xcom_pull(task_ids="summary")
        assert set(summary["oplog"]) == {rs}
        assert summary["oplog"][rs]["headroom_seconds"] < 3 * HOUR
        assert summary["oplog"][rs]["max_bytes"] == 1024 * KB

        before = json.loads(Variable.get(offset_key(source.name, rs)))
        client[source.database].docs.insert_one({"_id": "unstreamed"})
        source = make_source(tmp_path, small_oplog.uri, "guarded_dag", **{"oplog.headroom.fail": True})
        run = source.run(expect="failed", skip_spark=True)
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states["shard_sync.pull"] == "failed"
        assert "The pull did not start (oplog.headroom.fail is true)" in "".join(capsys.readouterr())
        after = json.loads(Variable.get(offset_key(source.name, rs)))
        committed = ("resume_after", "cluster_time", "batch_seq")
        assert [after[key] for key in committed] == [before[key] for key in committed]
        assert not measure(client, rs, int(before["cluster_time"])).position_lost
