"""Model-based sequences of a source that starts at an op-time and whose stream is moved back
(issue 50 item 3): ``model_support``'s steps plus ``MoveBack``.

``StartedSequence``'s source copies nothing: ``snapshot.mode`` ``no_data`` with
``capture.start.op.time`` taken before the sequence's first write, so its first run starts the
stream there (``stream_start.start_without_snapshot``) and every document reaches the lake through
its events alone. ``MoveBack`` moves the stream back (``stream_move.move_stream``, as the trigger's
``stream_from`` does) to where an earlier run started: the next pull reads those events again. After
every ``Run`` the checks of ``model_support.Sequence`` hold as for a snapshotted source (each state
table exactly MongoDB's documents, byte for byte, one row each; each changes table exactly the
oracle's events, in order, none twice), and no raw row is landed twice (same key, op, cluster time
and event order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bson import Timestamp
from model_support import RS, Sequence

from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_move import move_stream
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.capture.streaming import pull_changes
from mongo_cdc_dev.testing.lake import database_source, memory_keeper


@dataclass
class MoveBack:
    """The stream moved back to where the run ``runs`` runs before the next one started (1: the last
    run's start; further than the first run: the first run's)."""

    runs: int


def last_write(client: Any) -> Timestamp:
    """The op-time of the replica set's last write."""
    return client.admin.command("hello")["lastWrite"]["opTime"]["ts"]


@dataclass
class StartedSequence(Sequence):
    run_starts: list[Timestamp] = field(default_factory=list)  # the op-time each run started at
    moves: int = 0
    # a move back replays events the lake holds: none may land again, in any batch
    landed_once_by: tuple[str, ...] = ("key", "op", "cluster_time", "event_order")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.config = database_source(
            self.prefix,
            self.lake_root,
            self.config.database_include[0].pattern,
            capture_mode=self.mode,
            capture_mode_full_update_type=self.full_update_type,
            snapshot_mode="no_data",
            capture_start_op_time=last_write(self.client),
        )
        self.keeper = memory_keeper(self.config, RS)

    def apply(self, step: Any) -> None:
        if isinstance(step, MoveBack):
            if self.run_starts:  # a stream to move: a run started it
                to = self.run_starts[-min(step.runs, len(self.run_starts))]
                move_stream(self.client, RS, self.keeper, to, skip_unread=False)
                self.moves += 1
        else:
            super().apply(step)

    def _pipeline_run(self) -> None:
        self.run_starts.append(last_write(self.client))
        if not self.run_starts[:-1]:
            start_without_snapshot(self.client, RS, self.keeper, self.config)
        pull_changes(ReplicaSetCapture(self.client, self.config, self.keeper))
        self._transform()
