"""How a run's document versions change a state table: one rule, run by two engines.

The rule: a source row (a document's newest version in the run, or its deletion: ``DELETED_FLAG``)
replaces the stored row of its ``__key`` when its position (``__cluster_time``, then
``__event_order``) is after the stored one's, and a deletion deletes it; a key not stored is
inserted, unless deleted. A stored row no source row names is deleted when a copy's manifest or a
drop of its replica set sits after it (``Gone``): that copy did not find the document, or the
collection was dropped since.

``merged_rows`` runs the rule in pyarrow over a set of stored rows. ``merge_files`` runs it file by
file over a large table: only the files whose key range may hold a source key are read, each one
that changes is written again (``write_data_file``: the table's own types, full statistics), and the
source's new keys go to new files of disjoint key ranges; each Spark task of a large table's MERGE
runs it over its range of keys (``merge_ranges``), and the driver commits every task's files in one
Delta commit. ``rewrite`` writes a small table's rows after the run (``REWRITE_MAX_ROWS``) as one
new file, for the driver to commit in place of the table's files; a shared job's task runs it for
its collection (``whole_collection``), so the driver of many small collections only commits.
``merge_into`` runs the rule as a delta-rs MERGE (DataFusion): the reference the other two are
tested against (tests/unit/test_state_merge.py), not used by a run, since a MERGE writes its files'
text as ``string_view``, which no pyarrow filter of the table can compare with the table's
``string``. Executor side: no deltalake import at run time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mongo_cdc.id_ranges import IdRange
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.data_files import DataFile, write_data_file
from mongo_cdc.transform.raw_slices import lake_path
from mongo_cdc.transform.slice_tasks import in_order
from mongo_cdc.transform.stored_rows import KeyedFile
from mongo_cdc.transform.table_formats import DELETED_FLAG
from mongo_cdc.transform.table_layout import widened

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable

# A table of at most this many rows and bytes of files, whose layout the run keeps, is written again
# whole (``rewrite``) rather than MERGEd; the run's rows too are at most this many.
REWRITE_MAX_ROWS = 10_000
REWRITE_MAX_BYTES = 16 << 20
# A MERGE's new keys go to files of at most this many rows (in key order: disjoint key ranges).
NEW_FILE_ROWS = 250_000


class Gone(NamedTuple):
    """Stored documents of ``rs`` before this position that no source row names are deleted; only
    those whose ``_id`` is in ``id_range`` (``IdRange.text``) when there is one."""

    rs: str
    cluster_time: int
    event_order: str
    id_range: str | None = None


def gone_positions(
    manifests: Iterable[SnapshotManifest], drops: Iterable[tuple[tuple[int, str], str]]
) -> list[Gone]:
    """The ``Gone`` positions of a run's committed copies (``manifests``) and drops or renames."""
    copies = [Gone(m.rs, *m.position, m.id_range) for m in manifests]
    return copies + [Gone(rs, *position) for position, rs in drops]


class Rewrite(NamedTuple):
    """A small state table to write again whole: its directory under the lake root, its layout's
    schema, and its data files (paths relative to the directory), all of which the commit removes."""

    table_path: str
    schema: pa.Schema
    stored: tuple[str, ...]


def rewrite(location: LakeLocation, target: Rewrite, source: pa.Table, gone: Sequence[Gone]) -> DataFile:
    """The table's rows after the run (``merged_rows`` of its files' rows and ``source``: rows of its
    schema and ``DELETED_FLAG``) written as one new file of the table, which no commit names yet."""
    filesystem, base = location.filesystem()
    stored = [
        _stored_rows(filesystem, base, f"{target.table_path}/{path}", target.schema) for path in target.stored
    ]
    rows = merged_rows(pa.concat_tables([target.schema.empty_table(), *stored]), source, gone)
    return write_data_file(location, target.table_path, in_order(rows, ["__key"]))


class MergedFiles(NamedTuple):
    """What ``merge_files`` wrote: the table's files it replaces (paths under the lake root), the new
    files, and the table's rows that were removed and added by them."""

    removed: tuple[str, ...]
    written: tuple[DataFile, ...]
    rows_removed: int
    rows_added: int


