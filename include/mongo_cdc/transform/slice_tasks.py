"""What each Spark task does with its raw slice: the executor side of the transform.

* ``plan_slice``: a slice's state events in brief (``SlicePlan``), for the driver to choose the
  documents whose events are folded apart;
* ``transform_slice``: a slice's state rows and change rows, each document decoded once for both
  tables, written as data files under the tables' directories (``write_state``, ``write_changes``);
  the task hands the driver only the files and what its rows need of each table's layout
  (``SliceOutput``);
* ``fold_inputs``: the events of the documents folded apart, keyed by document, for Spark's shuffle.

Runs on the executors, which have only pyarrow, orjson and bson: no pyspark or deltalake import
here. The driver's side is ``transform.driver``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc import extjson, lake
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform import columns
from mongo_cdc.transform.data_files import DataFile, write_data_file
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    current_id_json,
    drop_with_collection,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.flatten import change_rows, delete_rows_hold_before_images
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_events import (
    RAW_COLUMNS,
    ChangeEvent,
    decode_documents,
    event_from_row,
    event_keys,
)
from mongo_cdc.transform.slices import RawSlice, collection_operations, ipc_bytes, read_slice
from mongo_cdc.transform.table_layout import TableLayout

# The deletion markers' columns (lake.deletions_uri): a deleted document's last position.
DELETION_COLUMNS = ("__key", "__cluster_time", "__event_order", "__rs")
# A MERGE source row's deletion flag: never a column of the table.
DELETED_FLAG = "__merge_deleted"
# Columns with file statistics (min/max/null count) in the data files the job writes.
STATE_STATS_COLUMNS = ("__key", "__cluster_time", "__event_order", "__rs")
CHANGES_STATS_COLUMNS = ("__cluster_time", "__event_order")


class Output(NamedTuple):
    """What a task wrote for one table: its files, and what its rows needed of the table's layout."""

    files: tuple[DataFile, ...]
    survey: columns.BatchTypes


class StateOutput(NamedTuple):
    """What a task wrote of the state table (None: no rows) and the deletion marker rows of its
    versions (``write_state``)."""

    output: Output | None
    marker_rows: list[tuple]


class SliceOutput(NamedTuple):
    """What ``transform_slice`` wrote of each table."""

    state: StateOutput
    changes: Output | None


class SlicePlan(NamedTuple):
    """A slice's state events in brief (``plan_slice``)."""

    events: bytes  # Arrow IPC: each document event's ``__key``, and ``partial``: an update without ``after``
    drops: list[tuple[tuple[int, str], str]]  # the drops and renames of the collection, as (position, rs)
    rows: int  # the slice's rows in the run's window


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


def plan_slice(location: LakeLocation, raw_slice: RawSlice, window: BatchWindow) -> SlicePlan:
    """A slice's state events in brief: each document event's key and whether it is an update
    without ``after``, the drops and renames, its rows in all."""
    rows = read_slice(location, raw_slice, window.filter())
    collection = collection_operations(rows)
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
    return SlicePlan(ipc_bytes(pa.table({"__key": keys, "partial": partial})), drops, rows.num_rows)


def transform_slice(
    location: LakeLocation,
    raw_slice: RawSlice,
    state: StateSpec | None,
    changes: ChangesSpec | None,
    folded_keys: frozenset[str],
    markers: dict[str, DocumentVersion],
) -> SliceOutput:
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
            pc.and_(state.window.mask(rows), pc.invert(collection_operations(rows))),
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
    state_output, state_values = StateOutput(None, []), None
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
        state_output, state_values = write_state(location, state, versions, version_documents, markers)
    change_output = None
    if changes is not None:
        selected = pc.indices_nonzero(in_changes)
        events = rows if len(selected) == rows.num_rows else rows.take(selected)
        change_output = write_changes(
            location, changes, events, [documents[index] for index in selected.to_pylist()], state_values
        )
    return SliceOutput(state_output, change_output)


def write_state(
    location: LakeLocation,
    spec: StateSpec,
    versions: list[DocumentVersion],
    documents: list[dict | None],
    markers: dict[str, DocumentVersion],
) -> tuple[StateOutput, columns.FieldValues | None]:
    """Write ``versions`` as state rows (``documents``: theirs, decoded); returns the output with the
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
        return StateOutput(None, marker_rows), None
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
    return StateOutput(Output((file,), survey), marker_rows), values


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
    hours = hour_partitions(metadata["__cluster_time"])
    files = []
    for hour in pc.unique(hours).to_pylist():
        part = rows.filter(pc.equal(hours, hour))
        files.append(
            write_data_file(
                location, spec.directory, part, CHANGES_STATS_COLUMNS, ((lake.HOUR_COLUMN, hour),)
            )
        )
    return Output(tuple(files), survey)


def hour_partitions(cluster_times: pa.Array) -> pa.Array:
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
        pc.and_(pc.invert(collection_operations(rows)), pc.is_valid(rows.column("op"))),
        pc.is_in(keys, pa.array(sorted(folded_keys), pa.string())),
    )
    indices = pc.indices_nonzero(pc.fill_null(selected, False))
    events = [event_from_row(row) for row in rows.take(indices).to_pylist()]
    return list(zip(keys.take(indices).to_pylist(), events, strict=True))
