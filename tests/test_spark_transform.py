"""spark_apps/cdc_transform.py end to end, through real spark-submit runs (four in all).

1. first run: two committed raw files per collection plus one uncommitted file in flight;
2. the in-flight file committed: ``orders`` gets same-typed rows (appended to the changes
   version), ``metrics`` a wider type (changes rebuilt into a new version);
3. a Spark reader of the published tables, then the second run repeated: nothing changes;
4. the second run again with other event-flattening options: the changes tables are rebuilt.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime, timezone

import bson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bson import Decimal128, Int64, ObjectId, Regex
from bson.binary import Binary

from mongo_cdc import extjson, lake
from mongo_cdc.transform.flatten_options import FlatteningOptions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(REPO, "spark_apps", "cdc_transform.py")
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")
PREFIX, DB = "shop", "sales"
HOUR_1 = 1_700_000_000  # 2023-11-14T22:13:20Z
HOUR_2 = HOUR_1 + 3600
CUSTOMER = ObjectId("65a1b2c3d4e5f60718293a4b")

pytestmark = pytest.mark.skipif(not os.path.exists(SPARK_SUBMIT), reason="spark-submit not installed")


def ejson(document: dict) -> str:
    return extjson.encode_str(bson.decode(bson.encode(document), extjson.DECODE_OPTIONS))


def event(op: str | None, document_id, t: int, order: str, after: dict | None = None, update=None) -> dict:
    cluster_time = lake.pack_cluster_time(t, 1)
    return {
        "key": extjson.document_key(document_id),
        "op": op,
        "ts_ms": t * 1000 + 5,
        "before": None,
        "after": ejson(after) if after is not None else None,
        "updateDescription": update,
        "source": {"ts_ms": t * 1000, "rs": "rs0", "db": DB, "snapshot": op == "r"},
        "cluster_time": cluster_time,
        "event_order": order,
    }


def write_raw(root: str, collection: str, seq: int, rows: list[dict]) -> str:
    path = lake.raw_file_path(root, PREFIX, DB, collection, rows[0]["cluster_time"], "rs0", seq, 0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=lake.RAW_SCHEMA), path)
    return path


ORDER_1 = {
    "_id": 1,
    "customer": CUSTOMER,
    "total": Decimal128("12.50"),
    "placed": datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc),
    "qty": 3,
    "big": Int64(2**40),
    "ratio": float("nan"),
    "paid": True,
    "blob": Binary(b"\x00\x01", 4),
    "address": {"city": "Oslo", "zip": "0150"},
    "tags": ["a", "b"],
    "pattern": Regex("^x", "i"),
    "note": None,
    "__op": "field named like a metadata column",
}
ORDER_2 = {"_id": 2, "customer": CUSTOMER, "qty": 1, "tags": ["c"], "flag": True, "nested": {"x": 1}}
ORDER_3 = {"_id": 3, "qty": 7}


def build_first_raw_files(root: str) -> None:
    write_raw(
        root,
        "orders",
        1,
        [
            event("r", 1, HOUR_1, "", ORDER_1),
            event("r", 2, HOUR_1, "", ORDER_2),
            event("r", 3, HOUR_1, "", ORDER_3),
        ],
    )
    update_without_after = {
        "updatedFields": ejson({"nested.y": "new", "qty": 2}),
        "removedFields": ["flag"],
        "truncatedArrays": [],
    }
    write_raw(
        root,
        "orders",
        2,
        [
            event("c", 4, HOUR_2, "8201", {"_id": 4, "qty": 4, "tags": []}),
            event("u", 1, HOUR_2, "8202", {**ORDER_1, "qty": 30}),
            event("u", 2, HOUR_2, "8203", update=update_without_after),
            event("d", 3, HOUR_2, "8204"),
            event(None, 3, HOUR_2, "8204"),
        ],
    )
    write_raw(root, "metrics", 1, [event("r", "m1", HOUR_1, "", {"_id": "m1", "value": 1})])
    write_raw(root, "metrics", 2, [event("c", "m2", HOUR_2, "8201", {"_id": "m2", "value": 2})])
    # In flight during the first run (seq 3 > committed 2).
    write_raw(
        root,
        "orders",
        3,
        [
            event("c", 5, HOUR_2 + 60, "8301", {"_id": 5, "qty": 5, "tags": ["d"]}),
            event("c", 3, HOUR_2, "8199", ORDER_3),  # an old insert replayed: 3 stays deleted
        ],
    )
    write_raw(root, "metrics", 3, [event("c", "m3", HOUR_2 + 60, "8301", {"_id": "m3", "value": Int64(3)})])


def app_environment() -> dict[str, str]:
    """The venv first on PATH, and the project importable by the driver and Spark's workers."""
    return {
        **os.environ,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": os.path.join(REPO, "include"),
        "PYSPARK_PYTHON": sys.executable,
    }


