"""Spark job: every collection's committed raw events -> its Delta ``state`` and ``changes`` tables.

    spark-submit spark_apps/cdc_transform.py --lake-root /lake --topic-prefix shop

Object-store credentials come from the environment (``storage.LakeLocation.from_env``). The lake
says what is committed (the batch log, ``landing.SourceLake``); each derived table records per
replica set the last batch it applied (Delta app transactions, ``raw_events.applied_app_id``) in
the same commit as its data, so a run applies exactly the batches committed since the last one,
whatever crashed before; a collection's run that loses a commit race to another writer of its
tables (two transforms at once) is made again from a fresh read (``CollectionTransform.converged``).
Spark parallelises the Python work; delta-rs commits, so no Spark jar is needed. How a run goes,
per collection:

1. the raw files that may hold new rows are cut into slices of about ``SLICE_ROWS`` rows
   (``raw_slices``), one Spark task each, read as Arrow tables (``read_slice``);
2. plan (``plan_slice``, column-wise): each state event's document key; documents with more than one
   new event, or an update without ``after``, are *folded apart* (step 4), the others have one;
3. each slice's task (``transform_slice``) decodes each document once (one ``bson.decode_all``) for
   both tables and writes, under the tables' directories, its state rows (the documents with one
   event, sorted by ``__key``) and its change rows (a file per hour), each in the stored layout
   evolved by what its own rows need; it hands the driver only file names and those needs;
4. the documents folded apart: their events grouped by document (Spark's shuffle), folded with the
   stored version or deletion marker (``fold_events``), written like step 3;
5. the driver settles each table's layout from every task's needs (a task whose rows took other
   types for a new field writes them again in it), then commits: a new state table in one commit
   of the written files, an existing one by MERGE of the (staged) rows; change files appended in
   one commit (new columns first, in a commit of their own).

* state: the new events are folded per document (its normalised ``_id``, ``transform.keys``), with
  the stored version where an update without ``after`` needs it, then MERGEd into the table in one
  commit: newer versions update, deletions delete, new documents insert; an event at or before a
  document's stored position changes nothing. A committed snapshot manifest, drop or rename in the
  new batches also deletes the documents of that replica set sitting before it (the MERGE's
  ``when_not_matched_by_source``). Only the data files holding changed documents are rewritten.
* changes: one row per new event, appended, partitioned by ``hour``; old files are never
  rewritten. A new field adds a column; a value whose type conflicts with its column's goes to the
  column's fallback sibling (``transform.columns``). The flattening options (``--flattening``, keyed
  like the source YAML) are recorded in the table's schema: other options rebuild the table, and
  say so. ``--rebuild-hours`` rewrites the rows of those hours from the raw rows and backfilled
  history (a backfill run).

Collections fail alone: a collection whose transform raises is logged (its namespace, the
committed batches its tables are behind, ``backlog.collection_backlog``, and the traceback) and
the job carries on with the others, then exits 1 after one stderr line (right before the
summary) naming each failed collection and its batches behind.

Output: the last stdout line is a JSON summary: under ``collections`` per ``<db>.<collection>``
that landed, ``new_events``, ``state_rows``, ``change_rows``, ``change_rows_written``,
``changes_rebuilt`` (and ``maintenance``); under ``failed`` per collection that failed, ``error``
(its first line) and ``batches_behind``. Bad arguments print one line to stderr and exit 2 before
Spark starts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import reduce
from typing import Any, NamedTuple

import bson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import create_table_with_add_actions
from pyspark import SparkConf, SparkContext

from mongo_cdc import extjson, lake
from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.errors import refuse_legacy_layout
from mongo_cdc.lake.landing import COMMIT_RETRIES, SourceLake
from mongo_cdc.lake.maintenance import maintain_table
from mongo_cdc.lake.storage import LakeLocation, row_count, table_if_exists
from mongo_cdc.lake.table_reads import Where, plain, read_rows
from mongo_cdc.transform import columns
from mongo_cdc.transform.backlog import behind_text, collection_backlog
from mongo_cdc.transform.data_files import (
    DataFile,
    add_actions,
    delete_data_files,
    delete_directory,
    write_data_file,
)
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    current_id_json,
    drop_with_collection,
    fold_events,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.flatten import change_rows, delete_rows_hold_before_images
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_events import (
    RAW_COLUMNS,
    ChangeEvent,
    applied_app_id,
    applied_batches,
    decode_documents,
    event_from_row,
    event_keys,
)
from mongo_cdc.transform.table_layout import TableLayout, widened

log = logging.getLogger("cdc_transform")

HOUR_NAME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}")
# The state table's leading columns (a DocumentVersion's, with the document rendered two ways).
STATE_METADATA_COLUMNS: tuple[tuple[str, columns.ColumnType], ...] = (
    ("__key", columns.STRING),
    ("__id", columns.STRING),
    ("__doc", columns.STRING),
    ("__doc_bson", columns.BINARY),
    ("__cluster_time", columns.LONG),
    ("__event_order", columns.STRING),
    ("__rs", columns.STRING),
)
# The deletion markers' columns (lake.deletions_uri): a deleted document's last position.
DELETION_COLUMNS = ("__key", "__cluster_time", "__event_order", "__rs")
# A MERGE source row's deletion flag: never a column of the table.
DELETED_FLAG = "__merge_deleted"
# Where the changes table records the flattening options it was written with.
FLATTENING_METADATA = "mongo_cdc.flattening"
# Raw rows per Spark task (a slice): each task writes a state file and a change file per hour of
# them. Fewer when that keeps every core busy, but not below MIN_SLICE_ROWS (tiny files).
SLICE_ROWS = 50_000
MIN_SLICE_ROWS = 5_000
# A MERGE source of at most this many rows is handed to delta-rs whole, which lets it read and
# rewrite only the state files whose key range may hold a source key; a larger one is streamed.
MERGE_IN_MEMORY_ROWS = 200_000
# Columns with file statistics (min/max/null count) in the data files the job writes.
STATE_STATS_COLUMNS = ("__key", "__cluster_time", "__event_order", "__rs")
CHANGES_STATS_COLUMNS = ("__cluster_time", "__event_order")
# Under a state table: MERGE sources and rebuilt change rows, written before their commit.
STAGING_DIR = "_mongo_cdc_staging"
# How many times in all a collection's run is made (``CollectionTransform.converged``) while it keeps
# losing commit races to other writers of its tables, before the job fails.
COMMIT_RACE_ATTEMPTS = 4


class LostCommitRace(RuntimeError):
    """Another writer committed to one of a collection's tables after this run read it."""


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _flattening(text: str) -> FlatteningOptions:
    try:
        return FlatteningOptions.from_json(json.loads(text))
    except ValueError as error:  # JSONDecodeError included
        raise argparse.ArgumentTypeError(str(error)) from None


