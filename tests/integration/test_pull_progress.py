"""A pull logs progress lines while it reads, and a last one when it is done."""

from __future__ import annotations

import datetime as dt
import logging
import re
from pathlib import Path

from mongo_cdc.capture import pull_progress
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc_dev.testing.lake import database_source, memory_keeper


def test_the_pull_logs_progress_and_a_final_line(replica_set, db_name, tmp_path: Path, caplog, monkeypatch):
    # a line at every read of the stream (the events it returned since the last one, or none)
    monkeypatch.setattr(pull_progress, "PROGRESS_INTERVAL_S", 0.0)
    config = database_source("progress", tmp_path / "lake", db_name, max_batch_size=2)
    caplog.set_level(logging.INFO, logger="mongo_cdc.capture.pull_progress")
    with make_client(replica_set.uri) as client:
        keeper = memory_keeper(config, replica_set.name)
        start_without_snapshot(client, replica_set.name, keeper)
        client[db_name].docs.insert_many([{"_id": i} for i in range(5)])
        client[db_name].docs.update_one({"_id": 0}, {"$set": {"a": 1}})
        result = pull_changes(ReplicaSetCapture(client, config, keeper))

    lines = [r.getMessage() for r in caplog.records]
    progress = [line for line in lines if line.startswith(f"replica set {replica_set.name}: pulling: ")]
    assert len(progress) >= 2  # events, then the empty read that ends the pull, at least
    assert any("read 6 events (insert=5 update=1)" in line for line in progress)
    [done] = [line for line in lines if line.startswith(f"replica set {replica_set.name}: pull done: ")]
    at = dt.datetime.fromtimestamp(keeper.load().cluster_time >> 32, dt.timezone.utc)
    assert re.search(
        rf"read 6 events \(insert=5 update=1\), landed c=5 u=1 in 3 batches, "
        rf"position {at:%Y-%m-%d %H:%M:%S} UTC \(inc \d+\), lag \d+ s, \d+ events/s over \d+ s$",
        done,
    ), done
    assert result.to_dict()["events_received"] == 6 and result.seconds > 0
