"""A small collection's whole run in one Spark task: one job of such tasks serves many collections.

``whole_collection`` runs, for a collection whose new raw rows are one slice, what the transform's
Spark jobs otherwise do in turn (``slice_tasks``): the plan, the key counts, the transformed slice
and the fold of the documents with more than one event, all of whose events are in that slice; a
small state table it then writes again whole (``state_merge.rewrite``), which leaves the driver only
its commit. The driver (``driver.transform_collections``) puts every such collection's task in one
job and commits each one's tables from its ``WholeCollectionOutput``. Executor side: no pyspark or deltalake
import here.
"""

from __future__ import annotations

import traceback
from dataclasses import replace

import pyarrow as pa

from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform import column_survey
from mongo_cdc.transform.data_files import DataFile, delete_data_files, staged_rows
from mongo_cdc.transform.folded_keys import folded_in_rows
from mongo_cdc.transform.raw_events import ChangeEvent
from mongo_cdc.transform.raw_slices import RawSlice, concat_pieces
from mongo_cdc.transform.slice_tasks import (
    fold_documents,
    folded_events,
    none_folded_apart,
    plan_pieces,
    slice_pieces,
    transform_rows,
    transform_slice,
    write_state_file,
)
from mongo_cdc.transform.state_merge import REWRITE_MAX_ROWS, Rewrite, gone_positions, rewrite
from mongo_cdc.transform.stored_rows import KeyedFile
from mongo_cdc.transform.table_formats import staged_schema
from mongo_cdc.transform.table_layout import widened
from mongo_cdc.transform.task_contract import (
    ChangesSpec,
    Output,
    StateOutput,
    StateSpec,
    WholeCollectionOutput,
)


def whole_collection(
    location: LakeLocation,
    raw_slice: RawSlice,
    state: StateSpec | None,
    changes: ChangesSpec | None,
    state_files: tuple[KeyedFile, ...],
    target: Rewrite | None,
) -> WholeCollectionOutput:
    """A collection's run whose new rows are the one slice ``raw_slice``, in this one task: the plan,
    the key counts (within one slice, complete), the transformed slice and the fold of the documents
    with more than one event, which are then all in this slice; then the state table ``target``
    written again whole (``rewritten_whole``). A failure is returned, not raised, so the other
    collections of the shared job carry on; the driver fails this collection alone."""
    try:
        if state is None:
            return WholeCollectionOutput(
                None, 0, transform_slice(location, raw_slice, None, changes, frozenset()), ()
            )
        # the slice is read once, for every step (a read is most of a small collection's task)
        rows = concat_pieces(slice_pieces(location, raw_slice, state, changes))
        in_window = rows.filter(state.window.mask(rows))
        # the slice as one piece: its keys' one range says whether any document has two events
        plan = plan_pieces([in_window])
        state = replace(state, drops=tuple(sorted(plan.drops)), held=target is not None)
        folded_keys = frozenset() if none_folded_apart([plan]) else folded_in_rows(in_window)
        transformed = transform_rows(location, rows, state, changes, folded_keys)
        folded: tuple[StateOutput, ...] = ()
        if folded_keys:
            grouped: dict[str, list[ChangeEvent]] = {}
            for key, event in folded_events(in_window, folded_keys):
                grouped.setdefault(key, []).append(event)
            folded = (fold_documents(location, state, state_files, grouped.items()),)
        rewritten = None
        if target is not None:
            rewritten, (transformed_state, *folded_states) = rewritten_whole(
                location, state, target, [transformed.state, *folded]
            )
            transformed, folded = transformed._replace(state=transformed_state), tuple(folded_states)
        return WholeCollectionOutput(plan, len(folded_keys), transformed, folded, rewritten)
    except Exception:  # the driver fails this collection alone, with this traceback
        return WholeCollectionOutput(None, 0, None, (), error=traceback.format_exc())


def rewritten_whole(
    location: LakeLocation, state: StateSpec, target: Rewrite, outputs: list[StateOutput]
) -> tuple[DataFile | None, list[StateOutput]]:
    """The small state table ``target`` written again whole with the run's rows (``outputs``: held in
    memory, or staged and then deleted) by ``state_merge.rewrite``; None when they change the table's
    layout or are more than ``REWRITE_MAX_ROWS``, and the driver merges them. With it, ``outputs`` as
    the driver takes them: none holds rows in memory (staged now, when not written whole)."""
    written = [state_output.output for state_output in outputs if state_output.output is not None]
    files = [file for output in written for file in output.files]
    held = [output.rows for output in written if output.rows is not None]
    if any(output.survey != column_survey.NO_CHANGES for output in written) or (
        sum(file.rows for file in files) + sum(rows.num_rows for rows in held) > REWRITE_MAX_ROWS
    ):
        return None, [staged(location, state, state_output) for state_output in outputs]
    schema = staged_schema(target.schema)
    staged_source = staged_rows(location, state.directory, files, schema).read_all()
    source = pa.concat_tables([*(widened(rows, schema) for rows in held), staged_source])
    new_file = rewrite(location, target, source, gone_positions(state.manifests, state.drops))
    delete_data_files(location, state.directory, files)
    return new_file, [
        output._replace(output=Output((), output.output.survey)) if output.output else output
        for output in outputs
    ]


def staged(location: LakeLocation, state: StateSpec, state_output: StateOutput) -> StateOutput:
    """``state_output`` with its rows held in memory, if any, written to a file for the driver."""
    output = state_output.output
    if output is None or output.rows is None:
        return state_output
    file = write_state_file(location, state.directory, output.rows, state.layout)
    return state_output._replace(output=Output((file,), output.survey))
