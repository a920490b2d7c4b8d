"""Backfills: make a past data interval's raw and changes partitions complete, without the live sync.

A backfill run (Airflow ``backfill create`` / the UI's Backfill) covers the whole hours of its
data interval. Events the live sync already landed are used as they are. Only hours older than
anything the live sync landed for a replica set (before its first snapshot, say) are pulled from
the oplog into the collections' raw tables as history rows (``batch_seq`` ``lake.HISTORY_SEQ``),
one commit per collection and hour that replaces that hour's history rows: their content depends
on the hour alone, so re-running any backfill over it rewrites the same events, backfills are
idempotent and never duplicate a live event.

A backfill never reads or writes an offset: the live resume tokens cannot move, and the state
tables never read history rows (their events are older than the state), so state cannot regress.

Where the oplog no longer reaches back to the interval, what the live sync landed is used (the
missing older part is reported); where neither exists, the backfill fails naming both limits.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient

from mongo_cdc.capture.change_cursor import event_fields, open_change_stream, plain_token, token_cluster_time
from mongo_cdc.capture.field_hash_marks import FieldHashMarks
from mongo_cdc.capture.micro_batch import MicroBatch
from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.raw_rows import SourceInfo
from mongo_cdc.capture.raw_tables import raw_rows_table
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.streaming import collect_change, stream_options
from mongo_cdc.capture.transactions import TransactionTracker
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake import HISTORY_SEQ, hour_partition, pack_cluster_time
from mongo_cdc.lake.landing import SourceLake

log = logging.getLogger(__name__)

HOUR = dt.timedelta(hours=1)


class BackfillError(RuntimeError):
    """The interval cannot be backfilled; the message names the limits and what to do."""


@dataclass
class BackfillResult:
    rs: str
    hours: list[str]
    # "pulled": older hours re-read from the oplog; "landed": the live sync's files cover the
    # interval; "unavailable": the oplog no longer reaches the older part, the landed part is used
    history: str
    history_events: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rs": self.rs,
            "hours": self.hours,
            "history": self.history,
            "history_events": self.history_events,
        }


def interval_hours(start: dt.datetime, end: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The whole UTC hours covering [start, end): a backfill always rebuilds complete partitions."""
    first = start.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    last = end.astimezone(dt.timezone.utc)
    if last.replace(minute=0, second=0, microsecond=0) != last:
        last = last.replace(minute=0, second=0, microsecond=0) + HOUR
    return first, max(last, first + HOUR)


def hour_partitions(start: dt.datetime, end: dt.datetime) -> list[str]:
    """The UTC hours (``YYYY-MM-DDTHH``, the ``hour`` partition values) covering [start, end)."""
    first, last = interval_hours(start, end)
    hours, hour = [], first
    while hour < last:
        hours.append(hour.strftime("%Y-%m-%dT%H"))
        hour += HOUR
    return hours


def _packed(moment: dt.datetime) -> int:
    return pack_cluster_time(int(moment.timestamp()), 0)


def _utc(position: int) -> str:
    return dt.datetime.fromtimestamp(position >> 32, tz=dt.timezone.utc).isoformat(timespec="seconds")


def oldest_oplog_position(client: MongoClient) -> int:
    """Packed cluster time from which the oplog holds every change (0: since the set began).

    An oplog that still starts with the replica set's initiation entry has lost nothing.
    """
    entry = client.local["oplog.rs"].find({}, {"ts": 1, "o": 1}).sort("$natural", 1).limit(1).next()
    if entry.get("o") == {"msg": "initiating set"}:
        return 0
    return pack_cluster_time(entry["ts"].time, entry["ts"].inc)


def earliest_landed_position(source_lake: SourceLake, rs: str) -> int | None:
    """Packed cluster time from which the live sync landed everything of ``rs`` (its first batch's
    position: a snapshot's, or where streaming started). None: nothing landed yet."""
    batches = [batch for batch in source_lake.batches() if batch.rs == rs]
    if not batches:
        return None
    first = batches[0]
    return first.snapshot_cluster_time if first.snapshot_cluster_time is not None else first.cluster_time


