"""What the driver and its Spark tasks hand each other: the one contract between the two sides.

The driver hands a task how to write each table (``StateSpec``, ``ChangesSpec``: the stored layout,
where the files go, the run's window of batches); a task hands back its slice's plan in brief
(``SlicePlan``), what it wrote (``SliceOutput``, ``StateOutput``, ``Output``: file names and what its
rows need of each table's layout), or a small collection's whole run (``WholeCollectionOutput``).
No per-document data crosses, so the driver's memory does not grow with a run.

Both sides import it: no pyspark or deltalake import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.transform import column_survey
from mongo_cdc.transform.data_files import DataFile
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.folded_keys import KeyRange
from mongo_cdc.transform.stored_rows import KeyedFile
from mongo_cdc.transform.table_layout import TableLayout


class Output(NamedTuple):
    """What a task wrote for one table: its files, and what its rows needed of the table's layout;
    or its rows themselves, unwritten, for the task's own rewrite of the table (``StateSpec.held``)."""

    files: tuple[DataFile, ...]
    survey: column_survey.BatchTypes
    rows: pa.Table | None = None


class StateOutput(NamedTuple):
    """What a task wrote of the state table (None: no rows) and its file of deletion marker rows
    (``write_markers``; None: none)."""

    output: Output | None
    markers: DataFile | None


class SliceOutput(NamedTuple):
    """What ``transform_slice`` wrote of each table."""

    state: StateOutput
    changes: Output | None


class SlicePlan(NamedTuple):
    """A slice's state events in brief (``plan_slice``)."""

    drops: list[tuple[tuple[int, str], str]]  # the drops and renames of the collection, as (position, rs)
    rows: int  # the slice's rows in the run's window
    # the range of its documents' keys in each piece (``folded_keys.key_ranges``); None when a piece
    # holds a document's events more than once, or an update (it may lack ``after``)
    key_ranges: tuple[KeyRange, ...] | None


class WholeCollectionOutput(NamedTuple):
    """What ``whole_collection`` did with one collection's slice: its plan, the transformed slice and
    the documents folded apart, written, and the state table's rows after the run when it wrote them
    whole (``error``: the traceback of its failure instead)."""

    plan: SlicePlan | None
    folded_documents: int
    transformed: SliceOutput | None
    folded: tuple[StateOutput, ...]
    rewritten: DataFile | None = None
    error: str | None = None


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
    deletions: tuple[KeyedFile, ...] = ()  # the deletion markers' files, read for the task's keys
    markers_directory: str = ""  # where the task's deletion marker rows are staged
    # rows that fit the stored layout are kept in memory, not staged (``Output.rows``): the task then
    # writes the table again whole with them (``whole_collection.rewritten_whole``)
    held: bool = False


@dataclass(frozen=True)
class ChangesSpec(TableSpec):
    window: BatchWindow = BatchWindow({})
    options: FlatteningOptions = FlatteningOptions()