def merge_files(
    location: LakeLocation,
    table_path: str,
    stored: Sequence[KeyedFile],
    schema: pa.Schema,
    source: pa.Table,
    gone: Sequence[Gone],
) -> MergedFiles:
    """The rule over a table's files: ``stored`` (each file's path under the lake root and its
    ``__key`` bounds, None where unknown: ``state_commit.keyed_files``), ``source`` (rows of
    ``schema`` and ``DELETED_FLAG``, one per key). A file is read when a source key may be in it
    (every file when ``gone`` may delete any stored row) and written again when the rule changes its
    rows. Nothing is committed.

    The files stay clustered by key: when ``stored`` have known, disjoint key ranges, a new key
    inside a file's range is written with that file's rows, and the others go to new files cut at
    the stored files' bounds, so every file keeps a key range of its own and a later run that
    touches a range of keys rewrites only the files of that range. Each file written holds at most
    ``NEW_FILE_ROWS`` rows, or as many as the file it replaces held. Files of unknown or overlapping
    ranges (a lake written before its statistics, until compaction sorts it) keep the rows they
    hold, and every new key goes to new files."""
    filesystem, base = location.filesystem()
    source = in_order(source, ["__key"])
    keys = source.column("__key")
    clustered = _disjoint(stored)
    claimed = pa.array([False] * source.num_rows, pa.bool_())  # typed: a range may have no source row
    removed, written, rows_removed, rows_added = [], [], 0, 0
    for path, low, high in stored:
        known = low is not None and high is not None
        in_range = pc.and_(pc.greater_equal(keys, low), pc.less_equal(keys, high)) if known else None
        if not gone and in_range is not None and not pc.any(in_range).as_py():
            continue
        rows = _stored_rows(filesystem, base, path, schema)
        taken = pc.is_in(keys, value_set=rows.column("__key"))
        if clustered and in_range is not None:
            taken = pc.or_(taken, in_range)  # disjoint ranges: a key in this one is stored here or new
        claimed = pc.or_(claimed, taken)
        after = merged_rows(rows, source.filter(taken), gone)
        if _same_versions(rows, after):
            continue
        removed.append(path)
        rows_removed += rows.num_rows
        for part in _parts(in_order(after, ["__key"]), max(rows.num_rows, NEW_FILE_ROWS)):
            written.append(write_data_file(location, table_path, part))
            rows_added += part.num_rows
    new = source.filter(pc.and_(pc.invert(claimed), pc.invert(source.column(DELETED_FLAG))))
    new = new.drop_columns([DELETED_FLAG])
    cuts = sorted(low for _, low, _ in stored) if clustered else []
    for between in _cut(new, cuts):
        for part in _parts(between, NEW_FILE_ROWS):
            written.append(write_data_file(location, table_path, part))
    return MergedFiles(tuple(removed), tuple(written), rows_removed, rows_added + new.num_rows)


def _disjoint(stored: Sequence[KeyedFile]) -> bool:
    """Whether every file's key bounds are known and no two files' ranges overlap."""
    if any(low is None or high is None for _, low, high in stored):
        return False
    ranges = sorted((low, high) for _, low, high in stored)
    return all(high < following for (_, high), (following, _) in pairwise(ranges))


def _cut(rows: pa.Table, cuts: Sequence[str]) -> Iterable[pa.Table]:
    """``rows`` (in key order) in runs that no key of ``cuts`` falls inside: the new keys between
    two stored files go to files of their own, which overlap neither."""
    keys, start = rows.column("__key"), 0
    for cut in cuts:
        end = pc.sum(pc.less(keys, cut)).as_py() or 0
        if end > start:
            yield rows.slice(start, end - start)
            start = end
    if start < rows.num_rows:
        yield rows.slice(start)


def _parts(rows: pa.Table, most: int) -> Iterable[pa.Table]:
    """``rows`` in slices of at most ``most`` rows, in order."""
    for start in range(0, rows.num_rows, most):
        yield rows.slice(start, most)


def _stored_rows(filesystem: Any, base: str, path: str, schema: pa.Schema) -> pa.Table:
    """The rows of the table's data file at ``path`` (under the lake root) as rows of ``schema``."""
    return widened(pq.ParquetFile(lake_path(base, path), filesystem=filesystem).read(), schema)


def _same_versions(before: pa.Table, after: pa.Table) -> bool:
    """Whether ``after`` holds the very versions ``before`` does (the rule changed nothing)."""
    if before.num_rows != after.num_rows:
        return False
    position = ["__key", "__cluster_time", "__event_order"]
    return in_order(before.select(position), position).equals(in_order(after.select(position), position))


def merge_into(
    table: DeltaTable,
    source: pa.Table | pa.RecordBatchReader,
    gone: Sequence[Gone],
    commit_properties: CommitProperties,
) -> dict[str, Any]:
    """The rule as one MERGE into ``table`` (``source``: rows of its schema and ``DELETED_FLAG``; a
    table in memory lets delta-rs skip the files no source key may be in, a reader is streamed); its
    metrics. ``table`` is at the new version afterwards."""
    merger = table.merge(
        source,
        predicate="t.__key = s.__key",
        source_alias="s",
        target_alias="t",
        merge_schema=True,
        streamed_exec=isinstance(source, pa.RecordBatchReader),
        commit_properties=commit_properties,
    )
    newer = position_after("s", "t")
    merger = merger.when_matched_delete(predicate=f"s.{DELETED_FLAG} AND {newer}")
    merger = merger.when_matched_update_all(
        predicate=f"NOT s.{DELETED_FLAG} AND {newer}", except_cols=[DELETED_FLAG]
    )
    merger = merger.when_not_matched_insert_all(predicate=f"NOT s.{DELETED_FLAG}", except_cols=[DELETED_FLAG])
    if gone:
        merger = merger.when_not_matched_by_source_delete(
            predicate=" OR ".join(
                f"(t.__rs = {sql_literal(g.rs)} AND (t.__cluster_time < {g.cluster_time} OR "
                f"(t.__cluster_time = {g.cluster_time} AND t.__event_order < {sql_literal(g.event_order)}))"
                f"{_in_range_sql(table, g.id_range)})"
                for g in gone
            )
        )
    return merger.execute()


