"""The oplog-window guard: how long until a replica set's committed position leaves its oplog.

A pull resumes from the committed position, which only works while the oplog still holds it.
The oplog is capped by size, so how much time it covers depends on the write rate; once the
position falls out, the only way back is a re-snapshot. Each pull therefore measures, on the
member it streams from (the primary):

* the window: the oldest and newest oplog entries (``local.oplog.rs`` in natural order) and the
  bytes it uses of its maximum (``$collStats``);
* the position's age: newest entry minus the committed position (server times: no clock skew);
* the capacity, how much time a full oplog covers at the current rate, and the headroom::

      rate     = used_bytes / window_seconds          (the average over the current window)
      capacity = max_bytes / rate                     (= the window, once the oplog is full)
      headroom = capacity - position_age              (0 once the position is gone)

The headroom is how long the position can still wait for the next pull. When it is less than
``oplog.headroom.warn.intervals`` schedule intervals the pull logs a warning naming the replica
set and the fix; with ``oplog.headroom.fail: true`` it fails instead, before reading anything,
so the offset stays where it is and the position is still in the oplog. The estimate ignores
``oplogMinRetentionHours`` (which can only keep entries longer) and the other members, whose
oplogs may be smaller: a failover can shrink the window.

Reading the oplog needs ``find`` and ``collStats`` on ``local.oplog.rs``. Without them the pull
warns once and goes on, unless ``oplog.headroom.fail`` asks for the guard.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongo_cdc.config import SourceConfig
from mongo_cdc.lake import pack_cluster_time

log = logging.getLogger(__name__)

UNAUTHORIZED = 13
_MB = 1024 * 1024
_PRIVILEGE = 'find and collStats on {db: "local", collection: "oplog.rs"}'
# The no-op entry ``replSetInitiate`` writes first in a new replica set's oplog.
_INITIATION_MESSAGE = "initiating set"


class OplogHeadroomError(RuntimeError):
    """The committed position is about to leave the oplog (or the oplog cannot be read) and
    ``oplog.headroom.fail`` is true; the offset is unchanged."""


@dataclass(frozen=True)
class OplogWindow:
    """One replica set's oplog against its committed position (packed cluster times: ``ts << 32 | inc``)."""

    rs: str
    oldest: int
    newest: int
    used_bytes: int
    max_bytes: int
    position: int

    @property
    def window_seconds(self) -> int:
        return (self.newest >> 32) - (self.oldest >> 32)

    @property
    def position_age_seconds(self) -> int:
        return max(0, (self.newest >> 32) - (self.position >> 32))

    @property
    def position_lost(self) -> bool:
        return self.position < self.oldest

    @property
    def bytes_per_second(self) -> float:
        # oplog times have one-second resolution: a window of less than a second counts as one
        return self.used_bytes / max(self.window_seconds, 1)

    @property
    def capacity_seconds(self) -> float | None:
        """Time a full oplog covers at the current rate; None with no writes to measure a rate by."""
        return self.max_bytes / self.bytes_per_second if self.used_bytes > 0 else None

    @property
    def headroom_seconds(self) -> float | None:
        if self.position_lost:
            return 0.0
        capacity = self.capacity_seconds
        return None if capacity is None else max(0.0, capacity - self.position_age_seconds)

    def to_dict(self) -> dict[str, Any]:
        """The figures in seconds and bytes (for programs), and the main ones as text (for people:
        ``window``, ``position_age``, ``headroom``, ``used``, ``max``)."""

        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        headroom = self.headroom_seconds
        return {
            "window": duration(self.window_seconds),
            "position_age": duration(self.position_age_seconds),
            "headroom": "unbounded" if headroom is None else duration(headroom),
            "used": byte_size(self.used_bytes),
            "max": byte_size(self.max_bytes),
            "oldest_cluster_time": self.oldest,
            "newest_cluster_time": self.newest,
            "window_seconds": self.window_seconds,
            "used_bytes": self.used_bytes,
            "max_bytes": self.max_bytes,
            "bytes_per_second": rounded(self.bytes_per_second),
            "capacity_seconds": rounded(self.capacity_seconds),
            "position_cluster_time": self.position,
            "position_age_seconds": self.position_age_seconds,
            "headroom_seconds": rounded(self.headroom_seconds),
            "position_lost": self.position_lost,
        }


@dataclass(frozen=True)
class OplogStart:
    """The oplog's first entry: its op-time, and whether it is the replica set's initiation (then the
    oplog still holds every write the replica set ever took: none was truncated)."""

    op_time: Timestamp
    initiation: bool


def oplog_start(client: MongoClient) -> OplogStart:
    """The first entry of the oplog of the replica set ``client`` points at."""
    first = client.local["oplog.rs"].find_one({}, {"ts": 1, "o.msg": 1, "_id": 0}, sort=[("$natural", 1)])
    return OplogStart(first["ts"], first.get("o", {}).get("msg") == _INITIATION_MESSAGE)


class OplogUnreadableError(RuntimeError):
    """The pull's user may not read the oplog, which a check of a position needs."""


