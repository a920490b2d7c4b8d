"""Time-series collections, captured in batches: MongoDB's change streams cannot watch them.

**Each run** (``capture_time_series``, after the pull) reads, per captured time-series collection,
the measurements whose ``timeField`` lies in its window ``[W - lateness, P]`` and lands those the
lake does not hold yet as read events (``op`` ``r``) in one batch of kind ``time_series``:

* ``P`` is the server's clock when the read starts (``hello``'s ``localTime``). A measurement timed
  after ``P`` (a clock ahead of the server's) waits for a run whose ``P`` has passed it, so no batch
  lands a measurement timed after its own window's end.
* ``W`` is the collection's *landed watermark*: the latest window end of its time-series batches in
  the batch log (``Batch.time_windows``). Every measurement timed up to ``W`` that MongoDB held when
  that batch read it is in the lake; ``time.series.lateness.seconds`` is how late a measurement may
  be written (after its own time) and still be read by the next run. The first run has no ``W`` and
  reads every measurement up to ``P``: the collection's copy.
* **Never twice.** Windows overlap (``W - lateness`` reaches back into the last one), so the keys
  already landed are left out: every measurement timed from ``W - lateness`` on was landed by a batch
  whose window ends at or after that (none lands one timed after its end), so only those batches'
  raw rows are read, their ``key`` column alone. The window is recorded even when nothing new was
  found, so the watermark moves on with the clock.

**Periodically** (``reconcile``: the scheduled runs of every ``time.series.reconcile.interval.hours``,
or a run whose trigger param ``verify`` asks for it), each collection is compared with its state
table the way a verification compares a collection (``verify.digest``: a count and a sum of
128-bit document hashes per cell of ``_id`` hashes, then the documents of the differing cells one
by one), over every measurement timed up to ``P``. What differs lands as change rows in the same kind
of batch: ``c`` for a measurement the state lacks (late beyond the window), ``u`` for one it holds
otherwise (``updateMany`` on a ``metaField``), ``d`` for one MongoDB no longer has (``deleteMany``),
so the state equals the collection after it. It waits for a run whose state has applied every
batch of the collection (a transform that failed leaves raw rows the state lacks, which are not
drift); its window is ``[None, P]``.

**Dropped.** A collection earlier runs landed that MongoDB no longer has, under any kind
(``dropped_time_series``), has no drop event to empty its state (no stream reads it): each run
reconciles it as holding no measurement, so its state's documents land as ``d`` rows once.

**Key.** A measurement's ``_id``: the driver gives each inserted measurement a fresh ``ObjectId``,
and it is the only field that tells two measurements with the same time and meta apart. MongoDB
does not index or enforce it in a time-series collection: measurements written with an ``_id`` of
their own that repeats are one document in the state (the last landed).

Only ``system.buckets.*`` hold a time-series collection's data on disk; they are ``system.*``
collections, which no filter captures. The collection is read through its own name, as MongoDB
unpacks it. Replica sets only: a sharded cluster's time-series collections are not captured.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from bson.datetime_ms import DatetimeMS
from deltalake import DeltaTable
from pymongo import MongoClient

from mongo_cdc import extjson
from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.collection_kinds import dropped_since, matched_collections
from mongo_cdc.capture.document_ids import document_id
from mongo_cdc.capture.field_filters import collection_field_rules
from mongo_cdc.capture.raw_rows import RawRow, SourceInfo, now_ms, tombstone_of
from mongo_cdc.capture.raw_tables import keys_and_documents, raw_documents, raw_rows_table
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import current_position
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.layout import table_uri
from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc.lake.table_reads import read_rows, scan_rows
from mongo_cdc.namespace import Namespace
from mongo_cdc.transform.raw_events import applied_batches, event_keys
from mongo_cdc.verify.digest import Digests, cells_per_range, document_hashes, id_cells

log = logging.getLogger(__name__)

TIME_SERIES_BATCH = "time_series"
# the cells a reconcile cuts a collection into by its _id hashes: one range's worth, as a
# verification cuts each of its ranges
_CELLS = cells_per_range(1)
# a batch's window of measurement times (ms): from (None: the first measurement) to
Window = tuple[int | None, int]
# raw keys and documents, a batch of them at a time
Documents = Iterator[tuple[pa.Array, pa.Array]]


@dataclass(frozen=True)
class TimeSeries:
    """A captured time-series collection and the options it was created with."""

    db: str
    name: str
    time_field: str
    meta_field: str | None = None
    granularity: str | None = None
    # landed by earlier runs and dropped since (``dropped_since``): it has no measurement to read
    dropped: bool = False

    @property
    def namespace(self) -> str:
        return f"{self.db}.{self.name}"


def captured_time_series(client: MongoClient, config: SourceConfig) -> list[TimeSeries]:
    """The time-series collections the source's filters capture, with their ``timeField``,
    ``metaField`` and ``granularity`` (``listCollections`` options)."""
    found = []
    for db, names, infos in matched_collections(client, config):
        for name in names:
            if infos[name].get("type") == "timeseries" and config.captures_collection(db, name):
                options = infos[name].get("options", {}).get("timeseries", {})
                meta, granularity = options.get("metaField"), options.get("granularity")
                found.append(TimeSeries(db, name, options["timeField"], meta, granularity))
    return found


def dropped_time_series(
    capture: ReplicaSetCapture, batches: list[Batch], found: list[TimeSeries]
) -> list[TimeSeries]:
    """The time-series collections earlier runs of the replica set landed that are dropped since
    (``dropped_since``): reconciled as holding no measurement, their states' documents land as
    deletes, then nothing more."""
    landed = (namespace for batch in batches if batch.rs == capture.rs for namespace, _ in batch.time_windows)
    current = [series.namespace for series in found]
    return [
        TimeSeries(*Namespace.parse(namespace), time_field="", dropped=True)
        for namespace in dropped_since(capture.client, capture.config, landed, current)
    ]


def landed_windows(batches: list[Batch], rs: str, namespace: str) -> list[tuple[Batch, Window]]:
    """The time-series batches of ``rs`` that read ``namespace``, each with its window."""
    found = []
    for batch in batches:
        if batch.rs == rs:
            window = dict(batch.time_windows).get(namespace)
            if window is not None:
                found.append((batch, window))
    return found


def watermark(windows: list[tuple[Batch, Window]]) -> int | None:
    """The landed watermark (ms): the latest end of the windows, None before the first read."""
    return max((end for _, (_, end) in windows), default=None)


@dataclass
class TimeSeriesRead:
    """What one collection's pass found: its rows to land, the window it read, and its figures."""

    series: TimeSeries
    window: Window
    rows: list[RawRow] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    reconciled: bool = False

    def add(self, row: RawRow) -> None:
        self.rows.append(row)
        if row.op is not None:
            self.ops[row.op] = self.ops.get(row.op, 0) + 1


