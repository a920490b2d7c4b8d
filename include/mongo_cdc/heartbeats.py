"""Debezium's heartbeats (``heartbeat.interval.ms``): the source's position, landed even when nothing changed.

A heartbeat is one row ``{server_name, rs, ts_ms, cluster_time, resume_token}``: the committed
stream position of a replica set (``resume_token`` as Extended JSON, ``cluster_time`` packed) and
when mongo-cdc saw it (``ts_ms``), so ``ts_ms - (cluster_time >> 32) * 1000`` bounds the lag even
of a source whose captured collections are quiet. Files go to
``raw/<topic.prefix>/__heartbeat/hour=<YYYY-MM-DDTHH>/<rs>-<ts_ms>.parquet``, one heartbeat each,
at most one per interval and replica set. Pulls are short (hourly micro-batches), so the interval
is measured from the newest heartbeat file, not from the start of the pull: every pull whose last
heartbeat is older than the interval writes one.

Heartbeats report positions that are already committed, so they are written after the commit and
need no pending protocol: a crash loses at most a heartbeat, never claims an uncommitted position.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pyarrow as pa

from mongo_cdc import extjson
from mongo_cdc.config import SourceConfig
from mongo_cdc.events import now_ms
from mongo_cdc.lake import HEARTBEAT_DIR, hour_partition, pack_cluster_time, raw_dir
from mongo_cdc.landing import write_table
from mongo_cdc.offsets import Offset

HEARTBEAT_SCHEMA = pa.schema(
    [
        pa.field("server_name", pa.string(), nullable=False),  # topic.prefix
        pa.field("rs", pa.string(), nullable=False),
        pa.field("ts_ms", pa.int64(), nullable=False),
        pa.field("cluster_time", pa.int64()),
        pa.field("resume_token", pa.string()),
    ]
)

_FILE_NAME = re.compile(r"^(?P<rs>.+)-(?P<ts_ms>\d{15})\.parquet$")


def heartbeat_dir(config: SourceConfig) -> str:
    return raw_dir(config.lake_root, config.topic_prefix, HEARTBEAT_DIR)


def last_heartbeat_ms(config: SourceConfig, rs: str) -> int | None:
    """``ts_ms`` of the replica set's newest heartbeat file, None if it has none."""
    base = heartbeat_dir(config)
    hours = sorted(os.listdir(base), reverse=True) if os.path.isdir(base) else []
    for hour in hours:
        if not hour.startswith("hour="):
            continue
        stamps = [
            int(match["ts_ms"])
            for match in map(_FILE_NAME.match, os.listdir(os.path.join(base, hour)))
            if match and match["rs"] == rs
        ]
        if stamps:
            return max(stamps)
    return None


class Heartbeats:
    """One pull's heartbeats for one replica set."""

    def __init__(self, config: SourceConfig, rs: str, clock: Callable[[], int] = now_ms) -> None:
        self.config = config
        self.rs = rs
        self.clock = clock
        self.last_ms = last_heartbeat_ms(config, rs) if config.heartbeat_interval_ms else None
        self.written = 0

    def beat(self, offset: Offset) -> None:
        """Land a heartbeat of ``offset``'s committed position, unless the last one is recent enough."""
        interval = self.config.heartbeat_interval_ms
        now = self.clock()
        if not interval or (self.last_ms is not None and now - self.last_ms < interval):
            return
        hour = hour_partition(pack_cluster_time(now // 1000, 0))
        path = os.path.join(heartbeat_dir(self.config), hour, f"{self.rs}-{now:015d}.parquet")
        row = {
            "server_name": self.config.topic_prefix,
            "rs": self.rs,
            "ts_ms": now,
            "cluster_time": offset.cluster_time,
            "resume_token": extjson.encode_str(offset.resume_token) if offset.resume_token else None,
        }
        write_table(path, pa.Table.from_pylist([row], schema=HEARTBEAT_SCHEMA))
        self.last_ms = now
        self.written += 1
