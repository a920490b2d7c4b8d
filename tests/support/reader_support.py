"""The readers docs/reading.md names, as a user runs them: DuckDB with its delta extension, loaded
offline by the LOAD statement the page's one-liner prints (so the page's line is what every DuckDB
read here runs), and filtered reads compared reader by reader with the reader's own full read
filtered afterwards (``check_every_reader``)."""

from __future__ import annotations

import datetime as dt
import functools
import math
import os
import re
import subprocess
import sys
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from mongo_cdc.lake.readers import read_table, spark_table

# (column, operator, value, Arrow type of the value): "=", "<", ">", "in" or "is null"; a column
# "a.b" is field b of struct column a
Predicate = tuple[str, str, Any, pa.DataType]
OPERATORS = ("=", "<", ">", "in", "is null")
SPARK_OPERATORS = ("=", ">")

READING_PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "reading.md")
# the one-liner in the page's DuckDB block: python -c '<code>'
_ONE_LINER = re.compile(r"^-- +python -c '(?P<code>[^']+)'$", re.MULTILINE)


@functools.cache
def documented_delta_load() -> str:
    """The LOAD statement of DuckDB's delta extension that docs/reading.md's one-liner prints, run
    by this interpreter (the environment the page's reader installed duckdb into)."""
    with open(READING_PAGE, encoding="utf-8") as page:
        block = page.read().split("```sql\n-- DuckDB", 1)[1].split("```", 1)[0]
    found = _ONE_LINER.search(block)
    assert found is not None, "docs/reading.md's DuckDB block lost its python -c one-liner"
    printed = subprocess.run(
        [sys.executable, "-c", found["code"]], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return printed.strip()


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.execute(documented_delta_load())
    return connection


def _arrow(column: str, op: str, value: Any, kind: pa.DataType) -> pc.Expression:
    field = pc.field(*column.split("."))
    literal = pa.scalar(value, kind) if value is not None else None
    return {
        "=": lambda: field == literal,
        "<": lambda: field < literal,
        ">": lambda: field > literal,
        "in": lambda: field.isin(pa.array([value], kind)),
        "is null": lambda: field.is_null(),
    }[op]()


def _polars(column: str, op: str, value: Any) -> pl.Expr:
    name, *nested = column.split(".")
    field = pl.col(name).struct.field(nested[0]) if nested else pl.col(name)
    return {
        "=": lambda: field == value,
        "<": lambda: field < value,
        ">": lambda: field > value,
        "in": lambda: field.is_in([value]),
        "is null": lambda: field.is_null(),
    }[op]()


def _sql(column: str, op: str) -> str:
    if op == "is null":
        return f"{column} IS NULL"
    return f"{column} IN (?)" if op == "in" else f"{column} {op} ?"


def _type_at(schema: pa.Schema, column: str) -> pa.DataType | None:
    name, *nested = column.split(".")
    if name not in schema.names:
        return None
    kind = schema.field(name).type
    for part in nested:
        if not pa.types.is_struct(kind) or kind.get_field_index(part) < 0:
            return None
        kind = kind.field(part).type
    return kind


# the columns that tell a table's rows apart, of those it has
_IDENTITY = ("__key", "key", "__event_order", "__cluster_time", "_id")


def _identity(names: list[str]) -> list[str]:
    return [name for name in _IDENTITY if name in names]


def _ids(rows: pa.Table) -> list[str]:
    """The rows' identities, as sorted text: the reader's types and order do not matter."""
    values = rows.select(_identity(rows.column_names)).to_pydict().values()
    return sorted("|".join(map(str, row)) for row in zip(*values, strict=True))


def _polars_ids(frame: pl.DataFrame) -> list[str]:
    return _ids(frame.to_arrow())


def check_every_reader(uri: str, predicates: list[Predicate], spark: Any = None) -> int:
    """Every predicate through every reader (Spark's ``spark_table`` where ``spark`` is given, for
    ``SPARK_OPERATORS``: a Spark job a predicate, and one for the full read filtered by them all):
    filtered read == full read filtered; the predicates that matched a row (so that a test does not
    compare empty answers only)."""
    table = DeltaTable(uri)
    schema = pa.schema(table.schema().to_arrow())
    predicates = [predicate for predicate in predicates if _type_at(schema, predicate[0]) == predicate[3]]
    full = table.to_pyarrow_table()
    duck = duckdb_connection()
    duck.execute(f"CREATE TABLE everything AS SELECT * FROM delta_scan('{uri}')")
    polars_full = pl.read_delta(uri)
    spark_full = None if spark is None else spark_table(spark, uri)
    identity = _identity(schema.names)  # what Spark's rows bring back: the rows, not their values
    spark_afterwards = (
        {} if spark_full is None else _spark_full_read_filtered(spark_full, predicates, identity)
    )
    matched = 0
    for number, (column, op, value, kind) in enumerate(predicates):
        where = f"{uri}: {column} {op} {value!r}"
        expression = _arrow(column, op, value, kind)
        expected = _ids(full.filter(expression))
        matched += bool(expected)
        assert _ids(table.to_pyarrow_dataset().to_table(filter=expression)) == expected, where
        assert _ids(read_table(uri, filters=expression)) == expected, where
        if "." not in column:
            tuples = [(column, op if op != "is null" else "=", value if op != "in" else [value])]
            if op != "is null":
                assert _ids(table.to_pyarrow_table(filters=tuples)) == expected, where
        polars_expression = _polars(column, op, value)
        assert _polars_ids(pl.scan_delta(uri).filter(polars_expression).collect()) == _polars_ids(
            polars_full.filter(polars_expression)
        ), where
        sql = _sql(column, op)
        parameters = [] if op == "is null" else [value]
        filtered = duck.execute(f"SELECT * FROM delta_scan('{uri}') WHERE {sql}", parameters).to_arrow_table()
        afterwards = duck.execute(f"SELECT * FROM everything WHERE {sql}", parameters).to_arrow_table()
        assert _ids(filtered) == _ids(afterwards), where
        if number in spark_afterwards:
            filtered_rows = spark_full.where(_spark_where(column, op, value)).select(*identity).collect()
            assert _spark_ids(filtered_rows) == spark_afterwards[number], where
    return matched


def _spark_where(column: str, op: str, value: Any) -> str:
    return _sql(column, op).replace("?", _spark_literal(value))


def _spark_ids(rows: list[Any]) -> list[str]:
    return sorted(str(tuple(row)) for row in rows)


def _spark_full_read_filtered(
    full: Any, predicates: list[Predicate], identity: list[str]
) -> dict[int, list[str]]:
    """Spark's full read of a table filtered afterwards by each of the ``SPARK_OPERATORS``
    predicates, by their number, in one job: a flag column per predicate beside every row's
    ``identity`` columns (a null is no match, as in WHERE). Each filtered read stays a query of its
    own: its pushdown is tested."""
    checked = {n: p[:3] for n, p in enumerate(predicates) if p[1] in SPARK_OPERATORS}
    width = len(identity)
    flags = [
        f"coalesce({_spark_where(*predicate)}, false) AS __matches_{n}" for n, predicate in checked.items()
    ]
    rows = full.selectExpr(*(f"`{name}`" for name in identity), *flags).collect()
    return {n: _spark_ids([row[:width] for row in rows if row[f"__matches_{n}"]]) for n in checked}


def _spark_literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00'"
    if isinstance(value, float) and math.isinf(value):
        return "double('inf')" if value > 0 else "double('-inf')"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
