"""A pull rides out an election and a restarted server, and gives up cleanly on a dead one.

Each fault is injected right after a chosen micro-batch commits, so it always lands mid-pull with
batches still to come; the backoff sleep is injected, so the tests check its delays instead of
waiting them out.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pendulum
import pytest
from cdc_support import CdcSource
from datagen import COLLECTIONS, WriteLog, load, random_writes
from pymongo import MongoClient, monitoring

from mongo_cdc.capture.offsets import OffsetKeeper
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import run_snapshot
from mongo_cdc.capture.streaming import SourceUnreachableError, pull_changes
from mongo_cdc.capture.topology import make_client
from mongo_cdc.config import SourceConfig
from mongo_cdc_airflow.source_tasks import summarize
from mongo_cdc_dev.testing import ReplicaSet
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

DATABASE = "faults"
RS = "rs0"


def _config(lake_root: Path) -> SourceConfig:
    return database_source(
        "faults",
        lake_root,
        DATABASE,
        max_batch_size=20,
        connect_backoff_initial_delay_ms=50,
        connect_backoff_max_delay_ms=150,
        connect_max_attempts=3,
    )


def _snapshot_then_write(client: MongoClient, config: SourceConfig) -> tuple[OffsetKeeper, WriteLog]:
    """An offset from a real snapshot, then a few hundred writes (some 15 batches) for the pull."""
    load(client[DATABASE], {"customers": 30, "orders": 30, "products": 30})
    keeper = memory_keeper(config, RS)
    run_snapshot(ReplicaSetCapture(client, config, keeper))
    return keeper, random_writes(client[DATABASE], 300, seed=4)


def _fault_after_batches(
    monkeypatch: pytest.MonkeyPatch, batches: set[int], fault: Callable[[], None]
) -> None:
    """Run ``fault`` right after the pull commits the listed micro-batches (1 = its first)."""
    commit = OffsetKeeper.commit
    landed = itertools.count(1)

    def commit_then_fault(self, offset, **changes):
        committed = commit(self, offset, **changes)
        if "batch_seq" in changes and next(landed) in batches:
            fault()
        return committed

    monkeypatch.setattr(OffsetKeeper, "commit", commit_then_fault)


def _assert_every_write_landed_once(config: SourceConfig, log: WriteLog) -> None:
    lake = CdcSource(config.name, DATABASE, config.lake_root, config.topic_prefix)
    for collection in COLLECTIONS:
        assert lake.streamed_events(collection) == log.of(collection), collection


def _wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _host(address: tuple[str, int] | None) -> str | None:
    return None if address is None else f"{address[0]}:{address[1]}"


class ChangeStreamCommands(monitoring.CommandListener):
    """The server each change stream command (aggregate, getMore) was sent to, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("aggregate", "getMore"):
            self.sent.append((event.command_name, _host(event.connection_id)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def test_a_pull_follows_a_primary_elected_mid_pull(tmp_path, monkeypatch):
    config = _config(tmp_path / "lake")
    commands = ChangeStreamCommands()
    with (
        ReplicaSet(RS, tmp_path / "mongod", members=3) as replica_set,
        make_client(replica_set.uri, {"event_listeners": [commands]}) as client,
    ):
        keeper, log = _snapshot_then_write(client, config)
        election: dict[str, object] = {}

        def step_down() -> None:
            new_primary = replica_set.hosts[replica_set.step_down()]
            # the pull's next read must see the new primary, however fast the rest of it goes
            _wait_until(lambda: _host(client.primary) == new_primary)
            election.update(primary=new_primary, commands_before=len(commands.sent))

        _fault_after_batches(monkeypatch, {1}, step_down)
        result = pull_changes(ReplicaSetCapture(client, config, keeper))

    after = commands.sent[election["commands_before"] :]
    reopened = [i for i, (name, _) in enumerate(after) if name == "aggregate"]
    assert reopened, "the change stream was not reopened after the election"
    assert {server for _, server in after[reopened[0] :]} == {election["primary"]}
    assert result.primary_elections == 1
    _assert_every_write_landed_once(config, log)
    assert summarize([result.to_dict()], pendulum.now("UTC"))["primary_elections"] == 1


def test_a_server_restarted_within_the_backoff_loses_and_repeats_nothing(tmp_path, monkeypatch):
    config = _config(tmp_path / "lake")
    with (
        ReplicaSet(RS, tmp_path / "mongod") as replica_set,
        make_client(replica_set.uri, {"serverSelectionTimeoutMS": 1500}) as client,
    ):
        keeper, log = _snapshot_then_write(client, config)
        _fault_after_batches(monkeypatch, {1, 4}, lambda: replica_set.kill(0))
        sleeps: list[float] = []

        def sleep_then_restart(seconds: float) -> None:
            sleeps.append(seconds)
            if len(sleeps) % 2 == 0:  # the first reconnection failed; the second one finds it back
                replica_set.restart(0)
                replica_set.primary_index()

        result = pull_changes(ReplicaSetCapture(client, config, keeper), sleep=sleep_then_restart)

    # each outage starts the backoff over: a successful read resets the attempt count
    assert sleeps == [0.05, 0.1, 0.05, 0.1]
    assert (result.disconnects, result.primary_elections) == (2, 0)
    _assert_every_write_landed_once(config, log)
    summary = summarize([result.to_dict()], pendulum.now("UTC"))
    assert (summary["disconnects"], summary["primary_elections"]) == (2, 0)


def test_a_server_that_stays_down_fails_the_pull_and_leaves_the_offset(tmp_path, monkeypatch):
    config = _config(tmp_path / "lake")
    with (
        ReplicaSet(RS, tmp_path / "mongod") as replica_set,
        make_client(replica_set.uri, {"serverSelectionTimeoutMS": 500}) as client,
    ):
        keeper, _ = _snapshot_then_write(client, config)
        sleeps: list[float] = []
        # (reconnection attempts so far, offset) at every commit of the pull
        commits: list[tuple[int, str]] = []
        commit = OffsetKeeper.commit

        def recording_commit(self, offset, **changes):
            committed = commit(self, offset, **changes)
            commits.append((len(sleeps), keeper.store.get(keeper.key)))
            return committed

        monkeypatch.setattr(OffsetKeeper, "commit", recording_commit)
        _fault_after_batches(monkeypatch, {1}, lambda: replica_set.kill(0))
        with pytest.raises(SourceUnreachableError) as failure:
            pull_changes(ReplicaSetCapture(client, config, keeper), sleep=sleeps.append)

        message = str(failure.value)
        assert "\n" not in message
        assert f"on {replica_set.hosts[0]} in 3 reconnection attempts" in message
        assert sleeps == [0.05, 0.1, 0.15]  # doubling, capped at connect.backoff.max.delay.ms
        # events read before the crash may still land; once reconnecting, nothing is committed
        assert all(attempts == 0 for attempts, _ in commits)
        assert keeper.store.get(keeper.key) == commits[-1][1]
