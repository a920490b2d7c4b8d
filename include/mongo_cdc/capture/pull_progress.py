"""A pull's progress lines: every ``PROGRESS_INTERVAL_S`` while it reads, and one when it is done.

Each line gives the events the change stream returned per operation type (what crossed the
network: after the server-side namespace filter, before the client's), the events landed per
op, the batches, the committed position as a UTC time, its lag behind the wall clock, and the
events per second read so far.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from mongo_cdc.capture.change_cursor import token_cluster_time

if TYPE_CHECKING:
    from mongo_cdc.capture.micro_batch import PullResult
    from mongo_cdc.capture.offsets import Offset

log = logging.getLogger(__name__)

# Read at every check, so a test can lower it.
PROGRESS_INTERVAL_S = 30.0


class PullProgress:
    """Counts what one pull reads into its result and logs a progress line now and then."""

    def __init__(self, result: PullResult) -> None:
        self.result = result
        self.started = time.monotonic()
        self.next_line = self.started + PROGRESS_INTERVAL_S
        self.read_by_type: Counter[str] = Counter()

    def read(self, changes: list[dict], offset: Offset) -> None:
        """Count the events of one read of the stream (none: nothing new) and log a line when one is due."""
        self.result.events_received += len(changes)
        # a split event's later fragments carry no operationType
        self.read_by_type.update(change.get("operationType", "fragment") for change in changes)
        now = time.monotonic()
        if now >= self.next_line:
            self.next_line = now + PROGRESS_INTERVAL_S
            log.info("replica set %s: pulling: %s", self.result.rs, self.line(offset, now))

    def done(self, offset: Offset) -> None:
        now = time.monotonic()
        self.result.seconds = round(now - self.started, 3)
        log.info("replica set %s: pull done: %s", self.result.rs, self.line(offset, now))

    def line(self, offset: Offset, now: float) -> str:
        landed: Counter[str] = Counter()
        for ops in self.result.events.values():
            landed.update(ops)
        elapsed = max(now - self.started, 1e-3)
        position = token_cluster_time(offset.resume_token) if offset.resume_token else 0
        seconds = position >> 32
        at = dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"read {self.result.events_received} events ({_counts(self.read_by_type)}), "
            f"landed {_counts(landed)} in {self.result.batches} batches, "
            f"position {at} (inc {position & 0xFFFFFFFF}), lag {time.time() - seconds:.0f} s, "
            f"{self.result.events_received / elapsed:.0f} events/s over {elapsed:.0f} s"
        )


def _counts(counts: Counter[str]) -> str:
    return " ".join(f"{name}={count}" for name, count in sorted(counts.items())) or "none"
