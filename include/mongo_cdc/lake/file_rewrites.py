"""Writing a table's data files again: the same rows, in the table's own Arrow types, with statistics.

Three things write a table's files again, and all through ``rewrite_files``:

- **Healing** (``files_to_heal``): a file that lacks the statistics of a column its table indexes (a
  lake written before ``file_statistics``), or that holds ``string_view``/``binary_view`` or
  ``large_*`` columns where the table is ``string``/``binary`` (a delta-rs MERGE or DELETE wrote it).
  deltalake's pyarrow readers prune the first on any predicate of that column (0 rows, no error) and
  fail on the second (``Function 'equal' has no kernel matching input types (string,
  string_view)``).
- **After a delta-rs MERGE or DELETE** (``normalize_last_commit``): the files it added are written
  again at once, so the next version holds the table's own types.
- **Compaction** (``compact``): a partition's small files, read in the order of their first key and
  written again sorted by ``cluster_by`` (the state's ``__key``) into files of at most
  ``COMPACT_TARGET_BYTES``, so each file holds a narrow key range a point lookup opens alone.

Each is one commit that removes the old files and adds the new ones with ``dataChange`` false: the
rows are the same, so readers of the table's changes (and its app transactions) see nothing new. A
crash before the commit leaves only files no log names, which vacuum deletes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import RemoveAction

from mongo_cdc.lake.file_statistics import (
    NUM_INDEXED_COLUMNS_PROPERTY,
    STATS_COLUMNS_PROPERTY,
    FileStatistics,
    bounded,
    indexed_columns_property,
    leaf_columns,
    table_indexed_columns,
)
from mongo_cdc.lake.layout import STAGING_DIR, ZONES
from mongo_cdc.lake.raw_files import write_files
from mongo_cdc.lake.storage import LakeLocation, resolve_root
from mongo_cdc.lake.table_reads import plain_schema

# Compaction's files: a partition's files under this size are written again together, into files
# of about this size (delta-rs' OPTIMIZE targets 100 MB; smaller files let a point lookup read less).
COMPACT_TARGET_BYTES = 64 << 20
# The table property a healed table carries: its files were checked once (their footers read), and
# every writer since writes files that need no healing.
HEALED_PROPERTY = "mongo_cdc.files.healed"
# The commit metadata key naming which rewrite a commit is (its history's entry), and compaction's name.
OPERATION_METADATA = "mongo_cdc.operation"
COMPACTION = "compaction"


@dataclass(frozen=True)
class StoredFile:
    """One data file of a table version, as its add action describes it."""

    path: str
    size: int
    partition: dict[str, str | None]
    statistics: FileStatistics
    first_key: Any = None  # the minimum of the compaction's cluster column, where the log holds it


def stored_files(table: DeltaTable, cluster_by: str | None = None) -> list[StoredFile]:
    """The data files of ``table``'s current version, with their statistics as delta-rs reads them
    (what its readers prune by)."""
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    files = []
    for action in actions:
        statistics = _read_statistics(action)
        first = None if cluster_by is None else statistics.bounds.get((cluster_by,))
        partition = {
            name[len("partition.") :]: value
            for name, value in action.items()
            if name.startswith("partition.")
        }
        files.append(
            StoredFile(
                action["path"],
                action["size_bytes"],
                partition,
                statistics,
                None if first is None else first[0],
            )
        )
    return files


def _read_statistics(action: dict[str, Any]) -> FileStatistics:
    """A flattened add action's statistics (a column with no value of a kind: none of it)."""
    nulls, low, high = {}, {}, {}
    for name, value in action.items():
        kind, _, column = name.partition(".")
        if value is None or not column:
            continue
        path = tuple(column.split("."))
        {"null_count": nulls, "min": low, "max": high}.get(kind, {})[path] = value
    bounds = {path: (low[path], high[path]) for path in low.keys() & high.keys()}
    return FileStatistics(action.get("num_records") or 0, frozenset(nulls), nulls, bounds)


def files_to_heal(table: DeltaTable, location: LakeLocation) -> list[StoredFile]:
    """The files of ``table`` whose statistics miss an indexed column, or (until the table is healed
    once, ``HEALED_PROPERTY``) whose footers hold other Arrow types than the table's."""
    schema = pa.schema(table.schema().to_arrow())
    types = dict(leaf_columns(schema))
    indexed = table_indexed_columns(table)
    checked = table.metadata().configuration.get(HEALED_PROPERTY) == "true"
    wanted = plain_schema(schema)
    filesystem, base = location.filesystem()
    table_path = _table_path(table, location)
    heal = []
    for stored in stored_files(table):
        if not _complete(stored.statistics, indexed, types):
            heal.append(stored)
        elif not checked and _other_types(filesystem, f"{base}/{table_path}/{stored.path}", wanted):
            heal.append(stored)
    return heal


