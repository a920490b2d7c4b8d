"""One run's update of a collection's ``state`` table and its deletion markers (``StateRun``).

The new events are folded per document (its normalised ``_id``, ``transform.keys``), with the stored
version where an update without ``after`` needs it, then applied to the table in one commit
(``state_merge``'s rule): newer versions update, deletions delete, new documents insert; an event at
or before a document's stored position changes nothing. A committed snapshot manifest, drop or
rename in the new batches also deletes the documents of that replica set sitting before it. A MERGE
rewrites only the data files holding changed documents, run by Spark's tasks, a range of keys each
(``merge_ranges``: the driver plans from the files' key bounds and commits the files the tasks
wrote); a small table (``state_merge.REWRITE_MAX_ROWS``) is written again whole, which costs a tenth
of a MERGE (by the task of a job shared by small collections, when it ran the collection's whole
run: the driver then only commits). A new table is one commit of the files the tasks wrote.

How a run goes: ``plan`` (which documents are folded apart: more than one new event, or an update
without ``after``), the tasks' writes (``slice_tasks.transform_slice``), ``fold`` (the documents
folded apart, grouped by Spark's shuffle), then ``finish`` (layout settled, misfits written again,
deletion markers, commit). Driver only: imports deltalake and runs Spark jobs.

The driver holds no per-document data of the run, so its memory does not grow with the run: the
documents folded apart are found by a Spark aggregation of the slices' keys (the driver gets their
count) and reach each task as its slice's share (``slice_inputs``); each task reads the deletion
markers and stored versions of its own documents from the tables' files (``stored_rows.keyed_rows``,
files skipped by their key range) and stages its deletion marker rows as a file, which the driver's
MERGE of the markers streams; the state's MERGE reads the staged state rows in the tasks of its key
ranges, never in the driver. The driver handles files, batches and counts only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Schema, write_deltalake
from deltalake.transaction import RemoveAction, create_table_with_add_actions
from pyspark import RDD, StorageLevel

from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.file_statistics import indexed_columns, indexed_columns_property, table_indexed_columns
from mongo_cdc.lake.storage import file_actions, row_count, table_if_exists
from mongo_cdc.transform.collection_run import CollectionRun
from mongo_cdc.transform.data_files import DataFile, add_actions, delete_data_files, staged_rows
from mongo_cdc.transform.folded_keys import folded_keys, slice_key_buckets
from mongo_cdc.transform.merge_ranges import merge_range, merge_ranges, merged_together
from mongo_cdc.transform.raw_slices import SLICE_ROWS, RawSlice
from mongo_cdc.transform.slice_tasks import (
    fold_documents,
    fold_inputs,
    none_folded_apart,
    plan_slice,
    transform_slice,
)
from mongo_cdc.transform.state_merge import (
    REWRITE_MAX_BYTES,
    REWRITE_MAX_ROWS,
    Gone,
    MergedFiles,
    Rewrite,
    gone_positions,
    position_after,
    rewrite,
)
from mongo_cdc.transform.stored_rows import keyed_files
from mongo_cdc.transform.table_commits import creating, log, settled_layout, stored_layout
from mongo_cdc.transform.table_formats import (
    DELETED_FLAG,
    DELETION_COLUMNS,
    DELETION_SCHEMA,
    STATE_METADATA_COLUMNS,
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

# A deletion markers' MERGE source of at most this many rows is handed to delta-rs whole, which lets
# it read and rewrite only the files whose key range may hold a source key; a larger one is streamed.
MERGE_IN_MEMORY_ROWS = 200_000


class SharedRunMisfit(RuntimeError):
    """A shared job's task wrote rows that must be written again in the settled layout (``rewritten``)."""


