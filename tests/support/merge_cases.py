"""The state merge's test cases and the MERGE by ranges run over them, for the unit tier (its tasks
run in turn here) and the e2e tier (its tasks run on Spark): a table's stored rows and a run's
source rows as ``state_merge``'s rule takes them, the stored rows written as files with their key
bounds, the source staged in files as the slices' tasks stage theirs; and the model-based suite's
check of a job's every MERGE against the reference (``merges_by_ranges_checked``)."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, write_deltalake

from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.lake.table_reads import plain
from mongo_cdc.transform import state_commit
from mongo_cdc.transform.data_files import DataFile, staged_rows, write_data_file
from mongo_cdc.transform.merge_ranges import (
    MergeRange,
    merge_range,
    merge_ranges,
    merged_together,
    source_key_bounds,
)
from mongo_cdc.transform.raw_slices import lake_path
from mongo_cdc.transform.state_commit import StateRun
from mongo_cdc.transform.state_merge import Gone, MergedFiles, merge_into
from mongo_cdc.transform.stored_rows import KeyedFile, keyed_files
from mongo_cdc.transform.table_formats import DELETED_FLAG, staged_schema
from mongo_cdc.transform.table_layout import TableLayout

SCHEMA = pa.schema(
    [
        ("__key", pa.string()),
        ("__cluster_time", pa.int64()),
        ("__event_order", pa.string()),
        ("__rs", pa.string()),
        ("v", pa.int64()),
    ]
)
SOURCE_SCHEMA = SCHEMA.append(pa.field(DELETED_FLAG, pa.bool_()))
# the state's columns the merge rule decides by, and the document: which version each key kept
MERGED_COLUMNS = ["__key", "__doc_bson", "__cluster_time", "__event_order", "__rs"]

# How a MERGE's ranges run: in turn in this process, or as Spark tasks (e2e).
RunRanges = Callable[[Sequence[MergeRange], Callable[[MergeRange], MergedFiles]], list[MergedFiles]]


def rows(schema: pa.Schema, items: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, item, strict=True)) for item in items], schema=schema)


def stated_case() -> tuple[pa.Table, pa.Table, list[Gone]]:
    """Each clause of the rule once: stored rows, source rows, a copy's position."""
    stored = rows(
        SCHEMA,
        [
            ("updated", 10, "b", "rs0", 1),
            ("older update", 10, "b", "rs0", 2),
            ("deleted", 10, "b", "rs0", 3),
            ("older deletion", 10, "b", "rs0", 4),
            ("not found by the copy", 10, "b", "rs0", 5),
            ("after the copy", 30, "", "rs0", 6),
            ("of another replica set", 10, "b", "rs1", 7),
            ("named, not newer", 10, "b", "rs0", 8),
        ],
    )
    source = rows(
        SOURCE_SCHEMA,
        [
            ("updated", 10, "c", "rs0", 10, False),  # same time, later order: newer
            ("older update", 10, "a", "rs0", 20, False),
            ("deleted", 11, "", "rs0", None, True),
            ("older deletion", 9, "z", "rs0", None, True),
            ("inserted", 12, "a", "rs0", 90, False),
            ("deleted, never stored", 12, "a", "rs0", None, True),
            ("named, not newer", 10, "b", "rs0", 80, False),  # the same position: not after
        ],
    )
    return stored, source, [Gone("rs0", 20, "")]


def random_case(seed: int) -> tuple[pa.Table, pa.Table, list[Gone], random.Random]:
    """Stored and source rows of 30 keys drawn from ``seed`` (ties of position, deletions, two
    replica sets, up to two copies' or drops' positions), and the draw, for the case's other choices."""
    draw = random.Random(seed)

    def position() -> tuple[int, str]:
        return draw.randint(1, 4), draw.choice(["", "a", "b"])

    keys = [f"k{index}" for index in range(30)]
    stored = rows(
        SCHEMA,
        [
            (key, *position(), draw.choice(["rs0", "rs1"]), index)
            for index, key in enumerate(keys)
            if draw.random() < 0.6
        ],
    )
    source = rows(
        SOURCE_SCHEMA,
        [
            (key, *position(), draw.choice(["rs0", "rs1"]), 100 + index, draw.random() < 0.3)
            for index, key in enumerate(keys)
            if draw.random() < 0.5
        ],
    )
    gone = [Gone(draw.choice(["rs0", "rs1"]), *position()) for _ in range(draw.randint(0, 2))]
    return stored, source, gone, draw


def by_merge_into(root: Path, stored: pa.Table, source: pa.Table, gone: list[Gone]) -> list[dict]:
    """The table's rows after the reference, a delta-rs MERGE (``merge_into``), sorted by key."""
    write_deltalake(root, stored, mode="overwrite")
    table = DeltaTable(root)
    merge_into(table, source, gone, CommitProperties())
    assert table.version() == DeltaTable(root).version()  # the object is at the new version
    return table.to_pyarrow_table().cast(SCHEMA).sort_by("__key").to_pylist()


