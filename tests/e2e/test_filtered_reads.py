"""Filtered reads of the state, changes and raw tables return what the full read filtered afterwards
does, in every reader docs/reading.md names (issue 47).

deltalake's pyarrow readers prune a file by its Delta statistics: a file lacking an indexed column's
bounds was pruned for every predicate on that column (0 rows, no error), and a file a delta-rs MERGE
wrote in ``string_view`` failed every filter. Here a collection of typed fields (its state large
enough for the transform to MERGE it) and one of ``_id``s of many BSON types go through a snapshot,
two live runs, and compaction; after each, every predicate is read filtered and compared, reader by
reader, with that reader's full read filtered afterwards. The values are adversarial: bounds of the
data, strings longer than the statistics' prefix, NaN and infinities, nulls, nested fields.
Through real DAG runs (``dag.test``), a real mongod, a real Spark, in file order.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from bson import Decimal128, Int64, ObjectId
from cdc_support import assert_state_equals_collection
from conftest import make_source
from deltalake import DeltaTable
from reader_support import OPERATORS, Predicate, check_every_reader

from mongo_cdc.lake import table_uri
from mongo_cdc.lake.maintenance import maintain_table
from mongo_cdc.lake.storage import row_count
from mongo_cdc.transform.state_merge import REWRITE_MAX_ROWS

# above state_merge.REWRITE_MAX_ROWS: the state is merged file by file, not written again whole
TYPED_DOCUMENTS = 10_500
LONG = "x" * 40 + "tail"  # longer than the statistics' 32-character prefix
TOP = "\U0010ffff" * 40  # a prefix of the last code point cannot be rounded up
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
DOUBLES = [1.5, -0.0, float("nan"), float("inf"), float("-inf"), 1e300]
# (column, Python value, Arrow type of the literal): one column of each type the state holds
PROBES: list[tuple[str, Any, pa.DataType]] = [
    ("s", "name 17", pa.string()),
    ("s", LONG, pa.string()),
    ("s", TOP, pa.string()),
    ("i", 4_321, pa.int32()),
    ("l", 2**40 + 7, pa.int64()),
    ("d", 1.5, pa.float64()),
    ("d", 5.0, pa.float64()),
    ("d", math.inf, pa.float64()),
    ("b", True, pa.bool_()),
    ("t", START + dt.timedelta(minutes=77), pa.timestamp("us", tz="UTC")),
    ("oid", str(ObjectId(b"\x00" * 11 + b"\x2a")), pa.string()),
    ("dec", "12.50", pa.string()),
    ("nested.x", 9_000, pa.int64()),
    ("mixed", "7", pa.string()),
    ("_id", 10_020, pa.int64()),
    ("_id", 3, pa.int64()),
    ("v", 3, pa.int64()),
    ("_id", '"four"', pa.string()),  # the fallback's Extended JSON of a string _id
]


def typed_document(n: int) -> dict[str, Any]:
    """A document of every column type; some fields null or missing, the extremes in a few."""
    document: dict[str, Any] = {
        "_id": n,
        "s": LONG if n % 997 == 0 else TOP if n == 5 else f"name {n}",
        "i": n % 9_000,
        "l": Int64(2**40 + n),
        "d": DOUBLES[n % len(DOUBLES)] if n % 50 == 0 else n / 2,
        "b": n % 3 == 0,
        "t": START + dt.timedelta(minutes=n),
        "oid": ObjectId(b"\x00" * 8 + n.to_bytes(4, "big")),
        "dec": Decimal128(Decimal(n) / 4),
        "nested": {"x": n, "y": f"y{n}"},
        "tags": [f"t{n % 5}"],
        "mixed": n if n % 2 else str(n % 10),
    }
    if n % 11 == 0:
        document["s"] = None
    if n % 13 == 0:
        del document["i"]
    return document


IDS = [1, Int64(2), 3.5, "four", ObjectId(b"\x00" * 11 + b"\x05"), START, {"k": 7}, Decimal128("8.25")]


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory) -> Iterator[Any]:
    source = make_source(tmp_path_factory.mktemp("filtered_reads"), replica_set.uri, "filtered_reads")
    with replica_set.client() as client:
        client.drop_database(source.database)
        database = client[source.database]
        database.typed.insert_many([typed_document(n) for n in range(TYPED_DOCUMENTS)])
        database.ids.insert_many([{"_id": value, "v": index} for index, value in enumerate(IDS)])
        source.run()
        yield source, client, database


def _uris(source: Any, collection: str) -> dict[str, str]:
    tables = {
        zone: table_uri(source.location, zone, source.prefix, source.database, collection)
        for zone in ("state", "changes", "raw")
    }
    return tables


def _predicates(zone: str) -> list[Predicate]:
    """Each probe as ``=``, ``<``, ``>``, ``in`` and ``is null``; the raw table's own columns."""
    if zone == "raw":
        probes = [
            ("op", "u", pa.string()),
            ("key", '{"id":"10020"}', pa.string()),
            ("batch_seq", 2, pa.int64()),
        ]
    else:
        probes = PROBES
    return [
        (column, op, value, kind)
        for column, value, kind in probes
        for op in OPERATORS
        if (column, op, value) != ("d", ">", math.inf)  # DuckDB and Spark match NaN: file_statistics
    ]


def _check(source: Any, spark: Any) -> None:
    for collection in ("typed", "ids"):
        for zone, uri in _uris(source, collection).items():
            matched = check_every_reader(uri, _predicates(zone), spark)
            assert matched, f"no predicate matched a row of {zone} {collection}: the test compares nothing"


def test_after_the_snapshot_every_reader_filters_right(scenario, spark):
    source, client, _ = scenario
    assert_state_equals_collection(source, client, "ids", frozenset({"_id"}))
    _check(source, spark)


def test_after_two_merged_runs_every_reader_filters_right(scenario, spark):
    source, client, database = scenario
    for run in range(2):
        database.typed.update_many({"_id": {"$mod": [7, run]}}, {"$set": {"s": f"run {run}", "d": math.nan}})
        database.typed.delete_many({"_id": {"$mod": [101, run]}})
        database.typed.insert_many([typed_document(TYPED_DOCUMENTS + run * 10 + n) for n in range(10)])
        database.ids.update_one({"_id": "four"}, {"$set": {"v": 40 + run}})
        source.run()
    state = DeltaTable(_uris(source, "typed")["state"])
    assert row_count(state) > REWRITE_MAX_ROWS  # so the runs merged it file by file
    _check(source, spark)


def test_after_compaction_every_reader_filters_right(scenario, spark):
    source, client, _ = scenario
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    for collection in ("typed", "ids"):
        for zone, uri in _uris(source, collection).items():
            done = maintain_table(uri, source.location, 1, 168, later, "__key" if zone == "state" else None)
            assert done["optimized"]
    _check(source, spark)
    assert_state_equals_collection(source, client, "typed", frozenset({"mixed"}))
