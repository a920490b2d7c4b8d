"""Model-based sequences with a lost oplog: ``model_support``'s steps plus ``LoseOplog``, played on a
mongod whose 1 MB oplog is truncated within seconds (``--oplogSize 1 --syncdelay 1``).

``RecoverySequence`` runs what a DAG run does for one shard under ``snapshot.mode`` ``when_needed``
with ``oplog.lost.recovery`` ``heal``, in process: the plan (``shard_lifecycle.plan_shard``), the new
position when the stored one was lost (``oplog_recovery.begin_recovery``), the pull, the healing
verification while the recovery is pending, then the Spark job. A ``RacingRun`` writes while it runs:
its events are landed, not applied, when the verification compares, which must heal their documents
too (their missed changes may lie in the gap). After every ``Run`` it asserts:

* MongoDB holds the model's documents, and each state table exactly the live documents, byte for
  byte, one row each (``Sequence._check_state``);
* no raw row is landed twice (same key, op, cluster time and event order), nor a change row;
* every streamed change row is an event of the test's own change stream (the oracle; the writes
  the lake missed in a gap have none), and a recovery heals a document once (one ``c``/``u``/``d``
  row at its position).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cdc_support import overwrite_the_oplog_past
from model_support import RS, Run, Sequence

from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.oplog_recovery import begin_recovery, recovery_pending
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.shard_lifecycle import plan_shard
from mongo_cdc.capture.streaming import pull_changes, resume_position_lost
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.verify.verification import REPAIR, verify_replica_set


@dataclass
class LoseOplog:
    """The oplog overwritten past the lake's position: the writes since the last run are gone."""


@dataclass
class RacingRun(Run):
    """A run with writes made while it runs: after its plan (and a recovery's new position), before
    its pull, which lands their events before the verification compares."""

    writes: list = field(default_factory=list)


@dataclass
class RecoverySequence(Sequence):
    recoveries: int = 0
    racing: list = field(default_factory=list)  # the writes of the RacingRun being played

    def check(self, steps: list[Any]) -> None:
        try:
            super().check(steps)
        finally:
            self.stream.close()  # the oracle's stream reopened after a loss

    def apply(self, step: Any) -> None:
        if isinstance(step, LoseOplog):
            self._lose_oplog()
        else:
            self.racing = step.writes if isinstance(step, RacingRun) else []
            super().apply(step)

    def _lose_oplog(self) -> None:
        offset = self.keeper.load()
        if offset is None or offset.resume_token is None:
            return  # no position yet: the first run snapshots
        self._read_stream()  # the oracle holds every event before the loss
        overwrite_the_oplog_past(self.client, token_cluster_time(offset.resume_token))
        # the oracle's own position left the oplog too: it goes on from now (no write in between)
        self.stream = self.db.watch(max_await_time_ms=20)

    def _pipeline_run(self) -> None:
        if self.snapshotted_at is None:
            self._snapshot()
            self._transform()
            return
        capture = ReplicaSetCapture(self.client, self.config, self.keeper)
        lake = SourceLake(self.location, self.prefix)
        plan = plan_shard(
            shard_id=RS,
            retiring=False,
            offset=self.keeper.load_checked(),
            snapshot_mode="when_needed",
            resnapshot=None,
            position_lost=lambda offset: resume_position_lost(self.client, offset.resume_token),
            oplog_lost_recovery="heal",
            recovery_pending=lambda: recovery_pending(lake, RS),
        )
        assert plan.snapshot is None, f"run {self.runs}: {plan.reason}"
        if plan.recover:
            self.recoveries += begin_recovery(self.client, RS, self.keeper) is not None
        for write in self.racing:
            self._create(write.coll)
            self._write(write, None)
        pull_changes(capture)
        if recovery_pending(lake, RS):
            result = verify_replica_set(capture, REPAIR, recovery=True)
            assert not result.failed and not recovery_pending(lake, RS), (
                f"run {self.runs}: {result.to_dict()}"
            )
        self._transform()

    def _check_changes(self, name: str) -> None:
        raw = self._raw_rows(name)
        landed = Counter((row["key"], row["op"], row["cluster_time"], row["event_order"]) for row in raw)
        twice = [row for row, count in landed.items() if count > 1]
        assert not twice, f"run {self.runs}: {name}: raw rows landed twice: {twice}"
        rows = self._rows("changes", name)
        found = Counter(
            (row["__op"], row.get("_id"), row["__cluster_time"], row["__event_order"]) for row in rows
        )
        twice = [row for row, count in found.items() if count > 1]
        assert not twice, f"run {self.runs}: {name}: change rows twice: {twice}"
        streamed = {
            (e.op, e.key, e.cluster_time, e.event_order)
            for e in self.events
            if e.coll == name and e.op in ("c", "u", "d")
        }
        unknown = [row for row in found if row[3] and row[0] is not None and row not in streamed]
        assert not unknown, f"run {self.runs}: {name}: change rows of no event: {unknown}"
        healed = Counter(
            (row[1], row[2]) for row in found if not row[3] and row[0] in ("c", "u", "d")
        )  # (a snapshot's reads are r; a recovery's rows sit at "")
        twice = [row for row, count in healed.items() if count > 1]
        assert not twice, f"run {self.runs}: {name}: a document healed twice by one recovery: {twice}"

    def _raw_rows(self, name: str) -> list[dict]:
        return SourceLake(self.location, self.prefix).committed_raw(f"{self.database}.{name}").to_pylist()
