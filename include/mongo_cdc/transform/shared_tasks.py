"""A small collection's whole run in one Spark task: one job of such tasks serves many collections.

``whole_collection`` runs, for a collection whose new raw rows are one slice, what the transform's
Spark jobs otherwise do in turn (``slice_tasks``): the plan, the key counts, the transformed slice
and the fold of the documents with more than one event, all of whose events are in that slice; a
small state table it then writes again whole (``state_merge.rewrite``), which leaves the driver only
its commit. The driver (``driver.transform_collections``) puts every such collection's task in one
job and commits each one's tables from its ``SharedOutput``. Executor side: no pyspark or deltalake
import here.
"""

from __future__ import annotations

import traceback
from dataclasses import replace
from typing import NamedTuple

import pyarrow as pa

from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform import columns
from mongo_cdc.transform.data_files import DataFile, delete_data_files, staged_rows
from mongo_cdc.transform.folded_keys import folded_in_slice
from mongo_cdc.transform.raw_events import ChangeEvent
from mongo_cdc.transform.slice_tasks import (
    DELETED_FLAG,
    ChangesSpec,
    KeyedFile,
    SliceOutput,
    SlicePlan,
    StateOutput,
    StateSpec,
    fold_documents,
    fold_inputs,
    none_folded_apart,
    plan_slice,
    transform_slice,
)
from mongo_cdc.transform.slices import RawSlice
from mongo_cdc.transform.state_merge import REWRITE_MAX_ROWS, Rewrite, gone_positions, rewrite


class SharedOutput(NamedTuple):
    """What ``whole_collection`` did with one collection's slice: its plan, the transformed slice and
    the documents folded apart, written, and the state table's rows after the run when it wrote them
    whole (``error``: the traceback of its failure instead)."""

    plan: SlicePlan | None
    folded_documents: int
    transformed: SliceOutput | None
    folded: tuple[StateOutput, ...]
    rewritten: DataFile | None = None
    error: str | None = None


def whole_collection(
    location: LakeLocation,
    raw_slice: RawSlice,
    state: StateSpec | None,
    changes: ChangesSpec | None,
    state_files: tuple[KeyedFile, ...],
    target: Rewrite | None,
) -> SharedOutput:
    """A collection's run whose new rows are the one slice ``raw_slice``, in this one task: the plan,
    the key counts (within one slice, complete), the transformed slice and the fold of the documents
    with more than one event, which are then all in this slice; then the state table ``target``
    written again whole (``rewritten_whole``). A failure is returned, not raised, so the other
    collections of the shared job carry on; the driver fails this collection alone."""
    try:
        if state is None:
            return SharedOutput(None, 0, transform_slice(location, raw_slice, None, changes, frozenset()), ())
        plan = plan_slice(location, raw_slice, state.window)
        state = replace(state, drops=tuple(sorted(plan.drops)))
        folded_keys = (
            frozenset() if none_folded_apart([plan]) else folded_in_slice(location, raw_slice, state.window)
        )
        transformed = transform_slice(location, raw_slice, state, changes, folded_keys)
        folded: tuple[StateOutput, ...] = ()
        if folded_keys:
            grouped: dict[str, list[ChangeEvent]] = {}
            for key, event in fold_inputs(location, raw_slice, state.window, folded_keys):
                grouped.setdefault(key, []).append(event)
            folded = (fold_documents(location, state, state_files, grouped.items()),)
        rewritten = (
            rewritten_whole(location, state, target, [transformed.state, *folded])
            if target is not None
            else None
        )
        return SharedOutput(plan, len(folded_keys), transformed, folded, rewritten)
    except Exception:  # the driver fails this collection alone, with this traceback
        return SharedOutput(None, 0, None, (), error=traceback.format_exc())


def rewritten_whole(
    location: LakeLocation, state: StateSpec, target: Rewrite, outputs: list[StateOutput]
) -> DataFile | None:
    """The small state table ``target`` written again whole with the run's staged rows
    (``state_merge.rewrite``), which are deleted then; None, and the rows left staged for the driver,
    when they change the table's layout or are more than ``REWRITE_MAX_ROWS``."""
    written = [state_output.output for state_output in outputs if state_output.output is not None]
    files = [file for output in written for file in output.files]
    if any(output.survey != columns.NO_CHANGES for output in written) or (
        sum(file.rows for file in files) > REWRITE_MAX_ROWS
    ):
        return None
    schema = target.schema.append(pa.field(DELETED_FLAG, pa.bool_()))
    source = staged_rows(location, state.directory, files, schema).read_all()
    new_file = rewrite(location, target, source, gone_positions(state.manifests, state.drops))
    delete_data_files(location, state.directory, files)
    return new_file
