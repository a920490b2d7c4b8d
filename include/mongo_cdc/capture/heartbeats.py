"""Debezium's heartbeats (``heartbeat.interval.ms``): the source's position, landed even when nothing changed.

A heartbeat is one row ``{server_name, rs, ts_ms, cluster_time, resume_token}``: the committed
stream position of a replica set (``resume_token`` as Extended JSON, ``cluster_time`` packed) and
when mongo-cdc saw it (``ts_ms``), so ``ts_ms - (cluster_time >> 32) * 1000`` bounds the lag even
of a source whose captured collections are quiet. They are appended to the Delta table
``raw/<topic.prefix>/__heartbeat`` (partitioned by ``hour``), at most one per interval and replica
set. Pulls are short (hourly micro-batches), so the interval is measured from the newest heartbeat
in the table, not from the start of the pull: every pull whose last heartbeat is older than the
interval writes one.

Heartbeats report positions that are already committed, so they are written after the commit and
belong to no batch: a crash loses at most a heartbeat, never claims an uncommitted position.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from mongo_cdc import extjson
from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.raw_rows import now_ms
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake import HEARTBEAT_DIR, hour_partition, pack_cluster_time
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc.lake.table_reads import Where, read_rows

HEARTBEAT_SCHEMA = pa.schema(
    [
        pa.field("server_name", pa.string(), nullable=False),  # topic.prefix
        pa.field("rs", pa.string(), nullable=False),
        pa.field("ts_ms", pa.int64(), nullable=False),
        pa.field("cluster_time", pa.int64()),
        pa.field("resume_token", pa.string()),
        pa.field("hour", pa.string(), nullable=False),
    ]
)


def last_heartbeat_ms(source_lake: SourceLake, rs: str) -> int | None:
    """``ts_ms`` of the replica set's newest heartbeat, None if it has none."""
    table = table_if_exists(source_lake.source_uri(HEARTBEAT_DIR), source_lake.options)
    if table is None:
        return None
    stamps = read_rows(table, ["ts_ms"], Where.equal(rs=rs))
    return pc.max(stamps.column("ts_ms")).as_py() if stamps.num_rows else None


class Heartbeats:
    """One pull's heartbeats for one replica set."""

    def __init__(
        self, config: SourceConfig, rs: str, source_lake: SourceLake, clock: Callable[[], int] = now_ms
    ) -> None:
        self.config = config
        self.rs = rs
        self.source_lake = source_lake
        self.clock = clock
        self.last_ms = last_heartbeat_ms(source_lake, rs) if config.heartbeat_interval_ms else None
        self.written = 0

    def beat(self, offset: Offset) -> None:
        """Land a heartbeat of ``offset``'s committed position, unless the last one is recent enough."""
        interval = self.config.heartbeat_interval_ms
        now = self.clock()
        if not interval or (self.last_ms is not None and now - self.last_ms < interval):
            return
        row = {
            "server_name": self.config.topic_prefix,
            "rs": self.rs,
            "ts_ms": now,
            "cluster_time": offset.cluster_time,
            "resume_token": extjson.encode_str(offset.resume_token) if offset.resume_token else None,
            "hour": hour_partition(pack_cluster_time(now // 1000, 0)),
        }
        write_deltalake(
            self.source_lake.source_uri(HEARTBEAT_DIR),
            pa.Table.from_pylist([row], schema=HEARTBEAT_SCHEMA),
            mode="append",
            partition_by=["hour"],
            storage_options=self.source_lake.options,
        )
        self.last_ms = now
        self.written += 1