def spark_submit(script: str, *args: str) -> subprocess.CompletedProcess:
    command = [
        SPARK_SUBMIT,
        "--master",
        "local[2]",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        script,
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=app_environment(), timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    return result


def summary_of(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])["collections"]


def parquet_files(table_path: str) -> list[str]:
    """The table's data files (hidden directories skipped), relative to it."""
    found = []
    for parent, directories, names in os.walk(table_path):
        directories[:] = [name for name in directories if not name.startswith(("_", "."))]
        found.extend(os.path.relpath(os.path.join(parent, name), table_path) for name in names)
    return sorted(path for path in found if path.endswith(".parquet") and "/." not in f"/{path}")


def snapshot_tables(root: str) -> dict:
    """Every published table: its version directory and rows (sorted), to compare across runs."""
    tables = {}
    for table in ("state", "changes"):
        for collection in ("orders", "metrics"):
            path = lake.table_path(root, table, PREFIX, DB, collection)
            rows = pq.read_table(path).to_pylist()
            tables[f"{table}/{collection}"] = {
                "version": os.path.realpath(path),
                "files": parquet_files(path),
                "rows": sorted(rows, key=lambda row: json.dumps(row, default=str, sort_keys=True)),
            }
    return tables


def comparable(tables: dict) -> dict:
    """``tables`` with rows as JSON text: NaN never equals itself, its JSON text does."""
    return {
        name: (
            table["version"],
            table["files"],
            [json.dumps(row, default=str, sort_keys=True) for row in table["rows"]],
        )
        for name, table in tables.items()
    }


