"""What each Spark task does with its raw slice: the executor side of the transform.

* ``plan_slice``: a slice's rows in the run, its drops and its keys' ranges (``SlicePlan``), for the
  driver;
* ``transform_slice``: a slice's state rows and change rows, each document decoded once for both
  tables, written as data files under the tables' directories (``write_state``, ``write_changes``),
  with the deletion marker rows of the slice's documents (``write_markers``); the task hands the
  driver only the files and what its rows need of each table's layout (``SliceOutput``);
* ``fold_inputs``: the events of the documents folded apart, keyed by document, for Spark's shuffle;
* ``fold_documents``: their versions folded with the stored version or deletion marker each task
  reads of its own documents (``transform.stored_rows``), and written.

What the driver hands a task and a task hands back is ``transform.task_contract``; the tables' own
columns, ``transform.table_formats``. ``transform.whole_collection`` runs them all in one task for a
small collection.

Runs on the executors, which have only pyarrow, orjson and bson (numpy too where it is installed:
the fast path, ``transform.split_values``): no pyspark or deltalake import here. The driver's side is
``transform.driver``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc import extjson, lake
from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform import column_survey
from mongo_cdc.transform.data_files import DataFile, write_data_file
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    drop_with_collection,
    fold_events,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.flatten import changes_table_rows, delete_rows_hold_before_images
from mongo_cdc.transform.folded_keys import KeyRange, key_ranges, ranges_disjoint
from mongo_cdc.transform.raw_events import (
    RAW_COLUMNS,
    ChangeEvent,
    RowDocuments,
    as_dict,
    event_from_row,
    event_keys,
)
from mongo_cdc.transform.raw_slices import (
    RawSlice,
    collection_operations,
    concat_pieces,
    read_pieces,
    read_slice,
)
from mongo_cdc.transform.stored_rows import KeyedFile, deletion_markers, stored_versions
from mongo_cdc.transform.table_formats import (
    DELETED_FLAG,
    DELETION_SCHEMA,
    PER_DOCUMENT_COLUMNS,
    staged_schema,
)
from mongo_cdc.transform.table_layout import TableLayout
from mongo_cdc.transform.task_contract import (
    ChangesSpec,
    Output,
    SliceOutput,
    SlicePlan,
    StateOutput,
    StateSpec,
)
from mongo_cdc.transform.versions import single_event_versions, versions_table

try:  # the fast path needs numpy; executors without it take the lossless path
    from mongo_cdc.transform.split_values import SplitValues, split_documents
except ImportError:
    SplitValues, split_documents = column_survey.FieldValues, None

# Below this many rows, a table's rows take the lossless path (``field_values``): the fast path's
# fixed cost (its census passes, ~4-5 ms of CPU a slice) is more than decoding a few dozen documents,
# and a source of many small collections is mostly slices of a few changes. Both paths give the
# same rows (tests/unit/test_bson_columns.py); small documents break even at a few hundred rows.
FAST_PATH_MIN_ROWS = 64


class StateValues(NamedTuple):
    """The state rows' field values (``field_values``) and the documents they are of."""

    values: column_survey.FieldValues | SplitValues
    documents: RowDocuments


# What ``plan_slice`` reads of the raw rows (``BatchWindow.filter`` takes source and batch_seq): not
# the documents.
PLAN_COLUMNS = ["key", "op", "source", "batch_seq", "cluster_time", "event_order"]


def plan_slice(location: LakeLocation, raw_slice: RawSlice, window: BatchWindow) -> SlicePlan:
    """A slice's state events in brief: the drops and renames, its rows in all, its pieces' key ranges."""
    return plan_pieces(read_pieces(location, raw_slice, window.filter(), PLAN_COLUMNS))


def plan_pieces(pieces: Iterable[pa.Table]) -> SlicePlan:
    """``plan_slice`` of a slice's pieces read already: each one's rows in the window."""
    drops: list[tuple[tuple[int, str], str]] = []
    count = 0
    ranges: list[KeyRange] | None = []
    for rows in pieces:
        count += rows.num_rows
        collection = collection_operations(rows)
        drops += [
            ((row["cluster_time"], row["event_order"]), row["source"]["rs"])
            for row in rows.filter(collection).select(["cluster_time", "event_order", "source"]).to_pylist()
        ]
        if ranges is None:
            continue
        keyed = rows.filter(pc.and_(pc.invert(collection), pc.is_valid(rows.column("op"))))
        if not keyed.num_rows:
            continue
        keys, _ = event_keys(keyed.column("key"))
        if pc.any(pc.equal(keyed.column("op"), "u")).as_py() or pc.count_distinct(keys).as_py() < len(keys):
            ranges = None
            continue
        ranges += key_ranges(keys)
    return SlicePlan(drops, count, None if ranges is None else tuple(ranges))