def first_op_time_after(client: MongoClient, rs: str, op_time: Timestamp, checking: str) -> Timestamp | None:
    """The oplog's first op-time when it is after ``op_time``, so the events from ``op_time`` are gone
    (a stream cannot start there); None when the oplog holds ``op_time``, or begins with the replica
    set's initiation (nothing older ever existed). ``checking`` names the position for the error
    raised when the oplog cannot be read."""
    try:
        first = oplog_start(client)
    except OperationFailure as exc:
        if exc.code != UNAUTHORIZED:
            raise
        raise OplogUnreadableError(
            f"replica set {rs}: not allowed to read the oplog to check that {checking} is still in it; "
            f"grant the pull's user {_PRIVILEGE}"
        ) from None
    return None if op_time >= first.op_time or first.initiation else first.op_time


def measure(client: MongoClient, rs: str, position: int) -> OplogWindow:
    """The oplog window of the replica set ``client`` points at, against ``position``."""
    oplog = client.local["oplog.rs"]
    oldest = oplog_start(client).op_time
    newest = oplog.find_one({}, {"ts": 1, "_id": 0}, sort=[("$natural", -1)])["ts"]
    stats = next(oplog.aggregate([{"$collStats": {"storageStats": {}}}]))["storageStats"]
    return OplogWindow(
        rs,
        pack_cluster_time(oldest.time, oldest.inc),
        pack_cluster_time(newest.time, newest.inc),
        int(stats["size"]),
        int(stats["maxSize"]),
        position,
    )


def guard(
    client: MongoClient, config: SourceConfig, rs: str, position: int, interval_s: float, offset_key: str
) -> OplogWindow | None:
    """Measure the window, log it, and warn (or fail, with ``oplog.headroom.fail``) when the headroom
    is under ``oplog.headroom.warn.intervals`` × ``interval_s``. None when the oplog cannot be read."""
    try:
        window = measure(client, rs, position)
    except OperationFailure as exc:
        if exc.code != UNAUTHORIZED:
            raise
        message = (
            f"replica set {rs}: not allowed to read the oplog ({(exc.details or {}).get('codeName')}) to "
            f"check how long the committed position stays in it; grant the pull's user "
            f"{_PRIVILEGE}"
        )
        if config.oplog_headroom_fail:
            raise OplogHeadroomError(
                f"{message}, or set oplog.headroom.fail to false. Offset '{offset_key}' is unchanged."
            ) from None
        log.warning("%s to get the oplog-window guard", message)
        return None
    log.info("replica set %s: %s", rs, describe(window))
    threshold = config.oplog_headroom_warn_intervals * interval_s
    headroom = window.headroom_seconds
    if window.position_lost or headroom is None or headroom >= threshold:
        return window  # a lost position fails the pull with the re-snapshot instructions
    message = (
        f"replica set {rs}: the committed position ({offset_key}) leaves the oplog in about "
        f"{duration(headroom)}, less than {config.oplog_headroom_warn_intervals} schedule intervals "
        f"({duration(interval_s)} each; oplog.headroom.warn.intervals). {describe(window)}. Raise this "
        f"replica set's oplog to at least {suggested_size_mb(window, threshold)} MB "
        "(db.adminCommand({replSetResizeOplog: 1, size: <MB>}) on each member) or run the DAG more "
        "often; once the position is gone only a re-snapshot, or under snapshot.mode when_needed a "
        "heal of what differs, recovers."
    )
    if config.oplog_headroom_fail:
        raise OplogHeadroomError(
            f"{message} The pull did not start (oplog.headroom.fail is true): offset '{offset_key}' "
            "is unchanged and still in the oplog."
        )
    log.warning(message)
    return window


def suggested_size_mb(window: OplogWindow, threshold_s: float) -> int:
    """An oplog size whose capacity at the current rate covers the threshold past the position's age."""
    return math.ceil(window.bytes_per_second * (threshold_s + window.position_age_seconds) / _MB)


def describe(window: OplogWindow) -> str:
    capacity, headroom = window.capacity_seconds, window.headroom_seconds
    return (
        f"oplog window {duration(window.window_seconds)} ({byte_size(window.used_bytes)} of "
        f"{byte_size(window.max_bytes)}, {byte_size(window.bytes_per_second)}/s), capacity at this "
        f"rate {'unbounded' if capacity is None else duration(capacity)}, committed position "
        f"{duration(window.position_age_seconds)} old"
        + (", already gone" if window.position_lost else "")
        + f", headroom {'unbounded' if headroom is None else duration(headroom)}"
    )


def duration(seconds: float) -> str:
    """``946 d 06 h``, ``2 h 05 min``, ``4 min 10 s`` or ``12 s``: readable in a log line."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours:02d} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def byte_size(size: float) -> str:
    """``512 B``, ``12.5 KiB``, ``990.0 MiB`` or ``1.5 GiB``."""
    for unit, scale in (("GiB", 1024**3), ("MiB", _MB), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{int(size)} B"