def _hours(text: str) -> tuple[str, ...]:
    try:
        hours = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    if not isinstance(hours, list) or not all(isinstance(h, str) and HOUR_NAME.fullmatch(h) for h in hours):
        raise argparse.ArgumentTypeError('expected ["YYYY-MM-DDTHH", ...]')
    return tuple(hours)


def _maintenance(text: str) -> dict[str, int]:
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    keys = {"optimize_interval_hours", "retention_hours"}
    if (
        not isinstance(settings, dict)
        or set(settings) != keys
        or not all(
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
            for value in settings.values()
        )
    ):
        raise argparse.ArgumentTypeError(
            'expected {"optimize_interval_hours": <hours>, "retention_hours": <hours>}'
        )
    return settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _ArgumentParser(prog="cdc_transform", description=__doc__.splitlines()[0])
    parser.add_argument("--lake-root", required=True, help="a local path or an s3://, gs://, abfss:// URI")
    parser.add_argument("--topic-prefix", required=True)
    parser.add_argument(
        "--flattening",
        type=_flattening,
        default=FlatteningOptions(),
        help='the changes table\'s event flattening, e.g. {"flatten.struct": true} (defaults otherwise)',
    )
    parser.add_argument(
        "--rebuild-hours",
        type=_hours,
        default=(),
        help='JSON list of hours whose change rows are rewritten, e.g. ["2024-05-01T13"]',
    )
    parser.add_argument(
        "--maintain",
        type=_maintenance,
        default=None,
        help='compact and vacuum every table afterwards, e.g. {"optimize_interval_hours": 24, '
        '"retention_hours": 168}',
    )
    args = parser.parse_args(argv)
    if args.topic_prefix in ("", ".", "..") or "/" in args.topic_prefix:
        parser.error(f"--topic-prefix {args.topic_prefix!r} is not a directory name")
    return args


def start_spark() -> SparkContext:
    """The job's SparkContext. No SparkSession: the job runs Python tasks only, and a session's SQL
    state takes seconds to build on every run."""
    context = SparkContext.getOrCreate(
        SparkConf().setAppName("mongo-cdc-transform").set("spark.ui.enabled", "false")
    )
    context.setLogLevel("WARN")
    return context


class RawFile(NamedTuple):
    """A data file of a raw table: its path under the lake root, partition, batch range and rows."""

    path: str
    hour: str
    min_seq: int | None
    max_seq: int | None
    rows: int


class RawPiece(NamedTuple):
    """Rows of one raw file: some of its row groups, or all of it (``row_groups`` None)."""

    path: str
    row_groups: tuple[int, ...] | None


# A slice of the raw events: the pieces one Spark task reads, about SLICE_ROWS rows in all.
RawSlice = tuple[RawPiece, ...]


def raw_files(table: DeltaTable, table_path: str) -> list[RawFile]:
    actions = pa.table(table.get_add_actions(flatten=True))
    names = actions.column_names
    return [
        RawFile(
            f"{table_path}/{row['path']}",
            row["partition.hour"],
            row["min.batch_seq"] if "min.batch_seq" in names else None,
            row["max.batch_seq"] if "max.batch_seq" in names else None,
            row["num_records"] or 0,
        )
        for row in actions.to_pylist()
    ]