def stored_in_files(
    location: LakeLocation, stored: pa.Table, files: int, overlapping: bool = False
) -> tuple[KeyedFile, ...]:
    """``stored`` written as ``files`` files of disjoint key ranges under ``state`` (and, if
    ``overlapping``, every third row moved to one more file spanning them), with the key bounds of
    their footer statistics, as a Delta log would hold them (``keyed_files``)."""
    ordered = stored.sort_by("__key")
    spanning = pa.array([overlapping and index % 3 == 1 for index in range(ordered.num_rows)], pa.bool_())
    parts = [ordered.filter(pc.invert(spanning))]
    size = -(-parts[0].num_rows // files) or 1
    parts = [parts[0].slice(start, size) for start in range(0, parts[0].num_rows, size)]
    parts += [ordered.filter(spanning)] if overlapping else []
    written = [write_data_file(location, "state", part) for part in parts if part.num_rows]
    actions = pa.table(
        {
            "path": [file.path for file in written],
            "min": [{"__key": source_key_bounds(file)[0]} for file in written],
            "max": [{"__key": source_key_bounds(file)[1]} for file in written],
        }
    )
    return keyed_files(actions, "state")


def in_turn(parts: Sequence[MergeRange], task: Callable[[MergeRange], MergedFiles]) -> list[MergedFiles]:
    return [task(part) for part in parts]


def by_ranges(
    root: Path,
    stored: pa.Table,
    source: pa.Table,
    gone: list[Gone],
    files: int = 3,
    tasks: int = 3,
    overlapping: bool = False,
    run: RunRanges = in_turn,
) -> tuple[list[dict], MergedFiles, tuple[KeyedFile, ...]]:
    """The table's rows after the MERGE by ranges (``stored`` as ``stored_in_files``, ``source``
    staged in files of 4 rows, as the slices' tasks stage theirs: unsorted across files), sorted by
    key; what the ranges' tasks wrote, summed; the stored files. No two ranges read one file."""
    location = LakeLocation(str(root))
    stored_files = stored_in_files(location, stored, files, overlapping)
    staged = [
        write_data_file(location, "staging", source.slice(start, 4)) for start in range(0, len(source), 4)
    ]
    parts = merge_ranges(stored_files, staged, gone, tasks)
    assert len(parts) <= tasks
    read = [file.path for part in parts for file in part.stored]
    assert len(read) == len(set(read)), "a stored file is in two ranges"
    merged = merged_together(
        run(parts, lambda part: merge_range(location, "state", "staging", SCHEMA, part, gone))
    )
    kept = [file for file in stored_files if file.path not in merged.removed]
    tables = [pq.read_table(root / file.path) for file in kept]
    tables += [pq.read_table(root / "state" / file.path) for file in merged.written]
    after = pa.concat_tables([SCHEMA.empty_table(), *(table.cast(SCHEMA) for table in tables)])
    assert merged.rows_added - merged.rows_removed == after.num_rows - stored.num_rows
    return after.sort_by("__key").to_pylist(), merged, stored_files


@contextmanager
def merges_by_ranges_checked() -> Iterator[None]:
    """Every update of an existing state table in this process by the MERGE on Spark's tasks (no
    table is small enough to write again whole), each checked against ``merge_into``."""
    by_tasks = StateRun.merged_by_tasks

    def checked(run: StateRun, layout: TableLayout, files: list[DataFile], gone: list[Gone]) -> MergedFiles:
        merged = by_tasks(run, layout, files, gone)
        assert_the_reference_merge_agrees(run, layout, files, gone, merged)
        return merged

    with (
        mock.patch.object(state_commit, "REWRITE_MAX_ROWS", -1),
        mock.patch.object(StateRun, "merged_by_tasks", checked),
    ):
        yield


def assert_the_reference_merge_agrees(
    run: StateRun, layout: TableLayout, files: list[DataFile], gone: list[Gone], merged: MergedFiles
) -> None:
    """The rows the tasks' files give (the table's files as read, less those ``merged`` removes, and
    those it wrote) are those delta-rs' MERGE gives from the same stored and staged source rows."""
    assert run.table is not None
    location, state_path = run.collection_run.location, run.collection_run.state_path
    filesystem, base = location.filesystem()
    source = staged_rows(location, run.directory, files, staged_schema(layout.schema)).read_all()
    stored = plain(run.table.to_pyarrow_table(columns=MERGED_COLUMNS))
    with tempfile.TemporaryDirectory() as reference:
        write_deltalake(reference, stored)
        table = DeltaTable(reference)
        merge_into(table, plain(source.select([*MERGED_COLUMNS, DELETED_FLAG])), gone, CommitProperties())
        expected = _by_key(table.to_pyarrow_table(columns=MERGED_COLUMNS))
    kept = [file.path for file in run.state_files if file.path not in merged.removed]
    written = [f"{state_path}/{file.path}" for file in merged.written]
    parts = [
        plain(pq.read_table(lake_path(base, path), filesystem=filesystem, columns=MERGED_COLUMNS))
        for path in kept + written
    ]
    after = _by_key(pa.concat_tables(parts)) if parts else []
    assert after == expected, f"{run.collection_run.namespace}: the MERGE by ranges is not merge_into's"


def _by_key(rows: pa.Table) -> list[dict]:
    return plain(rows).sort_by("__key").to_pylist()
