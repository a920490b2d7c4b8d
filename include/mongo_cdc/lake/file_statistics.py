"""Delta statistics of the data files mongo-cdc writes itself, as Delta's own writers write them.

Every reader skips files by the statistics in the log's add actions: a file whose ``minValues``/
``maxValues`` rule out a predicate is never opened. The protocol says a file that lacks an indexed
column's statistics must not be pruned on it; deltalake's pyarrow readers (1.6) disagree: they build
a file's guarantee as ``column >= null`` for an indexed column without a minimum, which prunes the
file for every predicate on that column (0 rows, no error). So each file carries, for every column
its table indexes, ``nullCount`` and, where the column holds values of a type with an order, their
bounds; a column the file lacks (its table gained it later) is counted all null.

Which columns a table indexes is Delta's rule (``indexed_columns``): those
``delta.dataSkippingStatsColumns`` names, else the first ``delta.dataSkippingNumIndexedCols`` (32)
leaf columns of its data in schema order, nested struct fields included, a list or map one leaf.
mongo-cdc creates its state and changes tables with ``delta.dataSkippingNumIndexedCols`` set to the
leaf columns they start with (32 at most: ``indexed_columns_property``; a table created empty gets
it when healed), so the columns a table gains later, appended to its schema, are not indexed: its
older files have no statistics of them, and deltalake would prune those files on ``new_column IS
NULL``. (``delta.dataSkippingStatsColumns`` would say it by name, but delta-rs 1.6 reads it only up
to the first column of the schema it does not name.) Writers keep the statistics of every column
(``FileStatistics``), and a commit writes those its table indexes (``to_json``): the executors of a
first build do not know yet which columns the table will have.

Bounds come from the Parquet writer's own footer (``file_statistics``), not from a second pass
over the data; only where the footer has none although the column holds values (Parquet leaves out
the bounds of a column chunk holding a value over 4 KB) is that one column read. Strings are
truncated as Delta's writers truncate them (``STRING_PREFIX_LENGTH`` characters, or the length a
column's writer asks for: ``prefix_lengths``): the minimum to a prefix, the maximum to a prefix
whose last character that can be is incremented, so that it stays an upper bound. Timestamps are
written in milliseconds, the minimum rounded down, the maximum up.
Doubles are bounded from their values, not the footer, which cannot say whether a chunk holds NaN.
No bounds are true of NaN: pyarrow takes a file's bounds as a guarantee about every row and
simplifies a filter by it (bounds of a file of NaN left out, ``[inf, inf]`` say, turn ``d > 1`` into
"every row"), and DuckDB and Spark order NaN above every number (bounds that leave it out prune
``d > 5`` there). So a file whose column holds NaN gets the widest bounds, ``"-Infinity"`` to
``"Infinity"``: no comparison with a number is decided by them (only ``>= -inf`` or ``<= inf`` in
pyarrow, and ``> inf`` in DuckDB, which no one writes). ±infinity, which no JSON number holds, are
written ``"Infinity"``/``"-Infinity"``, which delta-rs, delta-kernel and Spark read back as the
double. Binary columns, lists and maps have no bounds in Delta: only their ``nullCount``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

STATS_COLUMNS_PROPERTY = "delta.dataSkippingStatsColumns"
NUM_INDEXED_COLUMNS_PROPERTY = "delta.dataSkippingNumIndexedCols"
# Delta's defaults: the first 32 leaf columns, strings bounded by their first 32 characters.
DEFAULT_INDEXED_COLUMNS = 32
STRING_PREFIX_LENGTH = 32

Path = tuple[str, ...]
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_TIME_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


class FileStatistics:
    """One data file's statistics: its rows, and each leaf column's nulls and (bounded types) bounds."""

    def __init__(
        self,
        rows: int,
        columns: frozenset[Path],
        nulls: dict[Path, int],
        bounds: dict[Path, tuple[Any, Any]],
    ):
        self.rows = rows
        self.columns = columns  # the file's leaf columns: one it lacks reads as null in every row
        self.nulls = nulls
        self.bounds = bounds

    def to_json(self, indexed: Iterable[Path] | None = None) -> str:
        """Delta's ``stats`` JSON. ``indexed``: the table's indexed columns, each given its bounds, or
        ``nullCount`` = ``numRecords`` where the file has no such column (every row reads it as null);
        None: every column the file has."""
        columns = list(self.nulls) if indexed is None else list(indexed)
        minimum: dict[str, Any] = {}
        maximum: dict[str, Any] = {}
        nulls: dict[str, Any] = {}
        for path in columns:
            if path not in self.columns:
                _put(nulls, path, self.rows)
                continue
            if path in self.nulls:
                _put(nulls, path, self.nulls[path])
            if path in self.bounds:
                low, high = self.bounds[path]
                _put(minimum, path, low)
                _put(maximum, path, high)
        stats = {"numRecords": self.rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls}
        return json.dumps(stats, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> FileStatistics:
        """The statistics of an add action's ``stats`` (bounds as written: truncated, in ms)."""
        stats = json.loads(text)
        nulls = dict(_flat(stats.get("nullCount") or {}))
        low, high = dict(_flat(stats.get("minValues") or {})), dict(_flat(stats.get("maxValues") or {}))
        bounds = {path: (low[path], high[path]) for path in low.keys() & high.keys()}
        return cls(stats["numRecords"], frozenset(nulls) | frozenset(bounds), nulls, bounds)


