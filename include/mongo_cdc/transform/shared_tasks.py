"""A small collection's whole run in one Spark task: one job of such tasks serves many collections.

``whole_collection`` runs, for a collection whose new raw rows are one slice, what the transform's
Spark jobs otherwise do in turn (``slice_tasks``): the plan, the key counts, the transformed slice
and the fold of the documents with more than one event, all of whose events are in that slice. The
driver (``driver.transform_collections``) puts every such collection's task in one job and commits
each one's tables from its ``SharedOutput``. Executor side: no pyspark or deltalake import here.
"""

from __future__ import annotations

import traceback
from dataclasses import replace
from typing import NamedTuple

from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.folded_keys import folded_in_slice
from mongo_cdc.transform.raw_events import ChangeEvent
from mongo_cdc.transform.slice_tasks import (
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


class SharedOutput(NamedTuple):
    """What ``whole_collection`` did with one collection's slice: its plan, the transformed slice and
    the documents folded apart, written (``error``: the traceback of its failure instead)."""

    plan: SlicePlan | None
    folded_documents: int
    transformed: SliceOutput | None
    folded: tuple[StateOutput, ...]
    error: str | None = None


def whole_collection(
    location: LakeLocation,
    raw_slice: RawSlice,
    state: StateSpec | None,
    changes: ChangesSpec | None,
    state_files: tuple[KeyedFile, ...],
) -> SharedOutput:
    """A collection's run whose new rows are the one slice ``raw_slice``, in this one task: the plan,
    the key counts (within one slice, complete), the transformed slice and the fold of the documents
    with more than one event, which are then all in this slice. A failure is returned, not raised, so
    the other collections of the shared job carry on; the driver fails this collection alone."""
    try:
        if state is None:
            return SharedOutput(None, 0, transform_slice(location, raw_slice, None, changes, frozenset()), ())
        plan = plan_slice(location, raw_slice, state.window)
        state = replace(state, drops=tuple(sorted(plan.drops)))
        folded_keys = (
            frozenset() if none_folded_apart([plan]) else folded_in_slice(location, raw_slice, state.window)
        )
        transformed = transform_slice(location, raw_slice, state, changes, folded_keys)
        if not folded_keys:
            return SharedOutput(plan, 0, transformed, ())
        grouped: dict[str, list[ChangeEvent]] = {}
        for key, event in fold_inputs(location, raw_slice, state.window, folded_keys):
            grouped.setdefault(key, []).append(event)
        folded = fold_documents(location, state, state_files, grouped.items())
        return SharedOutput(plan, len(folded_keys), transformed, (folded,))
    except Exception:  # the driver fails this collection alone, with this traceback
        return SharedOutput(None, 0, None, (), traceback.format_exc())