def _other_types(filesystem: Any, path: str, wanted: pa.Schema) -> bool:
    """Whether the data file at ``path`` holds a column in another Arrow type than ``wanted``'s."""
    footer = pq.read_schema(path, filesystem=filesystem)
    return any(field.type != wanted.field(field.name).type for field in footer)


def _complete(statistics: FileStatistics, indexed: Sequence[tuple[str, ...]], types: dict) -> bool:
    """Whether a file's statistics hold what every reader needs of each indexed column: its null
    count, and its bounds where it holds values of a bounded type."""
    for path in indexed:
        if path not in statistics.nulls:
            return False
        if (
            bounded(types[path])
            and statistics.nulls[path] < statistics.rows
            and path not in statistics.bounds
        ):
            return False
    return True


def heal(table: DeltaTable, location: LakeLocation) -> int:
    """Write again the files ``files_to_heal`` names (first those of the last commit:
    ``normalize_last_commit``), the columns a table without ``indexed_columns_property`` indexes
    fixed first, then mark the table healed; the files written again."""
    normalized = normalize_last_commit(table, location)  # a run that died after a delta-rs write
    metadata = table.metadata()
    if not {NUM_INDEXED_COLUMNS_PROPERTY, STATS_COLUMNS_PROPERTY} & set(metadata.configuration):
        # written before the property: the columns it has now are the ones it indexes from now on
        schema = pa.schema(table.schema().to_arrow())
        fixed = indexed_columns_property(schema, metadata.partition_columns)
        table.alter.set_table_properties(fixed, raise_if_not_exists=False)
    healing = files_to_heal(table, location)
    if healing:
        rewrite_files(table, location, [healing], None, "heal")
    if table.metadata().configuration.get(HEALED_PROPERTY) != "true":
        table.alter.set_table_properties({HEALED_PROPERTY: "true"}, raise_if_not_exists=False)
    return normalized + len(healing)


def normalize_last_commit(table: DeltaTable, location: LakeLocation) -> int:
    """Write again the files the table's last commit added that need healing: in other types than
    the table's (a delta-rs MERGE, DELETE or overwrite by predicate writes ``string_view``), or with
    statistics a reader prunes wrongly by (delta-rs writes ``null`` for an infinite double's bound);
    the files written. ``table`` is at the new version afterwards. Only the last commit's files are
    looked at: called after each delta-rs write, and before the next MERGE (a run that died between
    the two)."""
    added = _added_by_commit(table, location, table.version())
    if not added:
        return 0
    schema = pa.schema(table.schema().to_arrow())
    types, indexed, wanted = dict(leaf_columns(schema)), table_indexed_columns(table), plain_schema(schema)
    filesystem, base = location.filesystem()
    table_path = _table_path(table, location)
    files = []
    for stored in stored_files(table):
        if stored.path in added and (
            not _complete(stored.statistics, indexed, types)
            or _other_types(filesystem, f"{base}/{table_path}/{stored.path}", wanted)
        ):
            files.append(stored)
    if files:
        rewrite_files(table, location, [[stored] for stored in files], None, "normalize")
    return len(files)


def compact(table: DeltaTable, location: LakeLocation, cluster_by: str | None) -> tuple[int, int]:
    """Write each partition's small files again as files of about ``COMPACT_TARGET_BYTES``, sorted by
    ``cluster_by`` (None: in their order); (files removed, files added)."""
    by_partition: dict[tuple, list[StoredFile]] = {}
    for stored in stored_files(table, cluster_by):
        if stored.size < COMPACT_TARGET_BYTES:
            by_partition.setdefault(tuple(sorted(stored.partition.items())), []).append(stored)
    groups: list[list[StoredFile]] = []
    for files in by_partition.values():
        if len(files) < 2:
            continue
        files.sort(key=lambda stored: (stored.first_key is None, stored.first_key))
        group: list[StoredFile] = []
        for stored in files:
            if group and sum(f.size for f in group) + stored.size > COMPACT_TARGET_BYTES:
                groups.append(group)
                group = []
            group.append(stored)
        if len(group) > 1 or groups:
            groups.append(group)
    if not groups:
        return 0, 0
    added = rewrite_files(table, location, groups, cluster_by, COMPACTION)
    return sum(len(group) for group in groups), added