def raw_slices(location: LakeLocation, files: list[RawFile], parallelism: int) -> list[RawSlice]:
    """``files`` in slices of about SLICE_ROWS rows (fewer when that keeps every core busy), in batch
    order, so each slice's change files cover few hours and its state file a narrow range of keys.

    Small files (a pull's batches) are grouped; a large one (a snapshot's) is split at its row groups.
    """
    total = sum(file.rows for file in files)
    target = max(MIN_SLICE_ROWS, min(SLICE_ROWS, -(-total // max(1, parallelism))))
    pieces: list[tuple[RawPiece, int]] = []
    filesystem, base = location.filesystem()
    for file in sorted(files, key=lambda file: (file.min_seq or 0, file.path)):
        groups = []
        if file.rows > target:
            metadata = pq.ParquetFile(_lake_path(base, file.path), filesystem=filesystem).metadata
            groups = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
        if len(groups) < 2:
            pieces.append((RawPiece(file.path, None), file.rows))
            continue
        start, rows = 0, 0
        for index, count in enumerate(groups):
            rows += count
            if rows >= target or index == len(groups) - 1:
                pieces.append((RawPiece(file.path, tuple(range(start, index + 1))), rows))
                start, rows = index + 1, 0
    slices: list[RawSlice] = []
    current: list[RawPiece] = []
    rows = 0
    for piece, count in pieces:
        current.append(piece)
        rows += count
        if rows >= target:
            slices.append(tuple(current))
            current, rows = [], 0
    if current:
        slices.append(tuple(current))
    return slices


def _lake_path(base: str, path: str) -> str:
    return f"{base}/{path}" if base else path


def read_slice(
    location: LakeLocation, raw_slice: RawSlice, row_filter: pc.Expression, columns: list[str] = RAW_COLUMNS
) -> pa.Table:
    """The rows of ``raw_slice`` that pass ``row_filter``, in plain types (a file a delta-rs DELETE
    rewrote holds ``string_view``)."""
    filesystem, base = location.filesystem()
    parts = []
    for piece in raw_slice:
        file = pq.ParquetFile(_lake_path(base, piece.path), filesystem=filesystem)
        rows = (
            file.read(columns)
            if piece.row_groups is None
            else file.read_row_groups(piece.row_groups, columns)
        )
        parts.append(plain(rows).filter(row_filter))
    return pa.concat_tables(parts, promote_options="permissive")


def ipc_bytes(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def stored_layout(
    table: DeltaTable | None,
    metadata_columns: tuple[tuple[str, columns.ColumnType], ...],
    sanitize_field_names: bool,
    reserved_names: tuple[str, ...] = (),
) -> TableLayout:
    """The layout a table was written with (its schema's type metadata), or a new table's."""
    if table is None:
        return TableLayout(metadata_columns, reserved_names, sanitize_field_names)
    schema = pa.schema(table.schema().to_arrow())
    return TableLayout.from_arrow(schema, metadata_columns, reserved_names, sanitize_field_names)


def _position_after(left: str, right: str) -> str:
    """SQL: ``left``'s position is after ``right``'s."""
    return (
        f"({left}.__cluster_time > {right}.__cluster_time OR ({left}.__cluster_time = {right}.__cluster_time "
        f"AND {left}.__event_order > {right}.__event_order))"
    )


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _collection_operations(rows: pa.Table) -> pa.ChunkedArray:
    """Which raw rows are a drop or rename of the collection (no document)."""
    return pc.fill_null(pc.is_in(rows.column("op"), pa.array(sorted(lake.COLLECTION_OPERATIONS))), False)


# -- per slice, in Spark's executors ------------------------------------------------------------


class Output(NamedTuple):
    """What a task wrote for one table: its files, and what its rows needed of the table's layout."""

    files: tuple[DataFile, ...]
    survey: columns.BatchTypes


@dataclass(frozen=True)
class TableSpec:
    """How a task writes rows of one table."""

    layout: TableLayout  # the stored layout: a task's rows evolve it (survey), or ...
    forced: bool  # ... are written in it as it is (a second try whose rows must fit it)
    directory: str  # where the files go, under the lake root (the table's, or a staging directory)


@dataclass(frozen=True)
class StateSpec(TableSpec):
    window: BatchWindow = BatchWindow({})
    with_flag: bool = False  # MERGE source rows (deletions flagged), or live rows only (a new table)
    manifests: tuple[SnapshotManifest, ...] = ()
    drops: tuple[tuple[tuple[int, str], str], ...] = ()


@dataclass(frozen=True)
class ChangesSpec(TableSpec):
    window: BatchWindow = BatchWindow({})
    options: FlatteningOptions = FlatteningOptions()


def plan_slice(location: LakeLocation, raw_slice: RawSlice, window: BatchWindow) -> tuple[bytes, list, int]:
    """A slice's state events in brief: (Arrow IPC of each document event's ``__key`` and whether it
    is an update without ``after``, the drops and renames as (position, rs), its rows in all)."""
    rows = read_slice(location, raw_slice, window.filter())
    collection = _collection_operations(rows)
    drops = [
        ((row["cluster_time"], row["event_order"]), row["source"]["rs"])
        for row in rows.filter(collection).select(["cluster_time", "event_order", "source"]).to_pylist()
    ]
    keyed = rows.filter(pc.and_(pc.invert(collection), pc.is_valid(rows.column("op"))))
    keys, _ = event_keys(keyed.column("key"))
    partial = pc.and_(
        pc.and_(pc.equal(keyed.column("op"), "u"), pc.is_null(keyed.column("after"))),
        pc.is_valid(keyed.column("updateDescription")),
    )
    return ipc_bytes(pa.table({"__key": keys, "partial": partial})), drops, rows.num_rows


def transform_slice(
    location: LakeLocation,
    raw_slice: RawSlice,
    state: StateSpec | None,
    changes: ChangesSpec | None,
    folded_keys: frozenset[str],
    markers: dict[str, DocumentVersion],
) -> tuple[Output | None, list[tuple], Output | None]:
    """One slice's state rows (documents with one event in the window; the others are folded apart,
    ``folded_keys``), deletion marker rows and change rows, each table's written to files: every
    document is decoded once for both tables."""
    windows = [spec.window.filter() for spec in (state, changes) if spec is not None]
    row_filter = windows[0] if len(windows) == 1 else windows[0] | windows[1]
    before_images = changes is not None and delete_rows_hold_before_images(changes.options)
    columns_read = RAW_COLUMNS + ["before"] if before_images else RAW_COLUMNS
    rows = read_slice(location, raw_slice, row_filter, columns_read).sort_by(
        [("cluster_time", "ascending"), ("event_order", "ascending")]  # files in oplog order
    )
    ops = rows.column("op").to_pylist()
    after_column = rows.column("after").combine_chunks()
    afters = after_column.to_pylist()
    none = pc.fill_null(pa.nulls(rows.num_rows, pa.bool_()), False)
    in_changes = changes.window.mask(rows) if changes is not None else none
    single = none
    keys = ids = None
    if state is not None:
        keys, ids = event_keys(rows.column("key"))
        single = pc.and_(
            pc.and_(state.window.mask(rows), pc.invert(_collection_operations(rows))),
            pc.invert(pc.is_in(keys, pa.array(sorted(folded_keys), pa.string()))),
        )
    # each row's whole document where a table takes one: its after, or a change row's before-image
    documents: list[dict | None] = [None] * rows.num_rows
    deletes = pc.fill_null(pc.equal(rows.column("op"), "d"), False)
    wanted = [(after_column, pc.and_(pc.or_(in_changes, single), pc.invert(deletes)))]
    if before_images:
        wanted.append((rows.column("before").combine_chunks(), pc.and_(in_changes, deletes)))
    for column, selected in wanted:
        decoded = pc.indices_nonzero(pc.and_(selected, pc.is_valid(column)))
        for index, document in zip(decoded.to_pylist(), decode_documents(column.take(decoded)), strict=True):
            documents[index] = document
    state_output, marker_rows, state_values = None, [], None
    if state is not None:
        versions, version_documents = [], []
        # the latest position (per replica set) a manifest or drop of the run deletes documents before:
        # a snapshot's own rows sit after its manifest's position, so most rows skip both checks
        deleting: dict[str, tuple[int, str]] = {}
        for rs, position in [(m.rs, m.position) for m in state.manifests] + [
            (rs, position) for position, rs in state.drops
        ]:
            deleting[rs] = max(position, deleting.get(rs, position))
        key_list, id_list = keys.to_pylist(), ids.to_pylist()
        cluster_times = rows.column("cluster_time").to_pylist()
        orders = rows.column("event_order").to_pylist()
        replica_sets = pc.struct_field(rows.column("source").combine_chunks(), "rs").to_pylist()
        for index in pc.indices_nonzero(single).to_pylist():
            # fold_events of a document's only event: a delete, or a full document
            op, document = ops[index], documents[index]
            if op != "d" and document is None:
                continue  # a tombstone, or an update whose lookup found nothing
            version = DocumentVersion(
                key_list[index],
                id_list[index] if op == "d" else current_id_json(document, id_list[index]),
                None if op == "d" else afters[index],
                cluster_times[index],
                orders[index],
                replica_sets[index],
            )
            marker = markers.get(version.key)
            # an older event landed after the delete does not bring the document back; the marker's
            # own delete still deletes (a run made again after its markers' commit, whose state
            # commit lost a race or crashed)
            if marker is not None and version.position < marker.position:
                continue
            if version.rs in deleting and version.position < deleting[version.rs]:
                version = drop_with_collection(
                    reconcile_with_snapshots(version, state.manifests), state.drops
                )
            versions.append(version)
            version_documents.append(document if version.document is not None else None)
        state_output, marker_rows, state_values = write_state(
            location, state, versions, version_documents, markers
        )
    change_output = None
    if changes is not None:
        selected = pc.indices_nonzero(in_changes)
        events = rows if len(selected) == rows.num_rows else rows.take(selected)
        change_output = write_changes(
            location, changes, events, [documents[index] for index in selected.to_pylist()], state_values
        )
    return state_output, marker_rows, change_output


def write_state(
    location: LakeLocation,
    spec: StateSpec,
    versions: list[DocumentVersion],
    documents: list[dict | None],
    markers: dict[str, DocumentVersion],
) -> tuple[Output | None, list[tuple], columns.FieldValues | None]:
    """Write ``versions`` as state rows (``documents``: theirs, decoded); returns the output, the
    deletion marker rows (``DELETION_COLUMNS`` and whether it is a deletion) of the deleted versions
    and of those of documents with a marker, and the documents' field values (for ``write_changes``)."""
    marker_rows = [
        (v.key, v.cluster_time, v.event_order, v.rs, v.document is None)
        for v in versions
        if v.document is None or v.key in markers
    ]
    if not spec.with_flag:
        live = [index for index, version in enumerate(versions) if version.document is not None]
        versions, documents = [versions[i] for i in live], [documents[i] for i in live]
    if not versions:
        return None, marker_rows, None
    values = columns.FieldValues([document if document is not None else {} for document in documents])
    survey = columns.NO_CHANGES if spec.forced else spec.layout.survey(values)
    layout = spec.layout if spec.forced else spec.layout.evolved(survey)
    metadata = {
        "__key": pa.array([v.key for v in versions], pa.string()),
        "__id": pa.array([v.document_id_json for v in versions], pa.string()),
        "__doc": pa.array(
            [extjson.encode_str(document) if document is not None else None for document in documents],
            pa.string(),
        ),
        "__doc_bson": pa.array([v.document for v in versions], pa.binary()),
        "__cluster_time": pa.array([v.cluster_time for v in versions], pa.int64()),
        "__event_order": pa.array([v.event_order for v in versions], pa.string()),
        "__rs": pa.array([v.rs for v in versions], pa.string()),
    }
    batch = layout.record_batch(metadata, values)
    rows = pa.Table.from_batches([batch])
    if spec.with_flag:
        rows = rows.append_column(DELETED_FLAG, pa.array([d is None for d in documents], pa.bool_()))
    # sorted by key, so that the files of a table hold narrow key ranges a MERGE can skip
    file = write_data_file(location, spec.directory, rows.sort_by("__key"), STATE_STATS_COLUMNS)
    return Output((file,), survey), marker_rows, values


def write_changes(
    location: LakeLocation,
    spec: ChangesSpec,
    events: pa.Table,
    decoded: list[dict | None],
    state_values: columns.FieldValues | None = None,
) -> Output | None:
    """Write the change rows of raw ``events`` (``decoded``: their documents, as ``change_rows``
    takes them), a file per hour. ``state_values``: the state rows' field values, shared when they
    are of the same documents."""
    _, metadata, documents = change_rows(events, decoded, spec.options)
    if not documents:
        return None
    same = state_values is not None and len(state_values.documents) == len(documents)
    if same and all(a is b for a, b in zip(state_values.documents, documents, strict=True)):
        values = state_values  # a snapshot's: each field's values are extracted once
    else:
        values = columns.FieldValues(documents)
    survey = columns.NO_CHANGES if spec.forced else spec.layout.survey(values)
    layout = spec.layout if spec.forced else spec.layout.evolved(survey)
    rows = pa.Table.from_batches([layout.record_batch(metadata, values)])
    hours = _hour_partitions(metadata["__cluster_time"])
    files = []
    for hour in pc.unique(hours).to_pylist():
        part = rows.filter(pc.equal(hours, hour))
        files.append(
            write_data_file(
                location, spec.directory, part, CHANGES_STATS_COLUMNS, ((lake.HOUR_COLUMN, hour),)
            )
        )
    return Output(tuple(files), survey)


def _hour_partitions(cluster_times: pa.Array) -> pa.Array:
    """``lake.hour_partition`` of each cluster time (computed once per hour)."""
    hour_numbers = pc.divide(pc.shift_right(cluster_times, 32), 3600)
    distinct = pc.unique(hour_numbers)
    names = pa.array(
        [lake.hour_partition((number * 3600) << 32) for number in distinct.to_pylist()], pa.string()
    )
    return pc.take(names, pc.index_in(hour_numbers, distinct))


def fold_inputs(
    location: LakeLocation, raw_slice: RawSlice, window: BatchWindow, folded_keys: frozenset[str]
) -> list[tuple[str, ChangeEvent]]:
    """The events of a slice's documents whose events are folded apart, keyed by document."""
    rows = read_slice(location, raw_slice, window.filter())
    keys, _ = event_keys(rows.column("key"))
    selected = pc.and_(
        pc.and_(pc.invert(_collection_operations(rows)), pc.is_valid(rows.column("op"))),
        pc.is_in(keys, pa.array(sorted(folded_keys), pa.string())),
    )
    indices = pc.indices_nonzero(pc.fill_null(selected, False))
    events = [event_from_row(row) for row in rows.take(indices).to_pylist()]
    return list(zip(keys.take(indices).to_pylist(), events, strict=True))


# -- per collection, in the driver ------------------------------------------------------------


def settled_layout(stored: TableLayout, outputs: list[Output]) -> TableLayout:
    """The table's layout after this run: ``stored`` with what every task's rows needed."""
    return stored.evolved(reduce(lambda a, b: a.merge(b), (o.survey for o in outputs), columns.NO_CHANGES))


class CollectionTransform:
    """Brings one collection's state and changes tables up to the committed raw batches."""

    def __init__(
        self,
        context: SparkContext,
        source_lake: SourceLake,
        namespace: str,
        batches: list[Batch],
        flattening: FlatteningOptions,
        rebuild_hours: tuple[str, ...],
    ) -> None:
        self.context = context
        self.source_lake = source_lake
        self.location = source_lake.location
        self.options = source_lake.options
        self.namespace = namespace
        db, _, collection = namespace.partition(".")
        self.batches = batches
        self.committed: dict[str, int] = {}
        for batch in batches:
            self.committed[batch.rs] = max(batch.seq, self.committed.get(batch.rs, 0))
        manifests = [batch.manifest for batch in batches if batch.manifest is not None]
        self.manifests = [m for m in manifests if namespace in m.collections]
        self.flattening = flattening
        self.rebuild_hours = rebuild_hours
        self.raw_path = lake.table_path("raw", source_lake.prefix, db, collection)
        self.state_path = lake.table_path("state", source_lake.prefix, db, collection)
        self.changes_path = lake.table_path("changes", source_lake.prefix, db, collection)
        self.raw_uri = lake.table_uri(self.location, "raw", source_lake.prefix, db, collection)
        self.state_uri = lake.table_uri(self.location, "state", source_lake.prefix, db, collection)
        self.deletions_uri = lake.deletions_uri(self.location, source_lake.prefix, db, collection)
        self.changes_uri = lake.table_uri(self.location, "changes", source_lake.prefix, db, collection)
        raw = table_if_exists(self.raw_uri, self.options)
        self.files = raw_files(raw, self.raw_path) if raw is not None else []
        # MERGE sources and rebuilt tables are written here first (never read as the tables' data)
        self.staging = f"{self.state_path}/{STAGING_DIR}/{uuid.uuid4()}"

    def run(self, maintenance: dict[str, int] | None) -> dict[str, Any]:
        summary = self.converged()
        if maintenance is not None:
            summary["maintenance"] = self.maintain(maintenance)
        return summary

    def converged(self) -> dict[str, Any]:
        """``update``, made again from a fresh read of the batch log and the tables each time it lost a
        commit race to another writer of the collection's tables (a backfill run's transform beside a
        live run's, say), at most COMMIT_RACE_ATTEMPTS times in all.

        Every commit of a run carries the tables' app transactions (``commit_properties``), so of two
        runs committing to one table from the same read, Delta's conflict check fails the later one;
        and a table read is refused when a run with a newer batch log already applied more (``read``).
        The fresh read then shows what the winner applied, and the run applies the rest: no batch is
        applied twice, none is skipped."""
        transform = self
        for attempt in range(1, COMMIT_RACE_ATTEMPTS + 1):
            try:
                return transform.update()
            except (CommitFailedError, LostCommitRace) as race:
                lost = race
            finally:
                delete_directory(transform.location, transform.staging)
            if attempt < COMMIT_RACE_ATTEMPTS:
                log.warning(
                    "%s: lost a commit race to another writer of its tables (%s); running it again from a "
                    "fresh read of the batch log and the tables (attempt %d of %d)",
                    self.namespace, lost, attempt + 1, COMMIT_RACE_ATTEMPTS,
                )  # fmt: skip
                transform = transform.again()
        raise LostCommitRace(
            f"{self.namespace}: lost {COMMIT_RACE_ATTEMPTS} commit races in a row to other writers of its "
            f"tables (is more than one transform of this source running?); the last: {lost}"
        ) from lost

    def again(self) -> CollectionTransform:
        """This collection's transform from a fresh read of the batch log, raw files and tables."""
        return CollectionTransform(
            self.context,
            self.source_lake,
            self.namespace,
            self.source_lake.batches(),
            self.flattening,
            self.rebuild_hours,
        )

    def maintain(self, settings: dict[str, int]) -> dict[str, Any]:
        """Compact small files and vacuum versions past the retention, table by table."""
        now = dt.datetime.now(dt.timezone.utc)
        done = {}
        for name, uri in (
            ("raw", self.raw_uri),
            ("changes", self.changes_uri),
            ("state", self.state_uri),
            ("deletions", self.deletions_uri),
        ):
            if table_if_exists(uri, self.options) is not None:
                done[name] = maintain_table(
                    uri, self.options, settings["optimize_interval_hours"], settings["retention_hours"], now
                )
        return done

    def applied(self, table: DeltaTable | None, name: str) -> dict[str, int]:
        return applied_batches(table, name, self.committed)

    def read(self, name: str) -> DeltaTable | None:
        """The ``state`` or ``changes`` table as it is now. LostCommitRace if it has applied batches past
        this run's batch log: a run that read a newer log committed first, and a commit of this run's
        view would record older batches as applied (applied again, their change rows would double)."""
        table = table_if_exists(self.state_uri if name == "state" else self.changes_uri, self.options)
        ahead = {rs: seq for rs, seq in self.applied(table, name).items() if seq > self.committed[rs]}
        if ahead:
            raise LostCommitRace(
                f"its {name} table has applied batches {ahead}, past this run's batch log {self.committed}"
            )
        return table

    def commit_properties(self, name: str, versions: dict[str, int] | None = None) -> CommitProperties:
        """The commit's app transactions: this table has applied every committed batch (``versions``:
        the batches it had applied when read, for a commit that applies none). ``name``'s app ids are
        in every commit of a run to that table, so Delta fails the later of two made from one read."""
        return CommitProperties(
            app_transactions=[
                Transaction(applied_app_id(name, rs), seq)
                for rs, seq in (self.committed if versions is None else versions).items()
            ],
            max_commit_retries=COMMIT_RETRIES,
        )

    def slices(self, windows: list[BatchWindow], files: list[RawFile] | None = None) -> list[RawSlice]:
        chosen = [
            file
            for file in (self.files if files is None else files)
            if any(window.may_hold(file.min_seq, file.max_seq) for window in windows)
        ]
        return raw_slices(self.location, chosen, self.context.defaultParallelism)

    def run_slices(self, slices: list[RawSlice], task: Callable[[RawSlice], Any]) -> list[Any]:
        """``task`` of each slice, one Spark task each; the results in slice order."""
        if not slices:
            return []
        return self.context.parallelize(slices, len(slices)).map(task).collect()

    # -- both tables ---------------------------------------------------------------------

    def update(self) -> dict[str, Any]:
        state_table = self.read("state")
        state_applied = self.applied(state_table, "state")
        state_window = BatchWindow.of(self.batches, self.namespace, state_applied)
        # a copy that found no document (an empty collection renamed over this one) lands no rows
        # here, yet its manifest still deletes the stored documents it did not find
        manifest_pending = state_table is not None and any(
            m.seq > state_applied.get(m.rs, 0) for m in self.manifests
        )
        changes_table = self.read("changes")
        rebuilt = (
            changes_table is not None and _recorded_flattening(changes_table) != self.flattening.to_json()
        )
        if rebuilt:
            log.warning(
                "%s: other flattening options than the changes table's: rebuilding it", self.namespace
            )
        changes_window = BatchWindow.of(
            self.batches, self.namespace, {} if rebuilt else self.applied(changes_table, "changes")
        )
        state = (
            None
            if state_window.is_empty and not manifest_pending
            else StateRun(self, state_table, state_window)
        )
        changes = (
            None
            if changes_window.is_empty
            else ChangesRun(self, None if rebuilt else changes_table, rebuilt, changes_window)
        )
        windows = [run.window for run in (state, changes) if run is not None]
        slices = self.slices(windows) if windows else []
        if state is not None:
            state.plan(slices)
        state_spec = state.spec() if state is not None else None
        changes_spec = changes.spec() if changes is not None else None
        location = self.location
        folded = self.context.broadcast(state.folded_keys if state is not None else frozenset())
        markers = self.context.broadcast(state.markers if state is not None else {})
        started = time.monotonic()
        outputs = self.run_slices(
            slices,
            lambda raw_slice: transform_slice(
                location, raw_slice, state_spec, changes_spec, folded.value, markers.value
            ),
        )
        log.info(
            "%s: %d slices transformed in %.1fs", self.namespace, len(slices), time.monotonic() - started
        )
        summary: dict[str, Any] = {}
        if state is not None:
            summary.update(state.finish(slices, [(s, m) for s, m, _ in outputs]))
        else:
            summary.update(new_events=0, state_rows=row_count(state_table))
        written = 0
        if changes is not None:
            written = changes.finish(slices, [c for _, _, c in outputs])
            changes_table = self.read("changes")
        if self.rebuild_hours and changes_table is not None:
            every = BatchWindow.of(self.batches, self.namespace, include_history=True)
            written += ChangesRun(self, changes_table, False, every).rebuild(set(self.rebuild_hours))
            changes_table = table_if_exists(self.changes_uri, self.options)
        summary.update(
            change_rows=row_count(changes_table), change_rows_written=written, changes_rebuilt=rebuilt
        )
        return summary


class StateRun:
    """One run's update of a collection's state table (and its deletion markers)."""

    def __init__(self, transform: CollectionTransform, table: DeltaTable | None, window: BatchWindow) -> None:
        self.transform = transform
        self.table = table
        self.window = window
        applied = transform.applied(table, "state")
        self.manifests = tuple(
            m for m in transform.manifests if applied.get(m.rs, 0) < m.seq <= transform.committed.get(m.rs, 0)
        )
        self.layout = stored_layout(table, STATE_METADATA_COLUMNS, transform.flattening.sanitize_field_names)
        self.deletions = table_if_exists(transform.deletions_uri, transform.options)
        # a new table is written where it lives; a MERGE's source is staged first
        self.directory = transform.state_path if table is None else f"{transform.staging}/state"
        self.new_events = 0
        self.drops: tuple[tuple[tuple[int, str], str], ...] = ()
        self.folded_keys: frozenset[str] = frozenset()
        self.markers: dict[str, DocumentVersion] = {}
        self.stored: dict[str, DocumentVersion] = {}

    def spec(self, layout: TableLayout | None = None) -> StateSpec:
        return StateSpec(
            layout or self.layout,
            layout is not None,
            self.directory,
            self.window,
            self.table is not None,
            self.manifests,
            self.drops,
        )

    def plan(self, slices: list[RawSlice]) -> None:
        """Which documents' events are folded apart (more than one event, or an update without
        ``after``), the run's drops, the deletion markers and stored versions the run needs."""
        location, window, started = self.transform.location, self.window, time.monotonic()
        planned = self.transform.run_slices(slices, lambda raw_slice: plan_slice(location, raw_slice, window))
        self.new_events = sum(count for _, _, count in planned)
        self.drops = tuple(sorted(drop for _, drops, _ in planned for drop in drops))
        events = pa.concat_tables([from_ipc(data) for data, _, _ in planned]) if planned else None
        if events is None or events.num_rows == 0:
            return
        counts = pc.value_counts(events.column("__key"))
        repeated = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
        partial = pc.unique(pc.filter(events.column("__key"), events.column("partial")))
        self.folded_keys = frozenset(repeated.to_pylist()) | frozenset(partial.to_pylist())
        # a deleted document's position stops an older event, landed later (by another shard, say),
        # from bringing it back: its deletion marker is its previous version
        self.markers = _deletion_markers(self.deletions, counts.field("values"))
        # an update without the full document applies to the stored version: load just those
        self.stored = _stored_versions(self.table, partial.to_pylist())
        log.info(
            "%s: %d new events, %d documents folded apart, %d markers (%.1fs)",
            self.transform.namespace, self.new_events, len(self.folded_keys), len(self.markers),
            time.monotonic() - started,
        )  # fmt: skip

    def fold(
        self, slices: list[RawSlice], layout: TableLayout | None = None
    ) -> list[tuple[Output | None, list]]:
        """The documents folded apart: their events grouped by document (Spark's shuffle), folded
        with their stored version or marker, and written."""
        if not self.folded_keys:
            return []
        context, location, window = self.transform.context, self.transform.location, self.window
        keys = context.broadcast(self.folded_keys)
        stored = context.broadcast({**self.markers, **self.stored})
        markers = context.broadcast(self.markers)
        manifests, drops, spec = self.manifests, self.drops, self.spec(layout)

        def fold(item: tuple[str, Any]) -> DocumentVersion | None:
            key, document_events = item
            version = fold_events(key, stored.value.get(key), document_events)
            if version is None:
                return None
            return drop_with_collection(reconcile_with_snapshots(version, manifests), drops)

        partitions = max(1, min(context.defaultParallelism, -(-len(self.folded_keys) // SLICE_ROWS)))
        events = context.parallelize(slices, len(slices)).flatMap(
            lambda raw_slice: fold_inputs(location, raw_slice, window, keys.value)
        )
        versions = events.groupByKey(partitions).map(fold).filter(lambda version: version is not None)

        def write(part: Iterator[DocumentVersion]) -> list[tuple[Output | None, list]]:
            folded = list(part)
            documents = [
                bson.decode(v.document, DECODE_OPTIONS) if v.document is not None else None for v in folded
            ]
            return [write_state(location, spec, folded, documents, markers.value)[:2]]

        return versions.mapPartitions(write).collect()

    def finish(self, slices: list[RawSlice], outputs: list[tuple[Output | None, list]]) -> dict[str, Any]:
        outputs = outputs + self.fold(slices)
        written = [output for output, _ in outputs if output is not None]
        layout = settled_layout(self.layout, written)
        misfits = [
            i for i, (output, _) in enumerate(outputs) if output is not None and not self.fits(output, layout)
        ]
        if misfits:
            # tasks' rows took other types for a new field: write them again, in the settled layout
            log.info("%s: writing the state rows of %d tasks again", self.transform.namespace, len(misfits))
            for output, _ in outputs:
                if output is not None:
                    delete_data_files(self.transform.location, self.directory, output.files)
            outputs = self.rewritten(slices, layout)
            written = [output for output, _ in outputs if output is not None]
        files = [file for output in written for file in output.files]
        # markers first: applying the same versions again after a crash gives the same markers
        self.update_deletion_markers([row for _, rows in outputs for row in rows])
        if self.table is None:
            with _creating(self.transform.state_uri, self.transform.options):
                create_table_with_add_actions(
                    self.transform.state_uri,
                    Schema.from_arrow(layout.schema),
                    add_actions(files),
                    mode="error",
                    storage_options=self.transform.options,
                    commit_properties=self.transform.commit_properties("state"),
                )
        else:
            self.merge(layout, files)
        return {
            "new_events": self.new_events,
            "state_rows": row_count(table_if_exists(self.transform.state_uri, self.transform.options)),
        }

    def fits(self, output: Output, layout: TableLayout) -> bool:
        return self.layout.reads_as(output.survey, layout)

    def rewritten(self, slices: list[RawSlice], layout: TableLayout) -> list[tuple[Output | None, list]]:
        """Every state row of the run written again, in ``layout``."""
        location, spec = self.transform.location, self.spec(layout)
        folded, markers = self.folded_keys, self.markers
        outputs = self.transform.run_slices(
            slices, lambda raw_slice: transform_slice(location, raw_slice, spec, None, folded, markers)
        )
        return [(output, rows) for output, rows, _ in outputs] + self.fold(slices, layout)

    def update_deletion_markers(self, rows: list[tuple]) -> None:
        """Record the run's deletions; drop the markers of documents that live again."""
        if not rows:
            return
        source = pa.table(
            {
                name: pa.array(values)
                for name, values in zip(
                    [*DELETION_COLUMNS, DELETED_FLAG], zip(*rows, strict=True), strict=True
                )
            }
        )
        # the markers' app ids make a concurrent run's MERGE of the same markers fail, not insert twice
        properties = self.transform.commit_properties("deletions")
        if self.deletions is None:
            deletions = source.filter(pc.field(DELETED_FLAG)).drop_columns([DELETED_FLAG])
            with _creating(self.transform.deletions_uri, self.transform.options):
                write_deltalake(
                    self.transform.deletions_uri,
                    deletions,
                    mode="error",
                    storage_options=self.transform.options,
                    commit_properties=properties,
                )
            return
        newer = _position_after("s", "t")
        (
            self.deletions.merge(
                source,
                predicate="t.__key = s.__key",
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
            )
            .when_matched_delete(predicate=f"NOT s.{DELETED_FLAG} AND {newer}")
            .when_matched_update_all(predicate=f"s.{DELETED_FLAG} AND {newer}", except_cols=[DELETED_FLAG])
            .when_not_matched_insert_all(predicate=f"s.{DELETED_FLAG}", except_cols=[DELETED_FLAG])
            .execute()
        )

    def merge(self, layout: TableLayout, files: list[DataFile]) -> None:
        """MERGE the staged rows into the table in one commit."""
        assert self.table is not None
        schema = layout.schema.append(pa.field(DELETED_FLAG, pa.bool_()))
        source = staged_rows(self.transform.location, self.directory, files, schema)
        in_memory = sum(file.rows for file in files) <= MERGE_IN_MEMORY_ROWS
        if in_memory:  # delta-rs then reads only the files whose key range may hold a source key
            source = source.read_all()
        merger = self.table.merge(
            source,
            predicate="t.__key = s.__key",
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            streamed_exec=not in_memory,
            commit_properties=self.transform.commit_properties("state"),
        )
        newer = _position_after("s", "t")
        merger = merger.when_matched_delete(predicate=f"s.{DELETED_FLAG} AND {newer}")
        merger = merger.when_matched_update_all(
            predicate=f"NOT s.{DELETED_FLAG} AND {newer}", except_cols=[DELETED_FLAG]
        )
        merger = merger.when_not_matched_insert_all(
            predicate=f"NOT s.{DELETED_FLAG}", except_cols=[DELETED_FLAG]
        )
        # documents the new batches did not touch: gone if a snapshot missed them or a drop came after
        gone = [f"(t.__rs = {_sql(m.rs)} AND t.__cluster_time < {m.cluster_time})" for m in self.manifests]
        gone += [
            f"(t.__rs = {_sql(rs)} AND (t.__cluster_time < {ct} OR (t.__cluster_time = {ct} "
            f"AND t.__event_order < {_sql(order)})))"
            for (ct, order), rs in self.drops
        ]
        if gone:
            merger = merger.when_not_matched_by_source_delete(predicate=" OR ".join(gone))
        metrics = merger.execute()
        log.info("%s state merge: %s", self.transform.namespace, metrics)


@contextlib.contextmanager
def _creating(uri: str, options: dict[str, str]) -> Iterator[None]:
    """Around the creation of a table the run found missing: LostCommitRace if another writer created
    it since."""
    try:
        yield
    except DeltaError as error:
        if isinstance(error, CommitFailedError) or table_if_exists(uri, options) is None:
            raise
        raise LostCommitRace(f"{uri} was created by another writer since this run read it") from error


def staged_rows(
    location: LakeLocation, directory: str, files: list[DataFile], schema: pa.Schema
) -> pa.RecordBatchReader:
    """The rows of staged ``files``, one file at a time, as rows of ``schema`` (``widened``)."""
    filesystem, base = location.filesystem()

    def batches() -> Iterator[pa.RecordBatch]:
        for file in files:
            path = _lake_path(base, f"{directory}/{file.path}")
            rows = pq.read_table(path, filesystem=filesystem)
            for column, value in file.partition:
                rows = rows.append_column(column, pa.array([value] * rows.num_rows, pa.string()))
            yield from widened(rows, schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


class ChangesRun:
    """One run's appends to a collection's changes table (of the raw rows ``window`` selects), or
    its rebuild."""

    def __init__(
        self, transform: CollectionTransform, table: DeltaTable | None, rebuilt: bool, window: BatchWindow
    ) -> None:
        self.transform = transform
        self.table = table
        self.rebuilt = rebuilt
        self.window = window
        options = transform.flattening
        self.layout = stored_layout(
            table, options.metadata_columns, options.sanitize_field_names, (lake.HOUR_COLUMN,)
        )

    def spec(self, layout: TableLayout | None = None, staged: bool = False) -> ChangesSpec:
        """How tasks write the rows (``layout``: in it as it is; ``staged``: before a rewrite)."""
        transform = self.transform
        directory = f"{transform.staging}/changes" if staged or self.rebuilt else transform.changes_path
        return ChangesSpec(
            layout or self.layout, layout is not None, directory, self.window, transform.flattening
        )

    def schema(self, layout: TableLayout) -> pa.Schema:
        return _with_flattening(
            layout.schema.append(pa.field(lake.HOUR_COLUMN, pa.string())), self.transform.flattening
        )

    def settle(
        self, slices: list[RawSlice], outputs: list[Output | None], staged: bool
    ) -> tuple[TableLayout, list[DataFile]]:
        """The table's layout after the run, and the files of its rows in it (some written again)."""
        written = [output for output in outputs if output is not None]
        layout = settled_layout(self.layout, written)
        spec = self.spec(staged=staged)
        misfits = [
            index
            for index, output in enumerate(outputs)
            if output is not None and not self.layout.reads_as(output.survey, layout)
        ]
        if misfits:
            log.info("%s: writing the change rows of %d tasks again", self.transform.namespace, len(misfits))
            location, forced = self.transform.location, self.spec(layout, staged)
            again = self.transform.run_slices(
                [slices[index] for index in misfits],
                lambda raw_slice: transform_slice(location, raw_slice, None, forced, frozenset(), {})[2],
            )
            for index, output in zip(misfits, again, strict=True):
                delete_data_files(location, spec.directory, outputs[index].files)
                outputs[index] = output
        return layout, [file for output in outputs if output is not None for file in output.files]

    def finish(self, slices: list[RawSlice], outputs: list[Output | None]) -> int:
        """Commit the run's change rows: appended, or replacing the whole table (a rebuild)."""
        layout, files = self.settle(slices, outputs, staged=False)
        schema = self.schema(layout)
        properties = self.transform.commit_properties("changes")
        if self.rebuilt:
            write_deltalake(
                self.transform.changes_uri,
                staged_rows(self.transform.location, f"{self.transform.staging}/changes", files, schema),
                mode="overwrite",
                schema_mode="overwrite",
                partition_by=[lake.HOUR_COLUMN],
                storage_options=self.transform.options,
                commit_properties=properties,
            )
        elif self.table is None:
            with _creating(self.transform.changes_uri, self.transform.options):
                create_table_with_add_actions(
                    self.transform.changes_uri,
                    Schema.from_arrow(schema),
                    add_actions(files),
                    mode="error",
                    partition_by=[lake.HOUR_COLUMN],
                    storage_options=self.transform.options,
                    commit_properties=properties,
                )
        else:
            if layout is not self.layout:
                # new columns first (a commit of its own: Delta's add actions cannot change the schema);
                # a crash before the next commit leaves only unused columns, which the retry keeps. It
                # restates the batches applied, so that it fails after another writer's commit instead
                # of moving self.table past it (the append below would then apply those batches again)
                applied = self.transform.applied(self.table, "changes")
                write_deltalake(
                    self.table,
                    schema.empty_table(),
                    mode="append",
                    schema_mode="merge",
                    commit_properties=self.transform.commit_properties("changes", applied),
                )
            self.table.create_write_transaction(
                add_actions(files),
                mode="append",
                schema=schema,
                partition_by=[lake.HOUR_COLUMN],
                commit_properties=properties,
            )
        return sum(file.rows for file in files)

    def rebuild(self, hours: set[str]) -> int:
        """Replace the rows of ``hours`` with the change rows of their raw rows and history (a backfill)."""
        assert self.table is not None
        transform = self.transform
        files = [file for file in transform.files if file.hour in hours]
        slices = transform.slices([self.window], files)
        spec, location = self.spec(staged=True), transform.location
        outputs = transform.run_slices(
            slices, lambda raw_slice: transform_slice(location, raw_slice, None, spec, frozenset(), {})[2]
        )
        layout, written = self.settle(slices, outputs, staged=True)
        schema = self.schema(layout)
        listed = ", ".join(_sql(hour) for hour in sorted(hours))
        write_deltalake(
            self.table,
            staged_rows(location, spec.directory, written, schema),
            mode="overwrite",
            predicate=f"{lake.HOUR_COLUMN} IN ({listed})",
            schema_mode="merge",
            commit_properties=transform.commit_properties("changes"),
        )
        return sum(file.rows for file in written)


def _stored_versions(table: DeltaTable | None, keys: list[str]) -> dict[str, DocumentVersion]:
    """The stored versions of ``keys`` (documents an update without ``after`` applies to)."""
    if table is None or not keys:
        return {}
    wanted = ["__key", "__id", "__doc_bson", "__cluster_time", "__event_order", "__rs"]
    rows = read_rows(table, wanted, Where.values_in("__key", pa.array(keys, pa.string())))
    return {row["__key"]: DocumentVersion(*(row[name] for name in wanted)) for row in rows.to_pylist()}


def _deletion_markers(table: DeltaTable | None, keys: pa.Array) -> dict[str, DocumentVersion]:
    """The deletion markers of ``keys``, as versions without a document."""
    if table is None or not len(keys):
        return {}
    rows = read_rows(table, where=Where.values_in("__key", keys))
    return {
        row["__key"]: DocumentVersion(
            row["__key"], "", None, row["__cluster_time"], row["__event_order"], row["__rs"]
        )
        for row in rows.to_pylist()
    }


def _with_flattening(schema: pa.Schema, options: FlatteningOptions) -> pa.Schema:
    index = schema.get_field_index(lake.HOUR_COLUMN)
    field = schema.field(index).with_metadata(
        {FLATTENING_METADATA: json.dumps(options.to_json(), sort_keys=True)}
    )
    return schema.set(index, field)


def _recorded_flattening(table: DeltaTable) -> dict[str, Any]:
    """The flattening options the changes table was written with (defaults where none are recorded)."""
    field = pa.schema(table.schema().to_arrow()).field(lake.HOUR_COLUMN)
    recorded = (field.metadata or {}).get(FLATTENING_METADATA.encode())
    return json.loads(recorded) if recorded else FlatteningOptions().to_json()


def main(argv: list[str] | None = None, context: SparkContext | None = None) -> int:
    """The job; ``context``: a caller's SparkContext to run on, left running (by default the job
    starts its own and stops it)."""
    args = parse_args(argv)
    # force: pyspark installs a root handler on stdout, where only the summary may go.
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s", force=True
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    source_lake = SourceLake(LakeLocation.from_env(args.lake_root), args.topic_prefix)
    refuse_legacy_layout(source_lake.location, args.topic_prefix)
    batches = source_lake.batches()
    namespaces = sorted({ns for batch in batches for ns in (*batch.namespaces, *(batch.collections or ()))})
    own_context = context is None
    context = start_spark() if context is None else context
    summary: dict[str, Any] = {}
    failed: dict[str, dict[str, Any]] = {}
    try:
        for namespace in namespaces:
            log.info("transforming %s", namespace)
            try:
                transform = CollectionTransform(
                    context, source_lake, namespace, batches, args.flattening, args.rebuild_hours
                )
                summary[namespace] = transform.run(args.maintain)
            except Exception as error:  # one collection's failure holds back no other collection
                behind = collection_backlog(source_lake, namespace, batches).batches
                log.exception("FAILED: %s; the other collections carry on", behind_text({namespace: behind}))
                failed[namespace] = {"error": _error_line(error), "batches_behind": behind}
    finally:
        if own_context:
            context.stop()
    if failed:  # before the summary: spark-submit passes the driver's stderr on in its stdout
        stuck = behind_text({namespace: failure["batches_behind"] for namespace, failure in failed.items()})
        sys.stderr.write(
            f"cdc_transform: the transform failed for {stuck}; the other collections landed. Each one's "
            "error and traceback are in the log above (search for 'FAILED'): fix its cause and the next "
            "run catches it up\n"
        )
        sys.stderr.flush()
    print(json.dumps({"collections": summary, "failed": failed}, sort_keys=True), flush=True)
    return 1 if failed else 0


def _error_line(error: Exception) -> str:
    """The error's type and the first line of its message (Spark's run to whole Java stack traces)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:500]}" if lines else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