def backfill_interval(
    source: ReplicaSetCapture, offset: Offset | None, start: dt.datetime, end: dt.datetime
) -> BackfillResult:
    """Make the raw partitions of [start, end) complete for one replica set; ``offset`` is only read."""
    client, config, rs, source_lake = source.client, source.config, source.rs, source.lake
    if offset is None or offset.cluster_time is None:
        raise BackfillError(
            f"replica set {rs}: the live sync has not started yet, so a backfill has nothing to complete; "
            "trigger the DAG normally first (its snapshot captures the current state)"
        )
    hours = hour_partitions(start, end)
    first_hour, end_hour = interval_hours(start, end)
    landed_since = earliest_landed_position(source_lake, rs)
    # the live sync holds everything from its first landed event on (or, having landed none, from
    # its position on); older hours are history
    history_from = _packed(first_hour)
    history_to = min(_packed(end_hour), landed_since if landed_since is not None else offset.cluster_time)
    if history_from >= history_to:
        return BackfillResult(rs, hours, "landed")
    oplog_from = oldest_oplog_position(client)
    if oplog_from > history_from:
        landed_in_interval = landed_since is not None and landed_since < _packed(end_hour)
        if not landed_in_interval:
            raise BackfillError(
                f"replica set {rs}: cannot backfill {hours[0]} to {hours[-1]}: the live sync's first landed "
                f"position is {_utc(history_to)} and the oplog only goes back to {_utc(oplog_from)}, so "
                "neither holds these hours' changes"
            )
        log.warning(
            "replica set %s: the oplog only goes back to %s; using the landed changes from %s on, the "
            "changes before are not available any more",
            rs, _utc(oplog_from), _utc(landed_since),
        )  # fmt: skip
        return BackfillResult(rs, hours, "unavailable")
    events = _pull_history(client, config, rs, offset, history_from, history_to, source_lake)
    return BackfillResult(rs, hours, "pulled", events)


def _pull_history(
    client: MongoClient,
    config: SourceConfig,
    rs: str,
    offset: Offset,
    history_from: int,
    history_to: int,
    source_lake: SourceLake,
) -> dict[str, dict[str, int]]:
    """Land the captured events in [history_from, history_to) as history rows (per collection and hour)."""
    log.info("replica set %s: pulling history from %s to %s", rs, _utc(history_from), _utc(history_to))
    options = stream_options(config, offset)
    del options["resume_after"]
    options["start_at_operation_time"] = Timestamp(history_from >> 32, history_from & 0xFFFFFFFF)
    source = SourceInfo(config.topic_prefix, rs)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    batch = MicroBatch()
    # history files carry no transaction metadata: BEGIN/END records belong to the live batches
    no_transactions = TransactionTracker(False, rs, None)
    hour = hour_partition(history_from)
    marks = FieldHashMarks(source_lake, config)
    with open_change_stream(client, **options) as stream:
        while True:
            raw_change = stream.try_next()
            change = event_fields(raw_change) if raw_change is not None else None
            position = token_cluster_time(
                change["_id"] if change is not None else plain_token(stream.resume_token)
            )
            if position >= history_to:
                break
            if change is None:
                continue
            if hour_partition(position) != hour:  # one hour at a time stays in memory
                _write_history(source_lake, marks, rs, hour, batch, counts)
                batch, hour = MicroBatch(), hour_partition(position)
            collect_change(change, config, source, batch, no_transactions)
    _write_history(source_lake, marks, rs, hour, batch, counts)
    return {namespace: dict(ops) for namespace, ops in counts.items()}


def _write_history(
    source_lake: SourceLake,
    marks: FieldHashMarks,
    rs: str,
    hour: str,
    batch: MicroBatch,
    counts: dict[str, dict[str, int]],
) -> None:
    marks.check(batch.rows)
    for namespace, rows in batch.rows.items():
        source_lake.write_history(rs, namespace, hour, raw_rows_table(rows, HISTORY_SEQ))
    for namespace, ops in batch.events_by_op.items():
        for op, count in ops.items():
            counts[namespace][op] += count
