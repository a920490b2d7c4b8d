"""One run's appends to a collection's ``changes`` table, or its rebuild (``ChangesRun``).

One row per new event, appended, partitioned by ``hour``; old files are never rewritten. A new field
adds a column (in a commit of its own, before the append); a value whose type conflicts with its
column's goes to the column's fallback sibling (``transform.column_types``). The flattening options
(``--flattening``, keyed like the source YAML) are recorded in the table's schema
(``flatten_options.with_recorded_flattening``): other options rebuild the table, and say so.
``--rebuild-hours`` rewrites the rows of those hours from the raw rows and backfilled history
(``rebuild``, a backfill run). Driver only: imports deltalake and runs Spark jobs.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, Schema, write_deltalake
from deltalake.transaction import create_table_with_add_actions

from mongo_cdc import lake
from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.file_rewrites import normalize_last_commit
from mongo_cdc.lake.file_statistics import indexed_columns, indexed_columns_property, table_indexed_columns
from mongo_cdc.lake.storage import row_count
from mongo_cdc.transform.collection_run import CollectionRun
from mongo_cdc.transform.data_files import DataFile, add_actions, delete_data_files, staged_rows
from mongo_cdc.transform.flatten_options import with_recorded_flattening
from mongo_cdc.transform.raw_slices import RawSlice
from mongo_cdc.transform.slice_tasks import transform_slice
from mongo_cdc.transform.state_merge import sql_literal
from mongo_cdc.transform.table_commits import creating, log, settled_layout, stored_layout
from mongo_cdc.transform.table_layout import TableLayout
from mongo_cdc.transform.task_contract import ChangesSpec, Output


class ChangesRun:
    """One run's appends to a collection's changes table (of the raw rows ``window`` selects), or
    its rebuild."""

    def __init__(
        self, collection_run: CollectionRun, table: DeltaTable | None, rebuilt: bool, window: BatchWindow
    ) -> None:
        self.collection_run = collection_run
        self.table = table
        self.rebuilt = rebuilt
        self.window = window
        options = collection_run.flattening
        self.layout = stored_layout(
            table, options.metadata_columns, options.sanitize_field_names, (lake.HOUR_COLUMN,)
        )

    def spec(self, layout: TableLayout | None = None, staged: bool = False) -> ChangesSpec:
        """How tasks write the rows (``layout``: in it as it is; ``staged``: before a rewrite)."""
        collection_run = self.collection_run
        directory = (
            f"{collection_run.staging}/changes" if staged or self.rebuilt else collection_run.changes_path
        )
        return ChangesSpec(
            layout or self.layout, layout is not None, directory, self.window, collection_run.flattening
        )

    def schema(self, layout: TableLayout) -> pa.Schema:
        return with_recorded_flattening(
            layout.schema.append(pa.field(lake.HOUR_COLUMN, pa.string())), self.collection_run.flattening
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
            log.info(
                "%s: writing the change rows of %d tasks again", self.collection_run.namespace, len(misfits)
            )
            location, forced = self.collection_run.location, self.spec(layout, staged)
            again = self.collection_run.run_tasks(
                [slices[index] for index in misfits],
                lambda raw_slice: transform_slice(location, raw_slice, None, forced, frozenset()).changes,
            )
            for index, output in zip(misfits, again, strict=True):
                delete_data_files(location, spec.directory, outputs[index].files)
                outputs[index] = output
        return layout, [file for output in outputs if output is not None for file in output.files]

    def finish(self, slices: list[RawSlice], outputs: list[Output | None]) -> tuple[int, int]:
        """Commit the run's change rows: appended, or replacing the whole table (a rebuild). The rows
        written, and the table's rows afterwards (counted without reading the table again)."""
        before = row_count(self.table)  # none for a new or rebuilt table
        layout, files = self.settle(slices, outputs, staged=False)
        schema = self.schema(layout)
        properties = self.collection_run.commit_properties("changes")
        if self.rebuilt:
            write_deltalake(
                self.collection_run.changes_uri,
                staged_rows(
                    self.collection_run.location, f"{self.collection_run.staging}/changes", files, schema
                ),
                mode="overwrite",
                schema_mode="overwrite",
                partition_by=[lake.HOUR_COLUMN],
                storage_options=self.collection_run.options,
                commit_properties=properties,
            )
            # delta-rs' own statistics: an infinite double's bound is null, which its readers prune by
            rebuilt = DeltaTable(self.collection_run.changes_uri, storage_options=self.collection_run.options)
            normalize_last_commit(rebuilt, self.collection_run.location)
        elif self.table is None:
            hour = [lake.HOUR_COLUMN]
            # an empty table fixes no columns (as the state's: ``StateRun.finish``)
            configuration = indexed_columns_property(schema, hour) if files else {}
            with creating(self.collection_run.changes_uri, self.collection_run.options):
                create_table_with_add_actions(
                    self.collection_run.changes_uri,
                    Schema.from_arrow(schema),
                    add_actions(files, indexed_columns(schema, configuration, hour)),
                    mode="error",
                    configuration=configuration,
                    partition_by=[lake.HOUR_COLUMN],
                    storage_options=self.collection_run.options,
                    commit_properties=properties,
                )
        else:
            if layout is not self.layout:
                # new columns first (a commit of its own: Delta's add actions cannot change the schema);
                # a crash before the next commit leaves only unused columns, which the retry keeps. It
                # restates the batches applied, so that it fails after another writer's commit instead
                # of moving self.table past it (the append below would then apply those batches again)
                applied = self.collection_run.applied(self.table, "changes")
                write_deltalake(
                    self.table,
                    schema.empty_table(),
                    mode="append",
                    schema_mode="merge",
                    commit_properties=self.collection_run.commit_properties("changes", applied),
                )
            self.table.create_write_transaction(
                add_actions(files, table_indexed_columns(self.table)),
                mode="append",
                schema=schema,
                partition_by=[lake.HOUR_COLUMN],
                commit_properties=properties,
            )
        written = sum(file.rows for file in files)
        return written, before + written

    def rebuild(self, hours: set[str]) -> int:
        """Replace the rows of ``hours`` with the change rows of their raw rows and history (a backfill)."""
        assert self.table is not None
        collection_run = self.collection_run
        files = [file for file in collection_run.files if file.hour in hours]
        slices = collection_run.slices([self.window], files)
        spec, location = self.spec(staged=True), collection_run.location
        outputs = collection_run.run_tasks(
            slices,
            lambda raw_slice: transform_slice(location, raw_slice, None, spec, frozenset()).changes,
        )
        layout, written = self.settle(slices, outputs, staged=True)
        schema = self.schema(layout)
        listed = ", ".join(sql_literal(hour) for hour in sorted(hours))
        write_deltalake(
            self.table,
            staged_rows(location, spec.directory, written, schema),
            mode="overwrite",
            predicate=f"{lake.HOUR_COLUMN} IN ({listed})",
            schema_mode="merge",
            commit_properties=collection_run.commit_properties("changes"),
        )
        normalize_last_commit(self.table, location)  # delta-rs' own statistics, as in ``finish``
        return sum(file.rows for file in written)