def rewrite_files(
    table: DeltaTable,
    location: LakeLocation,
    groups: Sequence[Sequence[StoredFile]],
    sort_by: str | None,
    operation: str,
) -> int:
    """Write each group's rows again as new files (sorted by ``sort_by``), in one commit that removes
    the groups' files; the files added."""
    schema = plain_schema(pa.schema(table.schema().to_arrow()))
    partitions = table.metadata().partition_columns
    indexed = table_indexed_columns(table)
    uri = f"{location.root.rstrip('/')}/{_table_path(table, location)}"
    now_ms = int(time.time() * 1000)
    removes, adds = [], []
    for group in groups:
        rows = pa.concat_tables(list(_rows_of(table, location, group, schema, partitions)))
        if sort_by is not None:
            rows = rows.sort_by(sort_by)
        adds += write_files(location, uri, rows, partitions[0] if partitions else None, indexed)
        removes += [
            RemoveAction(stored.path, False, now_ms, stored.size, stored.partition) for stored in group
        ]
    adds = [_not_a_change(action) for action in adds]
    table.create_write_transaction(
        [*removes, *adds],
        mode="append",
        schema=table.schema(),
        partition_by=partitions or None,
        commit_properties=CommitProperties(custom_metadata={OPERATION_METADATA: operation}),
    )
    # delta-rs moves a table object past its own operations, not past create_write_transaction: the
    # caller's next step (a vacuum, the version a run reports) must see this commit
    table.update_incremental()
    return len(adds)


def _rows_of(
    table: DeltaTable,
    location: LakeLocation,
    group: Sequence[StoredFile],
    schema: pa.Schema,
    partitions: Sequence[str],
) -> Iterator[pa.Table]:
    """Each file's rows in the table's plain ``schema`` (a column the file lacks: nulls; its partition
    values: from the log)."""
    filesystem, base = location.filesystem()
    table_path = _table_path(table, location)
    for stored in group:
        rows = pq.read_table(f"{base}/{table_path}/{stored.path}", filesystem=filesystem)
        columns = []
        for field in schema:
            if field.name in partitions:
                value = stored.partition.get(field.name)
                columns.append(pa.array([value] * rows.num_rows, field.type))
            elif field.name in rows.column_names:
                columns.append(rows.column(field.name).cast(field.type))
            else:
                columns.append(pa.nulls(rows.num_rows, field.type))
        yield pa.Table.from_arrays(columns, schema=schema)


def _not_a_change(action: Any) -> Any:
    """``action`` (an add action of rows the table held already) with ``dataChange`` false."""
    from deltalake.transaction import AddAction

    return AddAction(
        action.path, action.size, action.partition_values, action.modification_time, False, action.stats
    )


def _table_path(table: DeltaTable, location: LakeLocation) -> str:
    """The table's directory under the lake root."""
    uri = table.table_uri.rstrip("/")
    root = location.root.rstrip("/")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if not uri.startswith(root):
        raise ValueError(f"table {uri} is not under the lake root {root}")
    return uri[len(root) :].strip("/")


def _added_by_commit(table: DeltaTable, location: LakeLocation, version: int) -> set[str]:
    """The paths of the files commit ``version`` of the table added."""
    filesystem, base = location.filesystem()
    path = f"{base}/{_table_path(table, location)}/_delta_log/{version:020d}.json"
    with filesystem.open_input_stream(path) as stream:
        lines = stream.read().decode().splitlines()
    return {json.loads(line)["add"]["path"] for line in lines if line.startswith('{"add"')}


def lake_tables(location: LakeLocation, under: str = "") -> list[str]:
    """The directories (under the lake root, within ``under``) of every Delta table: those holding
    a ``_delta_log``."""
    from pyarrow.fs import FileSelector

    filesystem, base = location.filesystem()
    start = "/".join(part for part in (base, under.strip("/")) if part)
    found = set()
    for info in filesystem.get_file_info(FileSelector(start, recursive=True, allow_not_found=True)):
        table, marker, _ = info.path.partition("/_delta_log/")
        if marker and STAGING_DIR not in table.split("/"):
            found.add(table[len(base) :].strip("/"))
    return sorted(found)


def main(argv: Sequence[str] | None = None) -> int:
    """Heal every table of a lake at once (``heal``), rather than at each table's next maintenance."""
    parser = argparse.ArgumentParser(description="Heal the data files of every Delta table of a lake.")
    parser.add_argument("--lake-root", required=True, help="the lake's root: a path or an object-store URI")
    parser.add_argument("--topic-prefix", default="", help="only the tables of this source (topic.prefix)")
    args = parser.parse_args(argv)
    # object-store credentials come from the environment, as the transform's (LakeLocation.from_env)
    location = LakeLocation.from_env(resolve_root(args.lake_root, os.getcwd()))
    tables = [
        path
        for zone in ZONES
        for path in lake_tables(location, f"{zone}/{args.topic_prefix}" if args.topic_prefix else zone)
    ]
    failed = 0
    for path in tables:
        try:
            healed = heal(
                DeltaTable(location.table_uri(*path.split("/")), storage_options=location.storage_options),
                location,
            )
        except Exception as error:  # one damaged table costs that table, not the others
            failed += 1
            print(f"{path}: not healed: {type(error).__name__}: {error}", file=sys.stderr)
            continue
        print(f"{path}: {healed} files written again")
    print(f"{len(tables) - failed} of {len(tables)} tables healed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