def none_folded_apart(plans: Iterable[SlicePlan]) -> bool:
    """Whether the slices of ``plans`` hold no document with more than one event, nor an update: each
    piece's keys are distinct and the pieces' ranges of keys disjoint."""
    plans = list(plans)
    return all(plan.key_ranges is not None for plan in plans) and ranges_disjoint(
        key_range for plan in plans for key_range in plan.key_ranges or ()
    )


def transform_slice(
    location: LakeLocation,
    raw_slice: RawSlice,
    state: StateSpec | None,
    changes: ChangesSpec | None,
    folded_keys: frozenset[str],
) -> SliceOutput:
    """One slice's state rows (documents with one event in the window; the others are folded apart,
    ``folded_keys``: those of this slice), deletion marker rows and change rows, each table's written
    to files: every document is decoded once for both tables."""
    rows = concat_pieces(slice_pieces(location, raw_slice, state, changes))
    return transform_rows(location, rows, state, changes, folded_keys)


def slice_pieces(
    location: LakeLocation, raw_slice: RawSlice, state: StateSpec | None, changes: ChangesSpec | None
) -> list[pa.Table]:
    """The rows of ``raw_slice`` that the tables take (in either one's window), a table per piece,
    with every column ``transform_rows`` reads."""
    windows = [spec.window.filter() for spec in (state, changes) if spec is not None]
    row_filter = windows[0] if len(windows) == 1 else windows[0] | windows[1]
    before_images = changes is not None and delete_rows_hold_before_images(changes.options)
    columns_read = RAW_COLUMNS + ["before"] if before_images else RAW_COLUMNS
    return list(read_pieces(location, raw_slice, row_filter, columns_read))


def transform_rows(
    location: LakeLocation,
    rows: pa.Table,
    state: StateSpec | None,
    changes: ChangesSpec | None,
    folded_keys: frozenset[str],
) -> SliceOutput:
    """``transform_slice`` of a slice's rows read already (``slice_pieces``)."""
    rows = in_order(rows, ["cluster_time", "event_order"])
    before_images = changes is not None and delete_rows_hold_before_images(changes.options)
    after_column = rows.column("after").combine_chunks()
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
    deletes = pc.fill_null(pc.equal(rows.column("op"), "d"), False)
    documents_bson = pc.if_else(
        pc.and_(pc.or_(in_changes, single), pc.invert(deletes)),
        after_column,
        pa.nulls(rows.num_rows, after_column.type),
    )
    if before_images:
        before = rows.column("before").combine_chunks()
        documents_bson = pc.if_else(pc.and_(in_changes, deletes), before, documents_bson)
    documents = RowDocuments(documents_bson)
    state_output, state_values = StateOutput(None, None), None
    if state is not None:
        # an older event landed after a delete does not bring the document back: its marker says so
        markers = deletion_markers(location, state.deletions, pc.unique(keys.filter(single)))
        versions, version_documents = single_event_versions(
            rows, keys, ids, single, deletes, documents, markers, state.manifests, state.drops
        )
        state_output, state_values = write_state(location, state, versions, version_documents, markers)
    change_output = None
    if changes is not None:
        selected = pc.indices_nonzero(in_changes)
        if len(selected) == rows.num_rows:
            change_output = write_changes(location, changes, rows, documents, state_values)
        else:
            change_output = write_changes(
                location, changes, rows.take(selected), documents.take(selected), state_values
            )
    return SliceOutput(state_output, change_output)


def in_order(rows: pa.Table, columns: list[str]) -> pa.Table:
    """``rows`` sorted by ``columns`` (ascending, stably): ``rows`` themselves where they already are
    (a snapshot's, mostly), without a copy of every column (the documents too) in the same order."""
    if rows.num_rows < 2:
        return rows
    earlier, later = rows.slice(0, rows.num_rows - 1), rows.slice(1)
    ordered = None  # whether each row is at or before the next one, by the columns from the last
    for name in reversed(columns):
        before, after = earlier.column(name), later.column(name)
        ordered = (
            pc.less_equal(before, after)
            if ordered is None
            else pc.or_(pc.less(before, after), pc.and_(pc.equal(before, after), ordered))
        )
    if pc.all(pc.fill_null(ordered, False)).as_py():
        return rows
    return rows.sort_by([(name, "ascending") for name in columns])