@dataclass
class TimeSeriesResult:
    """One replica set's time-series pass: the batch it landed (if any) and, per collection, its
    counts by op and how fresh its table is (``freshness``)."""

    batch_seq: int | None = None
    collections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"batch_seq": self.batch_seq, "collections": self.collections}


def _milliseconds(moment: dt.datetime | DatetimeMS) -> int:
    """A BSON date as milliseconds since the epoch (the source's clients decode dates as
    ``DatetimeMS``, ``topology``; a plain client as naive UTC ``datetime``)."""
    if isinstance(moment, dt.datetime):
        return int(moment.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    return int(moment)


def _ms_time(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def _iso(ms: int | None) -> str | None:
    return None if ms is None else _ms_time(ms).isoformat(timespec="seconds")


def _time_query(series: TimeSeries, start: int | None, end: int) -> dict:
    bounds: dict[str, dt.datetime] = {"$lte": _ms_time(end)}
    if start is not None:
        bounds["$gte"] = _ms_time(start)
    return {series.time_field: bounds}


def _documents(capture: ReplicaSetCapture, series: TimeSeries, query: dict) -> Documents:
    """Raw keys and documents (the field rules applied) of the measurements ``query`` matches, a
    server batch at a time: bytes as MongoDB sent them, never decoded."""
    if series.dropped:
        return
    fields = collection_field_rules(capture.config, series.db, series.name)
    for batch in capture.client[series.db][series.name].find_raw_batches(query):
        yield keys_and_documents(raw_documents(batch), fields)


def _landed_keys(capture: ReplicaSetCapture, namespace: str, seqs: list[int]) -> set[str]:
    """The normalised keys of the raw rows of ``namespace`` in the replica set's batches ``seqs``."""
    raw = table_if_exists(capture.lake.raw_uri(namespace), capture.lake.options)
    if raw is None or not seqs:
        return set()
    rows = read_rows(raw, ["key"], BatchWindow({capture.rs: tuple(sorted(seqs))}).where())
    return set(event_keys(rows.column("key"))[0].to_pylist())


@dataclass(frozen=True)
class Stamp:
    """Where a pass's rows stand: the ``source`` block and the cluster time of its read's start, so
    a later batch's rows (and a reconcile's) win over them by the state's rule."""

    block: tuple
    cluster_time: int

    def row(self, raw_key: object, op: str, document: bytes | None) -> RawRow:
        return RawRow(raw_key, op, now_ms(), None, document, None, self.block, self.cluster_time, "")


def read_new(
    capture: ReplicaSetCapture, series: TimeSeries, batches: list[Batch], end: int, stamp: Stamp
) -> TimeSeriesRead:
    """The measurements timed in ``[W - lateness, end]`` the lake does not hold yet, as ``r`` rows."""
    windows = landed_windows(batches, capture.rs, series.namespace)
    landed = watermark(windows)
    start = None if landed is None else landed - capture.config.time_series_lateness_seconds * 1000
    # every key landed timed from ``start`` on is in a batch whose window ends at or after ``start``
    seqs = [batch.raw_seq for batch, (_, ended) in windows if start is not None and ended >= start]
    known = _landed_keys(capture, series.namespace, seqs)
    read = TimeSeriesRead(series, (start, end))
    for raw_keys, documents in _documents(capture, series, _time_query(series, start, end)):
        keys = event_keys(raw_keys)[0].to_pylist()
        for key, raw_key, document in zip(keys, raw_keys.to_pylist(), documents.to_pylist(), strict=True):
            if key not in known:
                known.add(key)
                read.add(stamp.row(raw_key, "r", document))
    return read


def _state_rows(state: DeltaTable | None, cells: np.ndarray | None = None) -> Documents:
    """The state's keys and documents a scan batch at a time (memory: one batch), only those in
    ``cells`` when given."""
    if state is None:
        return
    for rows in scan_rows(state, ["__key", "__doc_bson"]):
        keys, documents = rows.column("__key").combine_chunks(), rows.column("__doc_bson").combine_chunks()
        if cells is not None:
            picked = pa.array(np.flatnonzero(np.isin(id_cells(documents, _CELLS), cells)))
            keys, documents = keys.take(picked), documents.take(picked)
        yield keys, documents


def reconcile(
    capture: ReplicaSetCapture, series: TimeSeries, batches: list[Batch], end: int, stamp: Stamp
) -> TimeSeriesRead | None:
    """The differences between the collection (measurements timed up to ``end``) and its state as
    ``c``/``u``/``d`` rows; None when the state has not applied every batch of it yet."""
    source_lake = capture.lake
    uri = table_uri(source_lake.location, "state", source_lake.prefix, series.db, series.name)
    state = table_if_exists(uri, source_lake.options)
    applied = applied_batches(state, "state", sorted({batch.rs for batch in batches}))
    if not BatchWindow.of(batches, series.namespace, applied).is_empty:
        log.info("%s: the reconcile waits for a run whose state has applied every batch", series.namespace)
        return None
    query = _time_query(series, None, end)
    source, stored = Digests(_CELLS), Digests(_CELLS)
    for _, documents in _documents(capture, series, query):
        source.add(id_cells(documents, _CELLS), document_hashes(documents))
    for _, documents in _state_rows(state):
        stored.add(id_cells(documents, _CELLS), document_hashes(documents))
    read = TimeSeriesRead(series, (None, end), reconciled=True)
    differing = np.array(sorted(source.differing(stored)), np.int64)
    if not len(differing):
        return read
    # MongoDB's documents of the differing cells, by normalised key: (hash, raw key, document)
    held: dict[str, tuple[tuple[int, ...], object, bytes]] = {}
    for raw_keys, documents in _documents(capture, series, query):
        picked = pa.array(np.flatnonzero(np.isin(id_cells(documents, _CELLS), differing)))
        documents, raw_keys = documents.take(picked), raw_keys.take(picked)
        found = zip(event_keys(raw_keys)[0].to_pylist(), document_hashes(documents).tolist(),
                    raw_keys.to_pylist(), documents.to_pylist(), strict=True)  # fmt: skip
        held.update((key, (tuple(digest), raw_key, document)) for key, digest, raw_key, document in found)
    for keys, documents in _state_rows(state, differing):
        for key, digest, document in zip(
            keys.to_pylist(), document_hashes(documents).tolist(), documents.to_pylist(), strict=True
        ):
            current = held.pop(key, None)
            if current is None:  # MongoDB no longer has it
                row = stamp.row(extjson.document_key(document_id(document)), "d", None)
                read.add(row)
                if capture.config.tombstones_on_delete:
                    read.add(tombstone_of(row))
            elif current[0] != tuple(digest):
                read.add(stamp.row(current[1], "u", current[2]))
    for _, raw_key, document in held.values():  # the state lacks them
        read.add(stamp.row(raw_key, "c", document))
    return read


def capture_time_series(capture: ReplicaSetCapture, reconcile_due: bool) -> TimeSeriesResult:
    """Read every captured time-series collection of the replica set (reconciling each when
    ``reconcile_due``) and land what was found as one batch of kind ``time_series``, whose windows
    the batch log keeps. Nothing is landed while the replica set has no streaming position yet."""
    result = TimeSeriesResult()
    found = captured_time_series(capture.client, capture.config)
    batches = capture.lake.batches()
    dropped = dropped_time_series(capture, batches, found)
    if not found and not dropped:
        return result
    offset = capture.keeper.load_checked()
    if offset is None or offset.resume_token is None:
        log.info("replica set %s: time-series collections wait for its streaming position", capture.rs)
        return result
    position = token_cluster_time(current_position(capture.client))
    # the server's clock, to the millisecond: a cluster time counts seconds, and on a quiet replica
    # set stands up to 10 s behind (its no-op writer's interval), which held fresh measurements back
    end = _milliseconds(capture.client.admin.command("hello")["localTime"])
    source = SourceInfo(capture.config.topic_prefix, capture.rs)
    reads: list[TimeSeriesRead] = []
    for series in found:
        stamp = Stamp(source.values(series.db, series.name, position, end, snapshot=True), position)
        done = reconcile(capture, series, batches, end, stamp) if reconcile_due else None
        reads.append(done if done is not None else read_new(capture, series, batches, end, stamp))
    for series in dropped:  # reconciled with no measurement: once their states are empty, nothing
        stamp = Stamp(source.values(series.db, series.name, position, end, snapshot=True), position)
        emptied = reconcile(capture, series, batches, end, stamp)
        if emptied is not None and emptied.rows:
            log.info("%s is gone from MongoDB: the documents of its state land as deletes", series.namespace)
            reads.append(emptied)
    if not reads:
        return result
    seq = offset.next_seq
    written = []
    for read in reads:
        if read.rows:
            capture.lake.write_raw(capture.rs, seq, read.series.namespace, raw_rows_table(read.rows, seq))
            written.append(read.series.namespace)
    batch = Batch(
        capture.rs, seq, TIME_SERIES_BATCH, offset.resume_token, offset.cluster_time,
        namespaces=tuple(written), open_transaction=offset.open_transaction,
        time_windows=tuple((read.series.namespace, read.window) for read in reads),
    )  # fmt: skip
    capture.keeper.commit_batch(offset, batch)
    result.batch_seq = seq
    for read in reads:
        result.collections[read.series.namespace] = freshness(capture.config, read)
    return result


def freshness(config: SourceConfig, read: TimeSeriesRead) -> dict[str, Any]:
    """How fresh a time-series table is after this run (once the transform applies its batch), for
    the run's summary: measurements timed up to ``landed_up_to`` are in it, those written no later
    than ``lateness_seconds`` after their own time included; older late ones, updates and deletes
    arrive by the next reconcile."""
    series = read.series
    figures = {
        "events": dict(read.ops),
        "time_field": series.time_field,
        "meta_field": series.meta_field,
        "granularity": series.granularity,
        "landed_up_to": _iso(read.window[1]),
        "window_start": _iso(read.window[0]),
        "lateness_seconds": config.time_series_lateness_seconds,
        "reconciled": read.reconciled,
        "reconcile_interval_hours": config.time_series_reconcile_interval_hours,
    }
    log.info(
        "%s (time-series, by %s): %s; measurements timed up to %s landed (read from %s); late ones "
        "within %d s of their time land at the next run, later ones, updates and deletes at the next "
        "reconcile (every %d h)",
        series.namespace, series.time_field,
        ", ".join(f"{op}={n}" for op, n in sorted(read.ops.items())) or "nothing new",
        figures["landed_up_to"], figures["window_start"] or "the first measurement",
        figures["lateness_seconds"], figures["reconcile_interval_hours"],
    )  # fmt: skip
    return figures
