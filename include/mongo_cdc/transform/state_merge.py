"""How a run's document versions change a state table: one rule, run by two engines.

The rule: a source row (a document's newest version in the run, or its deletion: ``DELETED_FLAG``)
replaces the stored row of its ``__key`` when its position (``__cluster_time``, then
``__event_order``) is after the stored one's, and a deletion deletes it; a key not stored is
inserted, unless deleted. A stored row no source row names is deleted when a copy's manifest or a
drop of its replica set sits after it (``Gone``): that copy did not find the document, or the
collection was dropped since.

``merge_into`` runs the rule as a delta-rs MERGE (DataFusion), which reads and rewrites only the
files whose key range may hold a source key: the way for large tables. ``merged_rows`` runs it in
pyarrow over the whole of a small table (``REWRITE_MAX_ROWS``), in a millisecond or two where a
MERGE takes 15 ms of CPU and holds the GIL throughout: a source of many small collections paid one
MERGE per collection and run (issue 28). ``rewrite`` writes a small table's rows after the run as one
new file, for the driver to commit in place of the table's files; a shared job's task runs it for its
collection (``shared_tasks``), so the driver of many small collections only commits. Executor side:
no deltalake import at run time. tests/unit/test_state_merge.py holds the two engines to the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.data_files import DataFile, write_data_file
from mongo_cdc.transform.slice_tasks import DELETED_FLAG, in_order
from mongo_cdc.transform.slices import lake_path
from mongo_cdc.transform.table_layout import widened

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable

# A table of at most this many rows and bytes of files, whose layout the run keeps, is written again
# whole (``rewrite``) rather than MERGEd; the run's rows too are at most this many.
REWRITE_MAX_ROWS = 10_000
REWRITE_MAX_BYTES = 16 << 20


class Gone(NamedTuple):
    """Stored documents of ``rs`` before this position that no source row names are deleted."""

    rs: str
    cluster_time: int
    event_order: str


def gone_positions(
    manifests: Iterable[SnapshotManifest], drops: Iterable[tuple[tuple[int, str], str]]
) -> list[Gone]:
    """The ``Gone`` positions of a run's committed copies (``manifests``) and drops or renames."""
    return [Gone(rs, *position) for position, rs in [(m.position, m.rs) for m in manifests] + list(drops)]


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
        widened(
            pq.ParquetFile(lake_path(base, f"{target.table_path}/{path}"), filesystem=filesystem).read(),
            target.schema,
        )
        for path in target.stored
    ]
    rows = merged_rows(pa.concat_tables([target.schema.empty_table(), *stored]), source, gone)
    return write_data_file(location, target.table_path, in_order(rows, ["__key"]))


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
                f"(t.__cluster_time = {g.cluster_time} AND t.__event_order < {sql_literal(g.event_order)})))"
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
    of its replica set."""
    time, order, rs = (stored.column(name) for name in ("__cluster_time", "__event_order", "__rs"))
    found = pa.nulls(stored.num_rows, pa.bool_()).fill_null(False)
    for g in gone:
        before = pc.or_kleene(
            pc.less(time, g.cluster_time),
            pc.and_kleene(pc.equal(time, g.cluster_time), pc.less(order, g.event_order)),
        )
        found = pc.or_(found, _fired(pc.and_kleene(pc.equal(rs, g.rs), before)))
    return found
