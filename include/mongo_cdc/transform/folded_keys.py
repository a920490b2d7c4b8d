"""Which documents a run folds apart: those with more than one event in the run, or an update without
``after``. Their events are grouped by document before they are folded (``state_commit.fold``);
every other document's one event is folded by the task of its slice.

Each slice's task sums its events per document key with Arrow (``slice_key_buckets``) and hands
Spark one Arrow IPC block per bucket of keys, a bucket being a stable hash of the key (the same key
falls in the same bucket from every slice); one task per bucket sums what the slices sent it
(``folded_keys``) and keeps the keys folded apart only. Spark's shuffle carries a block per slice and
bucket instead of a Python record per key: for a first build, where no document is folded apart,
that shuffle of a record per key took more of the run than the build of the tables.

Most runs of many slices need no such shuffle: a snapshot's slices hold each document once, each
piece of a raw file a range of keys of its own. The plan (``slice_tasks.plan_slice``) gives each
piece's range of keys (``key_ranges``) where its keys are distinct and none of its events is an
update; when those ranges are disjoint (``ranges_disjoint``), no document has more than one event
and none is folded apart, and the buckets are not summed at all.

Runs on the executors, like ``slice_tasks``: pyarrow only.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from itertools import pairwise
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.raw_events import event_keys
from mongo_cdc.transform.raw_slices import RawSlice, collection_operations, read_slice

# What ``BatchWindow.filter`` reads of the raw rows.
_FILTER_COLUMNS = ["source", "batch_seq"]
# What ``slice_key_buckets`` reads of the raw rows: not the documents (``after``), but where a slice
# holds an update.
KEY_COUNT_COLUMNS = ["key", "op", "updateDescription", *_FILTER_COLUMNS]


# A key of an integer _id that int64 holds (``keys.document_key``): its range is taken by number, as a
# snapshot reads _ids in order (as text, the keys of 9 and 10 sort the other way round).
_INTEGER_KEY = r'^\["n","(?P<v>-?[0-9]{1,18})"\]$'


class KeyRange(NamedTuple):
    """The lowest and highest of some document keys: of integer _ids (compared as numbers), or of the
    others (compared as text). A key of one kind never equals a key of the other."""

    integers: bool
    low: int | str
    high: int | str


class KeyCount(NamedTuple):
    """A document folded apart: its events in the run, whether one is an update without ``after``,
    and the indexes of the slices holding them, in order."""

    events: int
    partial: bool
    slices: tuple[int, ...]


def key_bucket(key: str, buckets: int) -> int:
    """The bucket of a document key: the same in every process (Python's own ``hash`` of a string is
    not)."""
    return zlib.crc32(key.encode()) % buckets


def slice_key_buckets(
    location: LakeLocation, index: int, raw_slice: RawSlice, window: BatchWindow, buckets: int
) -> list[tuple[int, bytes]]:
    """The document keys of slice ``index``'s events in the window, each with its events there and
    whether one is an update without ``after``, as ``(bucket, Arrow IPC block)`` pairs."""
    counted = key_counts(
        read_slice(location, raw_slice, window.filter(), KEY_COUNT_COLUMNS),
        # the documents are most of a slice's bytes: read (the same rows again) only for an update
        lambda: read_slice(location, raw_slice, window.filter(), ["after", *_FILTER_COLUMNS]).column("after"),
    )
    if counted is None:
        return []
    counted = counted.append_column("slice", pa.repeat(pa.scalar(index, pa.int32()), counted.num_rows))
    bucket = pa.array([key_bucket(key, buckets) for key in counted.column("key").to_pylist()], pa.int32())
    # in bucket order, each bucket's rows one run: a block per bucket is a slice, not a pass over all
    order = pc.sort_indices(bucket)
    counted, bucket = counted.take(order), bucket.take(order)
    blocks, start = [], 0
    for run in pc.value_counts(bucket).to_pylist():  # runs in order of first appearance: bucket order
        blocks.append((run["values"], _ipc_block(counted.slice(start, run["counts"]))))
        start += run["counts"]
    return blocks


def key_counts(rows: pa.Table, after: Callable[[], pa.ChunkedArray]) -> pa.Table | None:
    """Each document key of raw ``rows`` (``KEY_COUNT_COLUMNS``, in the window) with its events
    (``partial_count``) and whether one is an update without ``after`` (``partial_any``; ``after``
    gives the rows' after column, asked for only when the rows hold such an update); None when no row
    is a document's."""
    keyed_rows = pc.and_(pc.invert(collection_operations(rows)), pc.is_valid(rows.column("op")))
    keyed = rows.filter(keyed_rows)
    if not keyed.num_rows:
        return None
    keys, _ = event_keys(keyed.column("key"))
    partial = pc.fill_null(
        pc.and_(pc.equal(keyed.column("op"), "u"), pc.is_valid(keyed.column("updateDescription"))), False
    )
    if pc.any(partial).as_py():  # only an update may lack its after
        partial = pc.and_(partial, pc.is_null(after().filter(keyed_rows)))
    return (
        pa.table({"key": keys, "partial": partial})
        .group_by("key")
        .aggregate([("partial", "count"), ("partial", "any")])
    )


def key_ranges(keys: pa.Array) -> list[KeyRange]:
    """The range of ``keys`` (normalised, none null): of the integer ones and of the others."""
    digits = pc.struct_field(pc.extract_regex(keys, _INTEGER_KEY), "v")
    integer = pc.is_valid(digits)
    ranges = []
    for integers, values in (
        (True, pc.cast(digits.filter(integer), pa.int64())),
        (False, keys.filter(pc.invert(integer))),
    ):
        if len(values):
            bounds = pc.min_max(values)
            ranges.append(KeyRange(integers, bounds["min"].as_py(), bounds["max"].as_py()))
    return ranges


def ranges_disjoint(ranges: Iterable[KeyRange]) -> bool:
    """Whether no key can be in two of ``ranges``."""
    ranges = list(ranges)
    for integers in (True, False):
        ordered = sorted((r.low, r.high) for r in ranges if r.integers is integers)
        if any(later[0] <= earlier[1] for earlier, later in pairwise(ordered)):
            return False
    return True


def folded_keys(blocks: Iterable[bytes]) -> list[tuple[str, KeyCount]]:
    """The keys folded apart among one bucket's blocks (``slice_key_buckets``), summed over the slices."""
    counted = pa.concat_tables(pa.ipc.open_stream(block).read_all() for block in blocks)
    summed = counted.group_by("key").aggregate(
        [("partial_count", "sum"), ("partial_any", "any"), ("slice", "list")]
    )
    folded = summed.filter(
        _folded_apart(summed.column("partial_count_sum"), summed.column("partial_any_any"))
    )
    # sorted: Arrow's threaded group-by lists a key's slices in whichever order its threads ran
    return [
        (key, KeyCount(events, partial, tuple(sorted(slices))))
        for key, events, partial, slices in zip(
            folded.column("key").to_pylist(),
            folded.column("partial_count_sum").to_pylist(),
            folded.column("partial_any_any").to_pylist(),
            folded.column("slice_list").to_pylist(),
            strict=True,
        )
    ]


def folded_in_rows(rows: pa.Table) -> frozenset[str]:
    """The keys folded apart in a run whose events are all ``rows`` (the raw rows of a shared task's one
    slice in the window, every column read)."""
    counted = key_counts(rows, lambda: rows.column("after"))
    if counted is None:
        return frozenset()
    folded = _folded_apart(counted.column("partial_count"), counted.column("partial_any"))
    return frozenset(counted.column("key").filter(folded).to_pylist())


def _folded_apart(events: pa.ChunkedArray, partial: pa.ChunkedArray) -> pa.ChunkedArray:
    """Which keys are folded apart: those with more than one event, or an update without ``after``."""
    return pc.or_(pc.greater(events, 1), partial)


def _ipc_block(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
