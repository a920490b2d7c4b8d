"""One run's update of a collection's ``state`` table and its deletion markers (``StateRun``).

The new events are folded per document (its normalised ``_id``, ``transform.keys``), with the stored
version where an update without ``after`` needs it, then MERGEd into the table in one commit: newer
versions update, deletions delete, new documents insert; an event at or before a document's stored
position changes nothing. A committed snapshot manifest, drop or rename in the new batches also
deletes the documents of that replica set sitting before it (the MERGE's
``when_not_matched_by_source``). Only the data files holding changed documents are rewritten. A new
table is one commit of the files the tasks wrote.

How a run goes: ``plan`` (which documents are folded apart: more than one new event, or an update
without ``after``), the tasks' writes (``slice_tasks.transform_slice``), ``fold`` (the documents
folded apart, grouped by Spark's shuffle), then ``finish`` (layout settled, misfits written again,
deletion markers, commit). Driver only: imports deltalake and runs Spark jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import bson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Schema, write_deltalake
from deltalake.transaction import create_table_with_add_actions

from mongo_cdc.extjson import READ_OPTIONS
from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.storage import row_count, table_if_exists
from mongo_cdc.lake.table_reads import Where, read_rows
from mongo_cdc.transform import columns
from mongo_cdc.transform.data_files import DataFile, add_actions, delete_data_files
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    drop_with_collection,
    fold_events,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.slice_tasks import (
    DELETED_FLAG,
    DELETION_COLUMNS,
    Output,
    StateOutput,
    StateSpec,
    fold_inputs,
    plan_slice,
    transform_slice,
    write_state,
)
from mongo_cdc.transform.slices import SLICE_ROWS, RawSlice, from_ipc
from mongo_cdc.transform.table_commits import (
    creating,
    log,
    position_after,
    settled_layout,
    sql_literal,
    staged_rows,
    stored_layout,
)
from mongo_cdc.transform.table_layout import TableLayout

if TYPE_CHECKING:
    from mongo_cdc.transform.driver import CollectionTransform

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
# A MERGE source of at most this many rows is handed to delta-rs whole, which lets it read and
# rewrite only the state files whose key range may hold a source key; a larger one is streamed.
MERGE_IN_MEMORY_ROWS = 200_000


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
        self.new_events = sum(plan.rows for plan in planned)
        self.drops = tuple(sorted(drop for plan in planned for drop in plan.drops))
        events = pa.concat_tables([from_ipc(plan.events) for plan in planned]) if planned else None
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

    def fold(self, slices: list[RawSlice], layout: TableLayout | None = None) -> list[StateOutput]:
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

        def write(part: Iterator[DocumentVersion]) -> list[StateOutput]:
            folded = list(part)
            documents = [
                bson.decode(v.document, READ_OPTIONS) if v.document is not None else None for v in folded
            ]
            state, _ = write_state(location, spec, folded, documents, markers.value)
            return [state]

        return versions.mapPartitions(write).collect()

    def finish(self, slices: list[RawSlice], outputs: list[StateOutput]) -> dict[str, Any]:
        outputs = outputs + self.fold(slices)
        written = [state.output for state in outputs if state.output is not None]
        layout = settled_layout(self.layout, written)
        misfits = [
            i
            for i, state in enumerate(outputs)
            if state.output is not None and not self.fits(state.output, layout)
        ]
        if misfits:
            # tasks' rows took other types for a new field: write them again, in the settled layout
            log.info("%s: writing the state rows of %d tasks again", self.transform.namespace, len(misfits))
            for state in outputs:
                if state.output is not None:
                    delete_data_files(self.transform.location, self.directory, state.output.files)
            outputs = self.rewritten(slices, layout)
            written = [state.output for state in outputs if state.output is not None]
        files = [file for output in written for file in output.files]
        # markers first: applying the same versions again after a crash gives the same markers
        self.update_deletion_markers([row for state in outputs for row in state.marker_rows])
        if self.table is None:
            with creating(self.transform.state_uri, self.transform.options):
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

    def rewritten(self, slices: list[RawSlice], layout: TableLayout) -> list[StateOutput]:
        """Every state row of the run written again, in ``layout``."""
        location, spec = self.transform.location, self.spec(layout)
        folded, markers = self.folded_keys, self.markers
        outputs = self.transform.run_slices(
            slices, lambda raw_slice: transform_slice(location, raw_slice, spec, None, folded, markers)
        )
        return [output.state for output in outputs] + self.fold(slices, layout)

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
            with creating(self.transform.deletions_uri, self.transform.options):
                write_deltalake(
                    self.transform.deletions_uri,
                    deletions,
                    mode="error",
                    storage_options=self.transform.options,
                    commit_properties=properties,
                )
            return
        newer = position_after("s", "t")
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
        newer = position_after("s", "t")
        merger = merger.when_matched_delete(predicate=f"s.{DELETED_FLAG} AND {newer}")
        merger = merger.when_matched_update_all(
            predicate=f"NOT s.{DELETED_FLAG} AND {newer}", except_cols=[DELETED_FLAG]
        )
        merger = merger.when_not_matched_insert_all(
            predicate=f"NOT s.{DELETED_FLAG}", except_cols=[DELETED_FLAG]
        )
        # documents the new batches did not touch: gone if a snapshot missed them or a drop came after
        gone = [
            f"(t.__rs = {sql_literal(rs)} AND (t.__cluster_time < {ct} OR (t.__cluster_time = {ct} "
            f"AND t.__event_order < {sql_literal(order)})))"
            for (ct, order), rs in [(m.position, m.rs) for m in self.manifests] + list(self.drops)
        ]
        if gone:
            merger = merger.when_not_matched_by_source_delete(predicate=" OR ".join(gone))
        metrics = merger.execute()
        log.info("%s state merge: %s", self.transform.namespace, metrics)


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