def write_state(
    location: LakeLocation,
    spec: StateSpec,
    versions: pa.Table,
    documents: RowDocuments,
    markers: dict[str, DocumentVersion],
) -> tuple[StateOutput, StateValues | None]:
    """Write ``versions`` (``VERSION_SCHEMA``) as state rows (``documents``: theirs), and as deletion
    marker rows (``write_markers``) those deleted and those of documents with a marker; returns the
    output and the documents' field values (for ``write_changes``)."""
    deleted = pc.is_null(versions.column("document"))
    marked = deleted
    if markers:
        marked = pc.or_(deleted, pc.is_in(versions.column("key"), pa.array(list(markers), pa.string())))
    marker_file = write_markers(location, spec.markers_directory, versions.filter(marked))
    if not spec.with_flag and pc.any(deleted).as_py():
        live = pc.indices_nonzero(pc.invert(deleted))
        versions, documents = versions.take(live), documents.take(live)
    if not versions.num_rows:
        return StateOutput(None, marker_file), None
    versions = versions.combine_chunks()
    document_bson = versions.column("document").chunk(0)
    values = field_values(spec.layout, document_bson, documents)
    survey = column_survey.NO_CHANGES if spec.forced else spec.layout.survey(values)
    layout = spec.layout if spec.forced else spec.layout.evolved(survey)
    metadata = {
        "__key": versions.column("key").chunk(0),
        "__id": versions.column("document_id_json").chunk(0),
        "__doc": document_texts(values, document_bson),
        "__doc_bson": document_bson,
        "__cluster_time": versions.column("cluster_time").chunk(0),
        "__event_order": versions.column("event_order").chunk(0),
        "__rs": versions.column("rs").chunk(0),
    }
    batch = layout.record_batch(metadata, values)
    rows = pa.Table.from_batches([batch])
    if spec.with_flag:
        rows = rows.append_column(DELETED_FLAG, pc.is_null(document_bson))
    # sorted by key, so that the files of a table hold narrow key ranges a MERGE can skip
    rows = in_order(rows, ["__key"])
    if spec.held and survey == column_survey.NO_CHANGES:
        output = Output((), survey, rows)
    else:
        output = Output((write_state_file(location, spec.directory, rows, layout),), survey)
    return StateOutput(output, marker_file), StateValues(values, documents)


def write_state_file(location: LakeLocation, directory: str, rows: pa.Table, layout: TableLayout) -> DataFile:
    """State rows of ``layout`` (sorted by ``__key``) as a new file under ``directory``."""
    unique = PER_DOCUMENT_COLUMNS + _id_column(layout)
    return write_data_file(location, directory, rows, unique_columns=unique)


def write_markers(location: LakeLocation, directory: str, versions: pa.Table) -> DataFile | None:
    """Stage ``versions`` (``VERSION_SCHEMA``) as deletion marker rows (``DELETION_COLUMNS`` and
    ``DELETED_FLAG``: whether it is a deletion, or a document that lives again) under ``directory``,
    for the driver's MERGE."""
    if not versions.num_rows:
        return None
    rows = pa.Table.from_arrays(
        [
            versions.column("key"),
            versions.column("cluster_time"),
            versions.column("event_order"),
            versions.column("rs"),
            pc.is_null(versions.column("document")),
        ],
        schema=staged_schema(DELETION_SCHEMA),
    )
    return write_data_file(location, directory, in_order(rows, ["__key"]), unique_columns=("__key",))


def write_changes(
    location: LakeLocation,
    spec: ChangesSpec,
    events: pa.Table,
    decoded: RowDocuments,
    state_values: StateValues | None = None,
) -> Output | None:
    """Write the change rows of raw ``events`` (``decoded``: their documents, as ``changes_table_rows``
    takes them), a file per hour. ``state_values``: the state rows' field values, shared when they
    are of the same documents."""
    indices, metadata, documents = changes_table_rows(events, decoded, spec.options)
    if not documents:
        return None
    if (
        state_values is not None
        and getattr(state_values.values, "stored", spec.layout.stored_fields) == spec.layout.stored_fields
        and documents.same_as(state_values.documents)
    ):
        values = state_values.values  # a snapshot's: each field's values are extracted once
    else:
        values = field_values(spec.layout, documents.bson, documents)
    survey = column_survey.NO_CHANGES if spec.forced else spec.layout.survey(values)
    layout = spec.layout if spec.forced else spec.layout.evolved(survey)
    rows = pa.Table.from_batches([layout.record_batch(metadata, values)])
    hours = hour_partitions(metadata["__cluster_time"])
    files = []
    for hour in pc.unique(hours).to_pylist():
        part = rows.filter(pc.equal(hours, hour))
        files.append(
            write_data_file(
                location,
                spec.directory,
                part,
                ((lake.HOUR_COLUMN, hour),),
                unique_columns=_id_column(layout),
            )
        )
    return Output(tuple(files), survey)