READER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {apps!r})
    import cdc_transform

    spark = cdc_transform.build_session()
    report = {{}}
    for name, path in {paths!r}.items():
        frame = spark.read.parquet(path)
        report[name] = {{"columns": frame.columns, "count": frame.count()}}
    with open({report!r}, "w") as file:
        json.dump(report, file)
    sys.exit(cdc_transform.main(sys.argv[1:]))
    """
)


@pytest.fixture(scope="module")
def lake_runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lake"))
    build_first_raw_files(root)
    args = ["--lake-root", root, "--topic-prefix", PREFIX]
    runs = {"root": root}
    runs["first"] = summary_of(spark_submit(APP, *args, "--committed", '{"rs0": 2}'))
    runs["after_first"] = snapshot_tables(root)
    second_args = [*args, "--committed", '{"rs0": 3}']
    runs["second"] = summary_of(spark_submit(APP, *second_args))
    runs["after_second"] = snapshot_tables(root)

    report = os.path.join(root, "..", "spark_read.json")
    paths = {
        f"{table}/{collection}": lake.table_path(root, table, PREFIX, DB, collection)
        for table in ("state", "changes")
        for collection in ("orders", "metrics")
    }
    reader = os.path.join(root, "..", "reader.py")
    with open(reader, "w") as file:
        file.write(READER.format(apps=os.path.dirname(APP), paths=paths, report=report))
    runs["repeat"] = summary_of(spark_submit(reader, *second_args))
    runs["after_repeat"] = snapshot_tables(root)
    with open(report) as file:
        runs["spark_read"] = json.load(file)

    # On a copy, so the tests of the runs above see their lake as those runs left it.
    flattened_root = str(tmp_path_factory.mktemp("flattened_lake"))
    shutil.copytree(root, flattened_root, symlinks=True, dirs_exist_ok=True)
    flattened_args = ["--lake-root", flattened_root, "--topic-prefix", PREFIX, "--committed", '{"rs0": 3}']
    runs["flattened"] = summary_of(spark_submit(APP, *flattened_args, *FLATTENING.spark_arguments()))
    runs["after_flattened"] = snapshot_tables(flattened_root)
    return runs


FLATTENING = FlatteningOptions(
    array_encoding="document",
    flatten_struct=True,
    delete_tombstone_handling_mode="drop",
    add_fields=("op", "source.rs"),
)


def by_id(rows: list[dict]) -> dict:
    return {row["_id"]: row for row in rows}


def test_first_run_builds_typed_state_of_committed_events(lake_runs):
    state = by_id(lake_runs["after_first"]["state/orders"]["rows"])
    assert sorted(state) == [1, 2, 4]  # 3 deleted; 5 only in the uncommitted file
    order = state[1]
    assert order["qty"] == 30 and order["__event_order"] == "8202"
    assert order["customer"] == str(CUSTOMER)
    assert order["total"] == "12.50"
    assert order["placed"] == datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    assert order["big"] == 2**40 and math.isnan(order["ratio"]) and order["paid"] is True
    assert order["blob"] == b"\x00\x01"
    assert order["address"] == {"city": "Oslo", "zip": "0150"}
    assert order["tags"] == ["a", "b"]
    assert json.loads(order["pattern"]) == {"$regularExpression": {"pattern": "^x", "options": "i"}}
    assert order["__op"] == "field named like a metadata column"  # only a changes column is named so
    assert json.loads(order["__doc"])["total"] == {"$numberDecimal": "12.50"}
    # The update without `after` applied to the previous version.
    assert state[2]["qty"] == 2 and "flag" not in state[2] and state[2]["nested"] == {"x": 1, "y": "new"}
    assert "flag" not in json.loads(state[2]["__doc"])
    assert state[4]["tags"] == []


def test_first_run_writes_one_changes_file_per_committed_raw_file(lake_runs):
    assert lake_runs["after_first"]["changes/orders"]["files"] == [
        "hour=2023-11-14T22/rs0-000000000001-0000.parquet",
        "hour=2023-11-14T23/rs0-000000000002-0000.parquet",
    ]
    rows = lake_runs["after_first"]["changes/orders"]["rows"]
    assert sorted((row["_id"], row["__op"]) for row in rows) == [
        (1, "r"), (1, "u"), (2, "r"), (2, "u"), (3, "d"), (3, "r"), (4, "c"),
    ]  # fmt: skip
    assert next(row for row in rows if row["__op"] == "r" and row["_id"] == 1)["___op"] == ORDER_1["__op"]
    delete = next(row for row in rows if row["__op"] == "d")
    assert delete["__deleted"] is True and delete["qty"] is None and delete["__source_ts_ms"] == HOUR_2 * 1000
    partial = next(row for row in rows if row["_id"] == 2 and row["__op"] == "u")
    assert (
        partial["nested"] == {"x": None, "y": "new"} and partial["flag"] is None and partial["tags"] is None
    )
    assert lake_runs["first"]["sales.orders"] == {
        "new_events": 8,
        "state_rows": 3,
        "change_rows": 7,
        "change_rows_written": 7,
        "changes_rebuilt": True,
    }


def test_second_run_appends_same_typed_changes_and_folds_new_events(lake_runs):
    first, second = lake_runs["after_first"], lake_runs["after_second"]
    assert second["changes/orders"]["version"] == first["changes/orders"]["version"]
    assert len(second["changes/orders"]["rows"]) == 9
    assert sorted(by_id(second["state/orders"]["rows"])) == [1, 2, 4, 5]  # the replayed insert of 3 skipped
    assert second["state/orders"]["version"] != first["state/orders"]["version"]
    assert lake_runs["second"]["sales.orders"]["changes_rebuilt"] is False


def test_second_run_rebuilds_changes_when_a_type_widens(lake_runs):
    first, second = lake_runs["after_first"], lake_runs["after_second"]
    assert second["changes/metrics"]["version"] != first["changes/metrics"]["version"]
    rows = second["changes/metrics"]["rows"]
    assert sorted(row["value"] for row in rows) == [1, 2, 3]
    path = lake.table_path(lake_runs["root"], "changes", PREFIX, DB, "metrics")
    files = second["changes/metrics"]["files"]
    assert len(files) == 3
    assert {str(pq.read_schema(os.path.join(path, file)).field("value").type) for file in files} == {"int64"}
    assert lake_runs["second"]["sales.metrics"]["changes_rebuilt"] is True
    # The previous version is kept for readers still on it.
    versions = lake.versions_dir(lake_runs["root"], "changes", PREFIX, DB, "metrics")
    assert sorted(os.listdir(versions)) == ["v000001", "v000002"]


def test_spark_reads_every_published_table(lake_runs):
    read = lake_runs["spark_read"]
    assert read["changes/metrics"]["count"] == 3
    assert read["changes/orders"]["count"] == 9
    assert read["state/orders"]["count"] == 4
    expected_orders_columns = {"__id", "__doc", "_id", "customer", "placed", "blob", "address", "__op"}
    assert expected_orders_columns <= set(read["state/orders"]["columns"])
    assert {"__op", "___op", "__deleted", "nested", "hour"} <= set(read["changes/orders"]["columns"])


def test_repeating_a_run_changes_nothing(lake_runs):
    assert comparable(lake_runs["after_repeat"]) == comparable(lake_runs["after_second"])
    assert lake_runs["repeat"]["sales.orders"]["new_events"] == 0
    assert lake_runs["repeat"]["sales.orders"]["change_rows_written"] == 0
    assert lake_runs["repeat"]["sales.orders"]["state_rows"] == 4


@pytest.mark.parametrize(
    ("committed", "message"),
    [
        ("{not json", "--committed: not JSON"),
        ('{"rs0": -1}', "--committed: expected"),
        ('["rs0", 1]', "--committed: expected"),
        (None, "the following arguments are required: --committed"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, committed, message):
    args = ["--lake-root", str(tmp_path), "--topic-prefix", PREFIX]
    args += ["--committed", committed] if committed is not None else []
    result = subprocess.run(
        [sys.executable, APP, *args], capture_output=True, text=True, env=app_environment()
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stdout == ""


def test_missing_lake_root_is_a_bad_argument(tmp_path):
    args = ["--lake-root", str(tmp_path / "absent"), "--topic-prefix", PREFIX, "--committed", "{}"]
    result = subprocess.run(
        [sys.executable, APP, *args], capture_output=True, text=True, env=app_environment()
    )
    assert result.returncode == 2 and "is not a directory" in result.stderr


def test_other_flattening_options_rebuild_the_changes_tables_with_them(lake_runs):
    before, after = lake_runs["after_repeat"], lake_runs["after_flattened"]
    versions = {
        table: [os.path.basename(tables[table]["version"]) for tables in (before, after)]
        for table in ("state/orders", "changes/orders")
    }
    # The copy's state is untouched (same version, files and rows); its changes have a new version.
    assert versions == {"state/orders": ["v000002", "v000002"], "changes/orders": ["v000001", "v000002"]}
    assert comparable(after)["state/orders"][1:] == comparable(before)["state/orders"][1:]
    assert lake_runs["flattened"]["sales.orders"]["changes_rebuilt"] is True
    rows = after["changes/orders"]["rows"]
    assert sorted((row["_id"], row["__op"]) for row in rows) == [
        (1, "r"), (1, "u"), (2, "r"), (2, "u"), (3, "c"), (3, "r"), (4, "c"), (5, "c"),
    ]  # fmt: skip
    order = next(row for row in rows if row["_id"] == 1 and row["__op"] == "r")
    assert (order["address_city"], order["tags__0"], order["tags__1"]) == ("Oslo", "a", "b")
    assert order["__source_rs"] == "rs0" and not {"address", "__source_ts_ms"} & set(order)
    partial = next(row for row in rows if row["_id"] == 2 and row["__op"] == "u")
    assert (partial["nested_y"], partial["flag"]) == ("new", None)
    version = after["changes/orders"]["version"]
    with open(os.path.join(version, "_mongo_cdc.json")) as file:
        assert json.load(file)["flattening"] == FLATTENING.to_json()