def merged_rows(stored: pa.Table, source: pa.Table, gone: Sequence[Gone]) -> pa.Table:
    """The rule over the whole table in memory: ``stored`` (every row of the table) and ``source``
    (rows of the same schema and ``DELETED_FLAG``, one per key) give the table's rows afterwards.
    Predicates follow SQL's three-valued logic, as the MERGE's do: a clause whose predicate is null
    does not fire."""
    index = pc.index_in(source.column("__key"), value_set=stored.column("__key"))  # null: a new key
    time, order = source.column("__cluster_time"), source.column("__event_order")
    stored_time, stored_order = (
        stored.column("__cluster_time").take(index),
        stored.column("__event_order").take(index),
    )
    newer = pc.or_kleene(
        pc.greater(time, stored_time),
        pc.and_kleene(pc.equal(time, stored_time), pc.greater(order, stored_order)),
    )
    deleted = source.column(DELETED_FLAG)
    matched = pc.is_valid(index)
    # the stored rows a source row deletes or updates
    replaces = pc.or_(_fired(pc.and_kleene(deleted, newer)), _fired(pc.and_kleene(pc.invert(deleted), newer)))
    kept_source = pc.if_else(
        matched, _fired(pc.and_kleene(pc.invert(deleted), newer)), _fired(pc.invert(deleted))
    )
    replaced = pc.is_in(pa.array(range(stored.num_rows), index.type), value_set=index.filter(replaces))
    named = pc.is_in(stored.column("__key"), value_set=source.column("__key"))
    removed = pc.or_(replaced, pc.and_(pc.invert(named), _gone(stored, gone)))
    kept_stored = stored.filter(pc.invert(removed))
    return pa.concat_tables([kept_stored, source.filter(kept_source).drop_columns([DELETED_FLAG])])


def _in_range_sql(table: DeltaTable, id_range: str | None) -> str:
    """SQL narrowing a ``Gone`` to the stored keys in its ``_id`` range: SQL has no MongoDB order
    over normalised keys, so the reference lists the table's keys ``id_ranges`` places in it."""
    if id_range is None:
        return ""
    keys = table.to_pyarrow_table(columns=["__key"]).column("__key")
    held = keys.filter(IdRange.of_text(id_range).holds_keys(keys)).to_pylist()
    return f" AND t.__key IN ({', '.join(map(sql_literal, held))})" if held else " AND FALSE"


def position_after(left: str, right: str) -> str:
    """SQL: ``left``'s position is after ``right``'s."""
    return (
        f"({left}.__cluster_time > {right}.__cluster_time OR ({left}.__cluster_time = {right}.__cluster_time "
        f"AND {left}.__event_order > {right}.__event_order))"
    )


def sql_literal(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def _fired(predicate: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Where a clause's predicate fires: true, not null."""
    return pc.fill_null(predicate, False)


def _gone(stored: pa.Table, gone: Sequence[Gone]) -> pa.ChunkedArray | pa.Array:
    """Where the not-matched-by-source clause fires for each stored row: before a ``Gone`` position
    of its replica set (and in its ``_id`` range, if it has one)."""
    time, order, rs = (stored.column(name) for name in ("__cluster_time", "__event_order", "__rs"))
    found = pa.nulls(stored.num_rows, pa.bool_()).fill_null(False)
    for g in gone:
        before = pc.or_kleene(
            pc.less(time, g.cluster_time),
            pc.and_kleene(pc.equal(time, g.cluster_time), pc.less(order, g.event_order)),
        )
        fires = _fired(pc.and_kleene(pc.equal(rs, g.rs), before))
        if g.id_range is not None and pc.any(fires).as_py():
            # only the rows the position condemns are placed in the range: a key at a time
            candidates = pc.indices_nonzero(fires)
            held = IdRange.of_text(g.id_range).holds_keys(stored.column("__key").take(candidates))
            fires = pc.is_in(pa.array(range(stored.num_rows), pa.uint64()), value_set=candidates.filter(held))
        found = pc.or_(found, fires)
    return found
