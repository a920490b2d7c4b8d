"""A large state table's MERGE run by Spark's executors, one contiguous range of keys per task.

The driver plans from file lists only, never rows (``merge_ranges``): the table's files with their
``__key`` bounds (``stored_rows.keyed_files``) and the staged source files with theirs (the footer
statistics each ``DataFile`` carries, ``source_key_bounds``). Stored files whose bounds overlap,
directly or through others, form a group (``key_groups``); the key space is cut at the groups'
lower bounds, so each group owns the keys from its lowest bound up to the next group's, and no file
of another group can hold one of them. The groups some source file may reach (every group when a
copy's manifest or a drop, ``Gone``, may delete any stored row) are batched in key order into at
most the tasks asked for, with about as many files each, each batch a ``MergeRange``: from its
first group's range to its last one's, its groups' files and the source files that may hold a key
of it. A group no source file reaches is left out: no source key is in its range. A file of unknown bounds
could hold any key, so it makes the whole table one range (one task), which stays correct.

Each task (``merge_range``) reads its range's source rows from the staged files and runs
``state_merge.merge_files`` over its stored files: a source key of its range in none of them is
new. It writes the replacements and the new files and hands back only their names, the paths it
replaces and row counts (``MergedFiles``); the driver commits every task's files in one commit
(``state_commit.StateRun.merge``). Neither the table's rows nor the run's pass through the driver.
Executor side: no deltalake import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc.lake.file_statistics import FileStatistics
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.data_files import KEY_PATH, DataFile, staged_rows
from mongo_cdc.transform.state_merge import Gone, MergedFiles, merge_files
from mongo_cdc.transform.stored_rows import KeyedFile
from mongo_cdc.transform.table_formats import staged_schema


class MergeRange(NamedTuple):
    """One task's share of a MERGE: the keys from ``low`` (inclusive) up to ``high`` (exclusive; None:
    unbounded), the stored files that hold every stored row of them, and the staged source files
    (relative to the staging directory) that may hold one."""

    low: str | None
    high: str | None
    stored: tuple[KeyedFile, ...]
    source: tuple[DataFile, ...]


def source_key_bounds(file: DataFile) -> tuple[str | None, str | None]:
    """A staged file's ``__key`` bounds from the statistics its writer took from the footer (None:
    unknown; a string bound is a truncated prefix, still a bound)."""
    bounds = FileStatistics.from_json(file.stats).bounds.get(KEY_PATH)
    return (None, None) if bounds is None else bounds


def key_groups(stored: Sequence[KeyedFile]) -> list[list[KeyedFile]]:
    """``stored`` in groups of files whose key bounds overlap (directly or through others), in key
    order; one group of them all if a file's bounds are unknown."""
    if any(file.min_key is None or file.max_key is None for file in stored):
        return [list(stored)] if stored else []
    groups: list[list[KeyedFile]] = []
    high = ""
    for file in sorted(stored, key=lambda file: file.min_key or ""):
        assert file.min_key is not None and file.max_key is not None
        if groups and file.min_key <= high:
            groups[-1].append(file)
            high = max(high, file.max_key)
        else:
            groups.append([file])
            high = file.max_key
    return groups


def merge_ranges(
    stored: Sequence[KeyedFile], source: Sequence[DataFile], gone: Sequence[Gone], tasks: int
) -> list[MergeRange]:
    """The MERGE of ``source`` (staged files) into ``stored`` cut into at most ``tasks`` ranges, in key
    order, each with about as many stored files to read as the others; a range neither a source file
    nor ``gone`` reaches is left out."""
    groups = key_groups(stored)
    if not groups:
        return [MergeRange(None, None, (), tuple(source))] if source else []
    lows = [None, *(group[0].min_key for group in groups[1:])]
    ranges = list(zip(lows, [*lows[1:], None], strict=True))
    bounds = [source_key_bounds(file) for file in source]
    # the groups some source file or ``gone`` reaches; the others' ranges hold no source key, so
    # their files stay as they are and no task reads them
    reached = [
        index
        for index, (low, high) in enumerate(ranges)
        if gone or any(_overlaps(low, high, file_bounds) for file_bounds in bounds)
    ]
    count = max(1, min(tasks, len(reached)))
    total = sum(len(groups[index]) for index in reached)
    batches: list[list[int]] = [[]]
    done = 0
    for position, index in enumerate(reached):
        batches[-1].append(index)
        done += len(groups[index])
        # about as many files in each batch: cut where the files so far reach the next share
        if done * count >= total * len(batches) and position < len(reached) - 1:
            batches.append([])
    planned = []
    for batch in (batch for batch in batches if batch):
        low, high = ranges[batch[0]][0], ranges[batch[-1]][1]
        planned.append(
            MergeRange(
                low,
                high,
                tuple(file for index in batch for file in groups[index]),
                tuple(
                    file
                    for file, file_bounds in zip(source, bounds, strict=True)
                    if _overlaps(low, high, file_bounds)
                ),
            )
        )
    return planned


def _overlaps(low: str | None, high: str | None, bounds: tuple[str | None, str | None]) -> bool:
    """Whether a file of key ``bounds`` (None: unknown) may hold a key in [low, high)."""
    first, last = bounds
    return (high is None or first is None or first < high) and (low is None or last is None or last >= low)


def merge_range(
    location: LakeLocation,
    table_path: str,
    staging: str,
    schema: pa.Schema,
    part: MergeRange,
    gone: Sequence[Gone],
) -> MergedFiles:
    """One task's MERGE: the source rows of ``part``'s range (from its staged files under
    ``staging``) applied to its stored files (``merge_files``, the table's ``schema``); the files
    written, none committed."""
    rows = staged_rows(location, staging, list(part.source), staged_schema(schema))
    source = pa.concat_tables(
        [
            staged_schema(schema).empty_table(),
            *(pa.table(batch).filter(_in_range(batch, part)) for batch in rows),
        ]
    )
    return merge_files(location, table_path, part.stored, schema, source, gone)


def _in_range(batch: pa.RecordBatch, part: MergeRange) -> pa.Array:
    """Where ``batch``'s keys are in ``part``'s range."""
    keys = batch.column("__key")
    inside = pa.array([True] * batch.num_rows, pa.bool_())
    if part.low is not None:
        inside = pc.and_(inside, pc.greater_equal(keys, part.low))
    if part.high is not None:
        inside = pc.and_(inside, pc.less(keys, part.high))
    return inside


def merged_together(outputs: Sequence[MergedFiles]) -> MergedFiles:
    """What every range's task wrote (``merge_range``), as one MERGE's: for the driver's one commit."""
    return MergedFiles(
        tuple(path for output in outputs for path in output.removed),
        tuple(file for output in outputs for file in output.written),
        sum(output.rows_removed for output in outputs),
        sum(output.rows_added for output in outputs),
    )