def _id_column(layout: TableLayout) -> tuple[str, ...]:
    """The column of the documents' ``_id`` (a value of each document's own), if the layout has one."""
    column = layout.typed_columns.get("_id")
    return (column.column,) if column is not None else ()


def field_values(
    layout: TableLayout, document_bson: pa.BinaryArray, documents: RowDocuments
) -> column_survey.FieldValues | SplitValues:
    """The field values of rows for ``layout``: ``documents`` (None reads as ``{}``) and each one's
    BSON (null where it is not those bytes), split between the fast and the lossless path where
    numpy is installed (``transform.bson_columns``) and there are FAST_PATH_MIN_ROWS rows or more,
    else all lossless."""
    if split_documents is None or len(documents) < FAST_PATH_MIN_ROWS:
        return column_survey.FieldValues([as_dict(document) or {} for document in documents])
    return split_documents(layout.stored_fields, document_bson, documents, as_dict)


def document_texts(
    values: column_survey.FieldValues | SplitValues, document_bson: pa.BinaryArray
) -> pa.Array:
    """``__doc``: each document's Extended JSON text (null for none), rendered from its bytes
    (``__doc_bson``) on both paths: the fast path's in bulk, the others' by ``extjson.from_bson``."""

    def render(data: bytes | None) -> str | None:
        return extjson.from_bson(data) if data is not None else None

    if isinstance(values, column_survey.FieldValues):
        return pa.array([render(data) for data in document_bson.to_pylist()], pa.string())
    return values.ejson(lambda row: render(document_bson[row].as_py()))


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
    return folded_events(read_slice(location, raw_slice, window.filter()), folded_keys)


def folded_events(rows: pa.Table, folded_keys: frozenset[str]) -> list[tuple[str, ChangeEvent]]:
    """``fold_inputs`` of a slice's rows in the window, read already."""
    keys, _ = event_keys(rows.column("key"))
    selected = pc.and_(
        pc.and_(pc.invert(collection_operations(rows)), pc.is_valid(rows.column("op"))),
        pc.is_in(keys, pa.array(sorted(folded_keys), pa.string())),
    )
    indices = pc.indices_nonzero(pc.fill_null(selected, False))
    events = [event_from_row(row) for row in rows.take(indices).to_pylist()]
    return list(zip(keys.take(indices).to_pylist(), events, strict=True))


def fold_documents(
    location: LakeLocation,
    spec: StateSpec,
    state_files: tuple[KeyedFile, ...],
    documents: Iterable[tuple[str, Iterable[ChangeEvent]]],
) -> StateOutput:
    """The versions of ``documents`` (each one's events, grouped by Spark's shuffle) folded with their
    deletion marker, or their stored version (``state_files``) where an update without ``after``
    applies to it, reconciled with the run's snapshots and drops, and written."""
    grouped = [(key, list(events)) for key, events in documents]
    markers = deletion_markers(location, spec.deletions, pa.array([key for key, _ in grouped], pa.string()))
    partial = [key for key, events in grouped if any(_without_after(event) for event in events)]
    previous = {**markers, **stored_versions(location, state_files, pa.array(partial, pa.string()))}
    versions = []
    for key, events in grouped:
        version = fold_events(key, previous.get(key), events)
        if version is not None:
            versions.append(
                drop_with_collection(reconcile_with_snapshots(version, spec.manifests), spec.drops)
            )
    table = versions_table(versions)
    documents = RowDocuments(table.column("document").combine_chunks())
    state, _ = write_state(location, spec, table, documents, markers)
    return state


def _without_after(event: ChangeEvent) -> bool:
    """An update without the full document: it applies to the stored version."""
    return event.op == "u" and event.after_bson is None and event.update_description is not None