def bounded(data_type: pa.DataType) -> bool:
    """Whether Delta statistics hold the bounds of a column of this type (see the module's text)."""
    return (
        pa.types.is_integer(data_type)
        or _is_double(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_boolean(data_type)
        or pa.types.is_date32(data_type)
        or pa.types.is_timestamp(data_type)
    )


def _is_double(data_type: pa.DataType) -> bool:
    return pa.types.is_floating(data_type)


def leaf_columns(schema: pa.Schema) -> list[tuple[Path, pa.DataType]]:
    """The leaf columns Delta counts, in schema order: struct fields recursed, a list or map one leaf."""

    def leaves(field: pa.Field, parent: Path) -> list[tuple[Path, pa.DataType]]:
        path = (*parent, field.name)
        if pa.types.is_struct(field.type):
            return [leaf for child in field.type for leaf in leaves(child, path)]
        return [(path, field.type)]

    return [leaf for field in schema for leaf in leaves(field, ())]


def indexed_columns(
    schema: pa.Schema, configuration: Mapping[str, str | None], partition_columns: Iterable[str] = ()
) -> list[Path]:
    """The leaf columns of ``schema`` a table with this configuration indexes (Delta's rule), less its
    partition columns: their values are in the log, never in a data file's statistics."""
    partitioned = set(partition_columns)
    leaves = [(path, kind) for path, kind in leaf_columns(schema) if path[0] not in partitioned]
    named = configuration.get(STATS_COLUMNS_PROPERTY)
    if named is not None:
        wanted = [_parse_column_name(name) for name in _split_names(named)]
        return [path for path, _ in leaves if any(path[: len(name)] == name for name in wanted)]
    count = int(configuration.get(NUM_INDEXED_COLUMNS_PROPERTY) or DEFAULT_INDEXED_COLUMNS)
    return [path for path, _ in (leaves if count < 0 else leaves[:count])]


def indexed_columns_property(schema: pa.Schema, partition_columns: Iterable[str] = ()) -> dict[str, str]:
    """The table property that fixes which columns a new table of ``schema`` indexes: its leaf columns
    (those of its data files), ``DEFAULT_INDEXED_COLUMNS`` at most."""
    partitioned = set(partition_columns)
    leaves = sum(1 for path, _ in leaf_columns(schema) if path[0] not in partitioned)
    return {NUM_INDEXED_COLUMNS_PROPERTY: str(min(leaves, DEFAULT_INDEXED_COLUMNS))}


def table_indexed_columns(table: Any) -> list[Path]:
    """``indexed_columns`` of a delta-rs ``DeltaTable``, as its current version has them."""
    metadata = table.metadata()
    schema = pa.schema(table.schema().to_arrow())
    return indexed_columns(schema, metadata.configuration, metadata.partition_columns)


def statistics_writer(sink: Any, schema: pa.Schema, use_dictionary: bool | list[str]) -> pq.ParquetWriter:
    """A snappy Parquet writer of ``schema`` whose footer holds the bounds ``file_statistics`` reads
    (of no other column: computing them over 4 KB documents costs time and says nothing a reader
    filters on)."""
    return pq.ParquetWriter(
        sink,
        schema,
        compression="snappy",
        use_dictionary=use_dictionary,
        write_statistics=statistics_paths(schema),
    )


def statistics_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths whose bounds a writer keeps in its footer (``write_statistics``): the
    bounded leaves, but doubles (bounded from their values)."""
    return [".".join(path) for path, kind in leaf_columns(schema) if bounded(kind) and not _is_double(kind)]


def file_statistics(
    metadata: pq.FileMetaData,
    schema: pa.Schema,
    nulls: Mapping[Path, int],
    read_column: Callable[[Path], pa.ChunkedArray],
    prefix_lengths: Mapping[Path, int] | None = None,
) -> FileStatistics:
    """A written file's statistics: ``nulls`` of each leaf column (``null_counts`` of the rows
    written, which Arrow knows without a pass), the bounds from its Parquet footer (``metadata``;
    ``schema``: its Arrow schema). ``read_column`` gives a leaf column's values, for the rare column
    whose footer lacks bounds although it holds values."""
    types = dict(leaf_columns(schema))
    chunks: dict[Path, list[pq.Statistics | None]] = {}
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            column = row_group.column(index)
            path = tuple(column.path_in_schema.split("."))
            if path in types:  # a list's or map's elements are not
                chunks.setdefault(path, []).append(column.statistics)
    bounds: dict[Path, tuple[Any, Any]] = {}
    for path, kind in types.items():
        if not bounded(kind) or nulls[path] == metadata.num_rows:
            continue
        statistics = chunks.get(path, [])
        if (
            _is_double(kind)
            or not statistics
            # a chunk holding a value over Parquet's limit has no bounds (one of nulls only has none either)
            or any(s is None or (s.num_values > 0 and not s.has_min_max) for s in statistics)
        ):
            low, high = _bounds_of(read_column(path), kind)
        else:
            with_values = [s for s in statistics if s.num_values > 0]  # type: ignore[union-attr]
            low = min(_value(s.min, kind) for s in with_values)  # type: ignore[union-attr]
            high = max(_value(s.max, kind) for s in with_values)  # type: ignore[union-attr]
        length = (prefix_lengths or {}).get(path, STRING_PREFIX_LENGTH)
        bounds[path] = _bound_low(low, kind, length), _bound_high(high, kind, length)
    return FileStatistics(metadata.num_rows, frozenset(types), dict(nulls), bounds)


def null_counts(rows: pa.Table | pa.RecordBatch) -> dict[Path, int]:
    """The nulls of each leaf column of ``rows`` (a nested field is null where a parent is)."""
    return {path: column_at(rows, path).null_count for path, _ in leaf_columns(rows.schema)}


def column_at(rows: pa.Table | pa.RecordBatch, path: Sequence[str]) -> pa.ChunkedArray:
    """The leaf column at ``path`` (nested struct fields: null where a parent is)."""
    values = rows.column(path[0])
    for name in path[1:]:
        values = pa.compute.struct_field(values, name)
    return values


def _bounds_of(values: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> tuple[Any, Any]:
    """The bounds of a column's values (not all null), as ``_value`` gives them."""
    if _is_double(kind):
        if pa.compute.any(pa.compute.is_nan(values)).as_py():
            return -math.inf, math.inf  # see the module's text: no narrower bounds hold NaN
        low, high = (pa.compute.min_max(values)[end].as_py() for end in ("min", "max"))
        return low, high
    if pa.types.is_timestamp(kind):  # as integers: as_py() of a nanosecond timestamp loses them
        values = values.cast(pa.int64())
        low, high = (pa.compute.min_max(values)[end].as_py() for end in ("min", "max"))
        scale = 1_000_000_000 // _TIME_UNITS[kind.unit]
        return low * scale, high * scale
    low, high = (pa.compute.min_max(values)[end].as_py() for end in ("min", "max"))
    return _value(low, kind), _value(high, kind)


