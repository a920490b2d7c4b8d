"""The pull lands each micro-batch on a thread of its own while it reads the next
(``landing_thread.LandingThread``), and a landing that fails stops the pull at the batch before it."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from mongo_cdc.capture import read_ahead
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc_dev.testing.lake import database_source, memory_keeper


def _config(tmp_path: Path, db_name: str) -> SourceConfig:
    return database_source("landing", tmp_path / "lake", db_name, max_batch_size=2)


def test_a_batch_lands_on_its_own_thread_while_the_pull_reads_on(
    replica_set, db_name, tmp_path: Path, monkeypatch
):
    config = _config(tmp_path, db_name)
    reads = 0
    third_read = threading.Event()
    read_events = read_ahead.read_events

    def counted(stream, limit):
        nonlocal reads
        reads += 1
        if reads >= 3:
            third_read.set()
        return read_events(stream, limit)

    first_seq = 0  # the first stream batch's: the start committed a position before it
    landed_by: list[str] = []
    read_during_first_landing: list[bool] = []
    write_raw = SourceLake.write_raw

    def watched(self, rs, seq, namespace, data):
        landed_by.append(threading.current_thread().name)
        if seq == first_seq:
            # the first batch's landing waits for the pull to read two getMores past it: a pull that
            # landed on its own thread would never read them, and this would wait in vain
            read_during_first_landing.append(third_read.wait(timeout=30))
        return write_raw(self, rs, seq, namespace, data)

    monkeypatch.setattr(read_ahead, "read_events", counted)
    monkeypatch.setattr(SourceLake, "write_raw", watched)
    with make_client(replica_set.uri) as client:
        keeper = memory_keeper(config, replica_set.name)
        first_seq = start_without_snapshot(client, replica_set.name, keeper).batch_seq + 1
        client[db_name].docs.insert_many([{"_id": i} for i in range(6)])
        result = pull_changes(ReplicaSetCapture(client, config, keeper))

    assert read_during_first_landing == [True]
    assert len(landed_by) == 3 and all(name.startswith("land") for name in landed_by)
    # three batches of rows; a batch of only a position may follow them (the stream's token moves on
    # past the last insert when mongod writes a no-op, as it does on its own)
    assert result.batches == 3 and keeper.load().batch_seq >= first_seq + 2
    raw = keeper.lake.committed_raw(f"{db_name}.docs", columns=["key", "batch_seq"])
    assert sorted(raw.column("key").to_pylist()) == [f'{{"id":"{i}"}}' for i in range(6)]
    assert set(raw.column("batch_seq").to_pylist()) == {first_seq, first_seq + 1, first_seq + 2}


def test_a_failed_landing_stops_the_pull_at_the_batch_before_it(
    replica_set, db_name, tmp_path: Path, monkeypatch
):
    config = _config(tmp_path, db_name)
    write_raw = SourceLake.write_raw
    first_seq = 0

    def failing(self, rs, seq, namespace, data):
        if seq == first_seq + 1:
            raise OSError("disk full")
        return write_raw(self, rs, seq, namespace, data)

    with make_client(replica_set.uri) as client:
        keeper = memory_keeper(config, replica_set.name)
        first_seq = start_without_snapshot(client, replica_set.name, keeper).batch_seq + 1
        client[db_name].docs.insert_many([{"_id": i} for i in range(6)])
        with monkeypatch.context() as patched:
            patched.setattr(SourceLake, "write_raw", failing)
            with pytest.raises(OSError, match="disk full"):
                pull_changes(ReplicaSetCapture(client, config, keeper))
        # the offset and the lake stop at the batch before: nothing after the failed batch landed
        assert keeper.load().batch_seq == first_seq
        assert [batch.seq for batch in keeper.lake.batches() if batch.kind == "stream"] == [first_seq]

        result = pull_changes(ReplicaSetCapture(client, config, keeper))

    assert result.batches == 2 and keeper.load().batch_seq == first_seq + 2
    keys = keeper.lake.committed_raw(f"{db_name}.docs", columns=["key"]).column("key").to_pylist()
    assert sorted(keys) == [f'{{"id":"{i}"}}' for i in range(6)]


def test_a_micro_batch_lands_once_its_documents_reach_max_queue_size_in_bytes(
    replica_set, db_name, tmp_path: Path
):
    config = replace(_config(tmp_path, db_name), max_batch_size=1000, max_queue_size_in_bytes=10_000)
    with make_client(replica_set.uri) as client:
        keeper = memory_keeper(config, replica_set.name)
        start_without_snapshot(client, replica_set.name, keeper)
        client[db_name].docs.insert_many([{"_id": i, "pad": "x" * 4000} for i in range(10)])
        result = pull_changes(ReplicaSetCapture(client, config, keeper))

    # about 4 KB a document: a batch is full at its third (12 KB >= 10,000 bytes), not at 1,000 events
    assert result.batches == 4
    keys = keeper.lake.committed_raw(f"{db_name}.docs", columns=["key"]).column("key").to_pylist()
    assert sorted(keys) == sorted(f'{{"id":"{i}"}}' for i in range(10))