class StateRun:
    """One run's update of a collection's state table (and its deletion markers)."""

    def __init__(
        self,
        collection_run: CollectionRun,
        table: DeltaTable | None,
        window: BatchWindow,
        applied: dict[str, int],
    ) -> None:
        """``applied``: the batches ``table`` has applied, per replica set (``applied_batches``)."""
        self.collection_run = collection_run
        self.table = table
        self.window = window
        self.manifests = tuple(
            m
            for m in collection_run.manifests
            if applied.get(m.rs, 0) < m.seq <= collection_run.committed.get(m.rs, 0)
        )
        self.layout = stored_layout(
            table, STATE_METADATA_COLUMNS, collection_run.flattening.sanitize_field_names
        )
        self.deletions = table_if_exists(collection_run.deletions_uri, collection_run.options)
        # a new table is written where it lives; a MERGE's source is staged first
        self.directory = collection_run.state_path if table is None else f"{collection_run.staging}/state"
        self.new_events = 0
        self.drops: tuple[tuple[tuple[int, str], str], ...] = ()
        self.folded_documents = 0
        # (slice index, the slice's keys of documents folded apart), one partition per slice; the
        # run's folded documents, found by Spark, stay out of the driver (``plan``)
        self.folded_by_slice: RDD | None = None
        self.folded: RDD | None = None
        # the fold's outputs when the run's task of a job shared by small collections made them
        # (``take_whole_collection_output``)
        self.shared_folds: tuple[StateOutput, ...] | None = None
        # the table's rows after the run, written whole by that task (``state_merge.rewrite``)
        self.shared_rewrite: DataFile | None = None
        # the files the tasks read stored versions and deletion markers from, for their own keys
        # the table's files as read (``file_actions``): the tasks' key ranges, a rewrite's removes
        self.stored_files = _file_actions(table)
        self.state_files = keyed_files(self.stored_files, collection_run.state_path)
        self.deletion_files = keyed_files(_file_actions(self.deletions), collection_run.deletions_path)

    def spec(self, layout: TableLayout | None = None) -> StateSpec:
        return StateSpec(
            layout or self.layout,
            layout is not None,
            self.directory,
            self.window,
            self.table is not None,
            self.manifests,
            self.drops,
            self.deletion_files,
            f"{self.collection_run.staging}/deletions",
        )

    def plan(self, slices: list[RawSlice]) -> None:
        """The run's drops and events; which documents' events are folded apart (more than one event,
        or an update without ``after``): none if the slices' pieces hold disjoint ranges of keys
        (``none_folded_apart``), else found by Spark from the slices' keys summed per bucket
        (``folded_keys``), of which the driver keeps only the count."""
        context, location, window, started = (
            self.collection_run.context, self.collection_run.location, self.window, time.monotonic(),
        )  # fmt: skip
        planned = self.collection_run.run_tasks(
            slices, lambda raw_slice: plan_slice(location, raw_slice, window)
        )
        self.new_events = sum(plan.rows for plan in planned)
        self.drops = tuple(sorted(drop for plan in planned for drop in plan.drops))
        if not slices:
            return
        if none_folded_apart(planned):  # a snapshot's slices, say: no shuffle of their keys
            log.info(
                "%s: %d new events, no document with more than one (the slices' key ranges are disjoint) "
                "(%.1fs)", self.collection_run.namespace, self.new_events, time.monotonic() - started,
            )  # fmt: skip
            return
        buckets = len(slices)
        folded = (
            context.parallelize(list(enumerate(slices)), len(slices))
            .flatMap(lambda item: slice_key_buckets(location, item[0], item[1], window, buckets))
            .groupByKey(buckets)  # bucket n to partition n: Spark hashes an int to itself
            .flatMap(lambda item: folded_keys(item[1]))
            .persist(StorageLevel.DISK_ONLY)  # read again by each step of the run, never by the driver
        )
        self.folded = folded
        self.folded_documents = folded.count()
        if self.folded_documents:  # none in a first build: the slices' tasks then need no join with them
            self.folded_by_slice = (
                folded.flatMap(lambda item: [(index, item[0]) for index in item[1].slices])
                .groupByKey(len(slices))
                .mapValues(frozenset)
            )
        log.info(
            "%s: %d new events, %d documents folded apart (%.1fs)",
            self.collection_run.namespace, self.new_events, self.folded_documents, time.monotonic() - started,
        )  # fmt: skip

    def take_whole_collection_output(
        self,
        plan: SlicePlan,
        folded_documents: int,
        folded: tuple[StateOutput, ...],
        rewritten: DataFile | None,
    ) -> None:
        """What the run's task of a shared job (``whole_collection.whole_collection``) planned and folded, in
        place of ``plan``'s and ``fold``'s Spark jobs, and the table it wrote again whole (None: the
        driver merges its rows)."""
        self.new_events = plan.rows
        self.drops = tuple(sorted(plan.drops))
        self.folded_documents = folded_documents
        self.shared_folds = folded
        self.shared_rewrite = rewritten

    def rewrite_target(self, layout: TableLayout | None = None) -> Rewrite | None:
        """The table as a ``state_merge.Rewrite`` (in ``layout``, the stored one by default) when it is
        small enough to be written again whole (``REWRITE_MAX_ROWS``, ``REWRITE_MAX_BYTES``, its files'
        rows known), else None."""
        stored = self.stored_files
        if stored is None or stored.column("num_records").null_count:
            return None
        rows, size = (pc.sum(stored.column(name)).as_py() or 0 for name in ("num_records", "size_bytes"))
        if rows > REWRITE_MAX_ROWS or size > REWRITE_MAX_BYTES:
            return None
        return Rewrite(
            self.collection_run.state_path,
            (layout or self.layout).schema,
            tuple(stored.column("path").to_pylist()),
        )

    def slice_inputs(self, slices: list[RawSlice]) -> RDD:
        """Each slice with its index and its keys of documents folded apart: without any, the slices
        of a partition in turn (``CollectionRun.task_count``), else one partition per slice."""
        context, indexed = self.collection_run.context, list(enumerate(slices))
        if self.folded_by_slice is None:
            return context.parallelize(indexed, self.collection_run.task_count(slices)).map(
                lambda item: (item[0], item[1], frozenset())
            )
        return (
            context.parallelize(indexed, max(1, len(slices)))
            .partitionBy(len(slices))
            .leftOuterJoin(self.folded_by_slice, len(slices))
            .map(lambda item: (item[0], item[1][0], item[1][1] or frozenset()))
        )

    def fold(self, slices: list[RawSlice], layout: TableLayout | None = None) -> list[StateOutput]:
        """The documents folded apart: their events grouped by document (Spark's shuffle), folded
        with their stored version or marker (each task reads those of its own documents), and written."""
        if self.shared_folds is not None:
            return list(self.shared_folds)
        if not self.folded_documents:
            return []
        location, window, spec, state_files = (
            self.collection_run.location, self.window, self.spec(layout), self.state_files,
        )  # fmt: skip
        partitions = max(
            1, min(self.collection_run.context.defaultParallelism, -(-self.folded_documents // SLICE_ROWS))
        )
        events = self.slice_inputs(slices).flatMap(
            lambda item: fold_inputs(location, item[1], window, item[2]) if item[2] else []
        )
        return (
            events.groupByKey(partitions)
            .mapPartitions(lambda part: [fold_documents(location, spec, state_files, part)])
            .collect()
        )

    def transformed(
        self, slices: list[RawSlice], spec: StateSpec, changes: ChangesSpec | None
    ) -> list[SliceOutput]:
        """``transform_slice`` of each slice, with its keys of documents folded apart; in slice order."""
        if not slices:  # no new rows (a new table of an empty collection): a Spark job costs ~0.3 s
            return []
        location = self.collection_run.location
        outputs = (
            self.slice_inputs(slices)
            .map(lambda item: (item[0], transform_slice(location, item[1], spec, changes, item[2])))
            .collect()
        )
        return [output for _, output in sorted(outputs, key=lambda pair: pair[0])]

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
            log.info(
                "%s: writing the state rows of %d tasks again", self.collection_run.namespace, len(misfits)
            )
            for state in outputs:
                if state.output is not None:
                    delete_data_files(self.collection_run.location, self.directory, state.output.files)
            outputs = self.rewritten(slices, layout)
            written = [state.output for state in outputs if state.output is not None]
        files = [file for output in written for file in output.files]
        # markers first: applying the same versions again after a crash gives the same markers
        self.update_deletion_markers([state.markers for state in outputs if state.markers is not None])
        if self.folded is not None:
            self.folded.unpersist()
        if self.table is None:
            # an empty table fixes no columns: those its first rows bring are indexed (healing fixes them)
            configuration = indexed_columns_property(layout.schema) if files else {}
            with creating(self.collection_run.state_uri, self.collection_run.options):
                create_table_with_add_actions(
                    self.collection_run.state_uri,
                    Schema.from_arrow(layout.schema),
                    add_actions(files, indexed_columns(layout.schema, configuration)),
                    mode="error",
                    configuration=configuration,
                    storage_options=self.collection_run.options,
                    commit_properties=self.collection_run.commit_properties("state"),
                )
            rows = sum(file.rows for file in files)
        else:
            rows = self.merge(layout, files)
        return {"new_events": self.new_events, "state_rows": rows}

    def fits(self, output: Output, layout: TableLayout) -> bool:
        return self.layout.reads_as(output.survey, layout)

    def rewritten(self, slices: list[RawSlice], layout: TableLayout) -> list[StateOutput]:
        """Every state row of the run written again, in ``layout`` (the first try's marker files stay in
        the staging directory, deleted with it)."""
        if self.shared_folds is not None:  # its documents folded apart are known to no Spark job here
            raise SharedRunMisfit(
                f"{self.collection_run.namespace}: its rows took other types for a new field in a shared "
                "job's task: it runs again with jobs of its own"
            )
        outputs = self.transformed(slices, self.spec(layout), None)
        return [output.state for output in outputs] + self.fold(slices, layout)

    def update_deletion_markers(self, files: list[DataFile]) -> None:
        """Record the run's deletions (the marker rows the tasks staged, ``files``); drop the markers
        of documents that live again."""
        if not files:
            return
        schema = staged_schema(DELETION_SCHEMA)
        source = staged_rows(self.collection_run.location, self.spec().markers_directory, files, schema)
        # the markers' app ids make a concurrent run's MERGE of the same markers fail, not insert twice
        properties = self.collection_run.commit_properties("deletions")
        if self.deletions is None:
            deleted = pa.RecordBatchReader.from_batches(
                DELETION_SCHEMA,
                (batch.filter(batch.column(DELETED_FLAG)).select(DELETION_COLUMNS) for batch in source),
            )
            with creating(self.collection_run.deletions_uri, self.collection_run.options):
                write_deltalake(
                    self.collection_run.deletions_uri,
                    deleted,
                    mode="error",
                    storage_options=self.collection_run.options,
                    commit_properties=properties,
                )
            return
        in_memory = sum(file.rows for file in files) <= MERGE_IN_MEMORY_ROWS
        newer = position_after("s", "t")
        (
            self.deletions.merge(
                source.read_all() if in_memory else source,
                predicate="t.__key = s.__key",
                source_alias="s",
                target_alias="t",
                streamed_exec=not in_memory,
                commit_properties=properties,
            )
            .when_matched_delete(predicate=f"NOT s.{DELETED_FLAG} AND {newer}")
            .when_matched_update_all(predicate=f"s.{DELETED_FLAG} AND {newer}", except_cols=[DELETED_FLAG])
            .when_not_matched_insert_all(predicate=f"s.{DELETED_FLAG}", except_cols=[DELETED_FLAG])
            .execute()
        )

    def merge(self, layout: TableLayout, files: list[DataFile]) -> int:
        """Apply the staged rows to the table in one commit (``state_merge``'s rule); its rows after.
        A small table is written again whole (``rewrite``); a large one by Spark's tasks, a range of
        keys each (``merge_ranges``), after a commit of its new columns, if it has any."""
        assert self.table is not None and self.stored_files is not None
        if self.shared_rewrite is not None:
            return self.commit_rewrite(self.shared_rewrite, self.layout)
        gone = gone_positions(self.manifests, self.drops)
        target = self.rewrite_target(layout)
        if target is not None and sum(file.rows for file in files) <= REWRITE_MAX_ROWS:
            schema = staged_schema(layout.schema)
            source = staged_rows(self.collection_run.location, self.directory, files, schema).read_all()
            return self.commit_rewrite(rewrite(self.collection_run.location, target, source, gone), layout)
        if layout is not self.layout:
            # new columns first (a commit of its own: Delta's add actions cannot change the schema),
            # restating the batches applied, as the changes table's do (``changes_commit.finish``)
            applied = self.collection_run.applied(self.table, "state")
            write_deltalake(
                self.table,
                layout.schema.empty_table(),
                mode="append",
                schema_mode="merge",
                commit_properties=self.collection_run.commit_properties("state", applied),
            )
        merged = self.merged_by_tasks(layout, files, gone)
        self.table.create_write_transaction(
            [
                *self.removes(merged.removed),
                *add_actions(list(merged.written), table_indexed_columns(self.table)),
            ],
            mode="append",
            schema=self.table.schema(),
            commit_properties=self.collection_run.commit_properties("state"),
        )
        log.info(
            "%s state merge: %d files read again, %d written, %d rows removed, %d added",
            self.collection_run.namespace, len(merged.removed), len(merged.written), merged.rows_removed,
            merged.rows_added,
        )  # fmt: skip
        return row_count(self.table) - merged.rows_removed + merged.rows_added

    def merged_by_tasks(self, layout: TableLayout, files: list[DataFile], gone: list[Gone]) -> MergedFiles:
        """The MERGE's files written by Spark's tasks, a range of keys each (``merge_ranges``), planned
        from the table's and the staged files' key bounds; what they wrote, summed."""
        run, started = self.collection_run, time.monotonic()
        parts = merge_ranges(self.state_files, files, gone, run.task_count(self.state_files))
        location, table_path, staging, schema = run.location, run.state_path, self.directory, layout.schema
        # the job's name in Spark's UI and event log (this thread's jobs only: the collections' threads
        # each have their own)
        run.context.setJobDescription(f"{run.namespace}: state MERGE of {len(parts)} key ranges")
        try:
            outputs = run.run_tasks(
                parts, lambda part: merge_range(location, table_path, staging, schema, part, gone)
            )
        finally:
            run.context.setJobDescription(None)  # type: ignore[arg-type]  # None: no description
        log.info(
            "%s state merge: %d Spark tasks handed %d of the table's %d files (%.1fs)",
            run.namespace, len(parts), sum(len(part.stored) for part in parts), len(self.state_files),
            time.monotonic() - started,
        )  # fmt: skip
        return merged_together(outputs)

    def removes(self, paths: Iterable[str]) -> list[RemoveAction]:
        """Remove actions of the table's files at ``paths`` (under the lake root, as ``state_files``)."""
        assert self.stored_files is not None
        files = self.stored_files.select(["path", "size_bytes"]).to_pylist()
        sizes = {file["path"]: file["size_bytes"] for file in files}
        now_ms, prefix = int(time.time() * 1000), f"{self.collection_run.state_path}/"
        relative = [path.removeprefix(prefix) for path in paths]
        return [RemoveAction(path, True, now_ms, sizes[path]) for path in relative]

    def commit_rewrite(self, written: DataFile, layout: TableLayout) -> int:
        """One commit that adds ``written``, the table's rows after the run (``state_merge.rewrite``),
        and removes every file the run read: the commit a MERGE makes, without its cost. A new layout
        overwrites the table: the one commit that changes its schema and adds files."""
        assert self.table is not None and self.stored_files is not None
        if layout is self.layout:
            now_ms = int(time.time() * 1000)
            removed = [
                RemoveAction(file["path"], True, now_ms, file["size_bytes"])
                for file in self.stored_files.select(["path", "size_bytes"]).to_pylist()
            ]
            actions, mode, schema = (
                [*removed, *add_actions([written], table_indexed_columns(self.table))],
                "append",
                self.table.schema(),
            )
        else:
            indexed = indexed_columns(layout.schema, self.table.metadata().configuration)
            actions, mode, schema = (
                add_actions([written], indexed),
                "overwrite",
                Schema.from_arrow(layout.schema),
            )
        self.table.create_write_transaction(
            actions,
            mode=mode,
            schema=schema,
            commit_properties=self.collection_run.commit_properties("state"),
        )
        log.info("%s state written again whole: %d rows", self.collection_run.namespace, written.rows)
        return written.rows


def _file_actions(table: DeltaTable | None) -> pa.Table | None:
    return None if table is None else file_actions(table)