def _value(value: Any, kind: pa.DataType) -> Any:
    """A footer's bound (or a value) as a comparable Python value: a timestamp in ns since the epoch."""
    if isinstance(value, bytes):
        return value.decode("utf-8")  # Parquet compares strings bytewise: UTF-8's order is code points'
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        delta = moment - _EPOCH
        nanoseconds = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
        return nanoseconds
    return value


def _bound_low(value: Any, kind: pa.DataType, length: int) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, str):
        return value[:length]
    if pa.types.is_timestamp(kind):
        return _timestamp_text(value // 1_000_000)
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _bound_high(value: Any, kind: pa.DataType, length: int) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, str):
        return truncated_max(value, length)
    if pa.types.is_timestamp(kind):  # a footer's nanosecond bound came in microseconds, rounded down
        return _timestamp_text(-(-(value + (999 if kind.unit == "ns" else 0)) // 1_000_000))
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def truncated_max(value: str, length: int = STRING_PREFIX_LENGTH) -> str:
    """An upper bound of ``value`` at most ``length`` characters long: the prefix with its last
    character that can be incremented incremented (what follows it dropped), or the whole value
    where every character of the prefix is the last code point."""
    if len(value) <= length:
        return value
    prefix = value[:length]
    for end in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[end])
        if code < _MAX_CODE_POINT:
            following = code + 1 if code + 1 not in _SURROGATES else _SURROGATES.stop
            return prefix[:end] + chr(following)
    return value


def _timestamp_text(milliseconds: int) -> str:
    moment = _EPOCH + dt.timedelta(milliseconds=milliseconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _put(target: dict[str, Any], path: Path, value: Any) -> None:
    for name in path[:-1]:
        target = target.setdefault(name, {})
    target[path[-1]] = value


def _flat(values: Mapping[str, Any], parent: Path = ()) -> Iterable[tuple[Path, Any]]:
    for name, value in values.items():
        if isinstance(value, dict):
            yield from _flat(value, (*parent, name))
        else:
            yield (*parent, name), value


def _split_names(text: str) -> list[str]:
    """The comma-separated names of ``delta.dataSkippingStatsColumns`` (a comma inside backquotes
    belongs to the name)."""
    names, current, quoted = [], "", False
    for char in text:
        if char == "`":
            quoted = not quoted
        if char == "," and not quoted:
            names.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        names.append(current.strip())
    return names


def _parse_column_name(name: str) -> Path:
    parts, current, quoted, index = [], "", False, 0
    while index < len(name):
        char = name[index]
        if char == "`":
            if quoted and name[index + 1 : index + 2] == "`":
                current += "`"
                index += 2
                continue
            quoted = not quoted
        elif char == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
        index += 1
    parts.append(current)
    return tuple(parts)
