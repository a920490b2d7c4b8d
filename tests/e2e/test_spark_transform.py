"""spark_apps/cdc_transform.py end to end on Delta tables, through real spark-submit runs (four in all).

Raw rows land through ``landing.SourceLake`` like the pull tasks land them: a batch's rows, then
its row in the batch log, which is what makes it committed.

1. first run: batches 1 and 2 committed, batch 3 landed but not in the batch log (in flight);
2. batches 3 and 4 committed: ``orders`` gets a new field, ``metrics`` a value whose type
   conflicts with its column's; both are appended without rewriting the old change files;
3. a Spark reader of every table, then the second run repeated: nothing changes;
4. the second run again, on a copy of the lake, with other flattening options: the changes
   tables are rebuilt (and the log says so), the state is untouched.
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
import pytest
from bson import Decimal128, Int64, ObjectId, Regex
from bson.binary import Binary
from cdc_support import SPARK_APP
from deltalake import DeltaTable

from mongo_cdc import extjson, lake
from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.flatten_options import FLATTENING_METADATA, FlatteningOptions

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")
PREFIX, DB = "shop", "sales"
ORDERS, METRICS = f"{DB}.orders", f"{DB}.metrics"
HOUR_1 = 1_700_000_000  # 2023-11-14T22:13:20Z
HOUR_2 = HOUR_1 + 3600
CUSTOMER = ObjectId("65a1b2c3d4e5f60718293a4b")
TABLES = [(zone, collection) for zone in ("state", "changes") for collection in ("orders", "metrics")]

pytestmark = pytest.mark.skipif(not os.path.exists(SPARK_SUBMIT), reason="spark-submit not installed")


def event(op: str | None, document_id, t: int, order: str, after: dict | None = None, update=None) -> dict:
    """A raw row (``lake.RAW_SCHEMA``) of replica set rs0: documents as BSON, like the pull lands them."""
    if update is not None:
        update = {**update, "updatedFields": bson.encode(update["updatedFields"])}
    collection = "metrics" if isinstance(document_id, str) else "orders"
    return {
        "key": extjson.document_key(document_id),
        "op": op,
        "ts_ms": t * 1000 + 5,
        "before": None,
        "after": bson.encode(after) if after is not None else None,
        "updateDescription": update,
        "source": {"ts_ms": t * 1000, "rs": "rs0", "db": DB, "collection": collection, "snapshot": op == "r"},
        "cluster_time": lake.pack_cluster_time(t, 1),
        "event_order": order,
    }


def land(source_lake: SourceLake, seq: int, rows_by_namespace: dict[str, list[dict]], commit: bool) -> None:
    """Land batch ``seq`` of rs0; with ``commit``, also record it in the batch log."""
    for namespace, rows in rows_by_namespace.items():
        source_lake.write_raw("rs0", seq, namespace, rows_to_table(rows, seq))
    if commit:
        commit_batch(source_lake, seq, tuple(sorted(rows_by_namespace)))


def commit_batch(source_lake: SourceLake, seq: int, namespaces: tuple[str, ...]) -> None:
    position = lake.pack_cluster_time(HOUR_2 + seq, 1)
    source_lake.commit(
        Batch("rs0", seq, "stream", {"_data": f"82{position:016X}"}, position, namespaces=namespaces)
    )


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
    "w": {"$numberLong": "5"},  # a document with a field named $numberLong, not an int64
    "__op": "field named like a metadata column",
}
ORDER_2 = {"_id": 2, "customer": CUSTOMER, "qty": 1, "tags": ["c"], "flag": True, "nested": {"x": 1}}
ORDER_3 = {"_id": 3, "qty": 7}
# Batch 3: in flight during the first run.
BATCH_3 = {
    ORDERS: [
        event("c", 5, HOUR_2 + 60, "8301", {"_id": 5, "qty": 5, "tags": ["d"]}),
        event(
            "u", 4, HOUR_2 + 60, "8302", {"_id": 4, "qty": 4, "tags": [], "coupon": "SPRING"}
        ),  # a new field
    ],
    METRICS: [event("c", "m3", HOUR_2 + 60, "8301", {"_id": "m3", "value": "three"})],  # conflicts with long
}


def land_first_batches(source_lake: SourceLake) -> None:
    land(
        source_lake,
        1,
        {
            ORDERS: [
                event("r", 1, HOUR_1, "", ORDER_1),
                event("r", 2, HOUR_1, "", ORDER_2),
                event("r", 3, HOUR_1, "", ORDER_3),
            ],
            METRICS: [event("r", "m1", HOUR_1, "", {"_id": "m1", "value": 1})],
        },
        commit=True,
    )
    update_without_after = {
        "updatedFields": {"nested.y": "new", "qty": 2},
        "removedFields": ["flag"],
        "truncatedArrays": [],
    }
    land(
        source_lake,
        2,
        {
            ORDERS: [
                event("c", 4, HOUR_2, "8201", {"_id": 4, "qty": 4, "tags": []}),
                event("u", 1, HOUR_2, "8202", {**ORDER_1, "qty": 30}),
                event("u", 2, HOUR_2, "8203", update=update_without_after),
                event("d", 3, HOUR_2, "8204"),
                event(None, 3, HOUR_2, "8204"),
            ],
            METRICS: [event("c", "m2", HOUR_2, "8201", {"_id": "m2", "value": Int64(2)})],
        },
        commit=True,
    )
    land(source_lake, 3, BATCH_3, commit=False)


def land_later_batches(source_lake: SourceLake) -> None:
    commit_batch(source_lake, 3, tuple(sorted(BATCH_3)))
    # an old insert of 3, from before its delete, replayed in a later batch
    land(source_lake, 4, {ORDERS: [event("c", 3, HOUR_2, "8199", ORDER_3)]}, commit=True)


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


def table_uri(root: str, zone: str, collection: str) -> str:
    return lake.table_uri(LakeLocation(root), zone, PREFIX, DB, collection)


def snapshot_tables(root: str) -> dict:
    """Every derived table read with delta-rs: its version, data files and rows, to compare across runs."""
    tables = {}
    for zone, collection in TABLES:
        table = DeltaTable(table_uri(root, zone, collection))
        rows = pa.table(table.to_pyarrow_dataset().to_table()).to_pylist()
        tables[f"{zone}/{collection}"] = {
            "version": table.version(),
            "files": sorted(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()),
            "schema": pa.schema(table.schema().to_arrow()),
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
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession
    import runpy

    spark = SparkSession.builder.getOrCreate()
    report = {{}}
    for name, uri in {uris!r}.items():
        files = DeltaTable(uri).file_uris()  # the live files of the table's latest version
        frame = spark.read.option("mergeSchema", "true").option("basePath", uri).parquet(*files)
        report[name] = {{"columns": frame.columns, "count": frame.count()}}
    with open({report!r}, "w") as file:
        json.dump(report, file)
    runpy.run_path({app!r}, run_name="__main__")  # the job, as spark-submit runs it
    """
)


@pytest.fixture(scope="module")
def lake_runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lake"))
    source_lake = SourceLake(LakeLocation(root), PREFIX)
    land_first_batches(source_lake)
    args = ["--lake-root", root, "--topic-prefix", PREFIX]
    runs = {"root": root}
    runs["first"] = summary_of(spark_submit(SPARK_APP, *args))
    runs["after_first"] = snapshot_tables(root)
    land_later_batches(source_lake)
    runs["second"] = summary_of(spark_submit(SPARK_APP, *args))
    runs["after_second"] = snapshot_tables(root)

    report = os.path.join(root, "..", "spark_read.json")
    uris = {f"{zone}/{collection}": table_uri(root, zone, collection) for zone, collection in TABLES}
    reader = os.path.join(root, "..", "reader.py")
    with open(reader, "w") as file:
        file.write(READER.format(app=SPARK_APP, uris=uris, report=report))
    runs["repeat"] = summary_of(spark_submit(reader, *args))
    runs["after_repeat"] = snapshot_tables(root)
    with open(report) as file:
        runs["spark_read"] = json.load(file)

    # On a copy, so the tests of the runs above see their lake as those runs left it.
    flattened_root = str(tmp_path_factory.mktemp("flattened_lake"))
    shutil.copytree(root, flattened_root, dirs_exist_ok=True)
    flattened_args = ["--lake-root", flattened_root, "--topic-prefix", PREFIX]
    flattened = spark_submit(SPARK_APP, *flattened_args, *FLATTENING.spark_arguments())
    # spark-submit passes the driver's stderr, where the job logs, on to its stdout
    runs["flattened"], runs["flattened_log"] = summary_of(flattened), flattened.stdout + flattened.stderr
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
    assert sorted(state) == [1, 2, 4]  # 3 deleted; 5 only in the uncommitted batch 3
    order = state[1]
    assert order["qty"] == 30 and order["__event_order"] == "8202" and order["__rs"] == "rs0"
    assert order["customer"] == str(CUSTOMER)
    assert order["total"] == "12.50"
    assert order["placed"] == datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    assert order["big"] == 2**40 and math.isnan(order["ratio"]) and order["paid"] is True
    assert order["blob"] == b"\x00\x01"
    assert order["address"] == {"city": "Oslo", "zip": "0150"}
    assert order["tags"] == ["a", "b"]
    assert json.loads(order["pattern"]) == {"$regularExpression": {"pattern": "^x", "options": "i"}}
    assert order["w"] == {"$numberLong": "5"}
    assert order["__op"] == "field named like a metadata column"  # only a changes column is named so
    assert json.loads(order["__doc"])["total"] == {"$numberDecimal": "12.50"}
    # the lossless copy is the document's own BSON
    assert order["__doc_bson"] == bson.encode({**ORDER_1, "qty": 30})
    assert order["__id"] == "1"
    # The update without `after` applied to the previous version.
    assert state[2]["qty"] == 2 and state[2]["nested"] == {"x": 1, "y": "new"}
    assert "flag" not in json.loads(state[2]["__doc"]) and state[2].get("flag") is None
    assert state[4]["tags"] == []


def test_first_run_writes_the_committed_events_partitioned_by_hour(lake_runs):
    table = DeltaTable(table_uri(lake_runs["root"], "changes", "orders"), version=1)
    hours = pa.table(table.get_add_actions(flatten=True)).column("partition.hour").to_pylist()
    assert sorted(set(hours)) == ["2023-11-14T22", "2023-11-14T23"]
    rows = lake_runs["after_first"]["changes/orders"]["rows"]
    assert sorted((row["_id"], row["__op"]) for row in rows) == [
        (1, "r"), (1, "u"), (2, "r"), (2, "u"), (3, "d"), (3, "r"), (4, "c"),
    ]  # fmt: skip
    assert {row["hour"] for row in rows if row["__op"] == "r"} == {"2023-11-14T22"}
    assert next(row for row in rows if row["__op"] == "r" and row["_id"] == 1)["___op"] == ORDER_1["__op"]
    delete = next(row for row in rows if row["__op"] == "d")
    assert delete["__deleted"] is True and delete["qty"] is None and delete["__source_ts_ms"] == HOUR_2 * 1000
    partial = next(row for row in rows if row["_id"] == 2 and row["__op"] == "u")
    assert (
        partial["nested"] == {"x": None, "y": "new"} and partial["flag"] is None and partial["tags"] is None
    )
    assert lake_runs["first"][ORDERS] == {
        "new_events": 8,  # the tombstone included: it is an event, with no change row by default
        "state_rows": 3,
        "change_rows": 7,
        "change_rows_written": 7,
        "changes_rebuilt": False,
        "state_version": 0,  # both tables created by this run
        "changes_version": 0,
    }


def test_a_batch_not_in_the_batch_log_is_ignored_until_committed(lake_runs):
    first, second = lake_runs["after_first"], lake_runs["after_second"]
    assert 5 not in {row["_id"] for row in first["changes/orders"]["rows"]}
    assert {row["_id"] for row in first["state/metrics"]["rows"]} == {"m1", "m2"}
    assert 5 in by_id(second["state/orders"]["rows"])
    assert {row["_id"] for row in second["changes/metrics"]["rows"]} == {"m1", "m2", "m3"}


def test_second_run_applies_only_the_new_batches(lake_runs):
    second = lake_runs["after_second"]
    # batches 3 and 4: three order events and one metric, nothing of batches 1 and 2 again
    assert lake_runs["second"][ORDERS] == {
        "new_events": 3,
        "state_rows": len(second["state/orders"]["rows"]),
        "change_rows": 10,
        "change_rows_written": 3,
        "changes_rebuilt": False,
        "state_version": 1,  # one commit to the state; two to the changes: its new columns, then its rows
        "changes_version": 2,
    }
    assert lake_runs["second"][METRICS]["new_events"] == 1
    assert lake_runs["second"][METRICS]["change_rows_written"] == 1
    assert sorted((row["_id"], row["__op"]) for row in second["changes/orders"]["rows"]) == [
        (1, "r"), (1, "u"), (2, "r"), (2, "u"), (3, "c"), (3, "d"), (3, "r"), (4, "c"), (4, "u"), (5, "c"),
    ]  # fmt: skip
    state = by_id(second["state/orders"]["rows"])
    assert {1, 2, 4, 5} <= set(state)  # 3: see the test below
    assert state[5]["tags"] == ["d"] and state[4]["coupon"] == "SPRING"
    # documents the new batches did not touch keep their stored rows (and read null in the new column)
    first = by_id(lake_runs["after_first"]["state/orders"]["rows"])
    for document_id in (1, 2):
        untouched = dict(state[document_id])
        assert untouched.pop("coupon") is None
        assert json.dumps(untouched, default=str) == json.dumps(first[document_id], default=str)


def test_an_old_insert_in_a_later_batch_does_not_resurrect_a_deleted_document(lake_runs):
    assert 3 not in by_id(lake_runs["after_second"]["state/orders"]["rows"])


def files_kept(before: dict, after: dict) -> set[str]:
    return set(before["files"]) - set(after["files"])


def test_a_new_field_adds_a_column_without_rewriting_old_change_files(lake_runs):
    first, second = lake_runs["after_first"], lake_runs["after_second"]
    assert not files_kept(first["changes/orders"], second["changes/orders"])  # every old file kept
    assert len(second["changes/orders"]["files"]) > len(first["changes/orders"]["files"])
    assert "coupon" not in first["changes/orders"]["schema"].names
    assert second["changes/orders"]["schema"].field("coupon").type == pa.string()
    coupons = {(row["_id"], row["__op"]): row["coupon"] for row in second["changes/orders"]["rows"]}
    assert coupons[(4, "u")] == "SPRING" and coupons[(4, "c")] is None and coupons[(1, "r")] is None


def test_a_type_conflict_goes_to_a_fallback_sibling_without_rewriting_old_files(lake_runs):
    first, second = lake_runs["after_first"], lake_runs["after_second"]
    assert not files_kept(first["changes/metrics"], second["changes/metrics"])
    schema = second["changes/metrics"]["schema"]
    assert schema.field("value").type == pa.int64() and schema.field("value__fallback").type == pa.string()
    values = {row["_id"]: (row["value"], row["value__fallback"]) for row in second["changes/metrics"]["rows"]}
    assert values == {"m1": (1, None), "m2": (2, None), "m3": (None, '"three"')}
    state = {row["_id"]: (row["value"], row["value__fallback"]) for row in second["state/metrics"]["rows"]}
    assert state == values


def test_spark_reads_every_table(lake_runs):
    read = lake_runs["spark_read"]
    assert read["changes/metrics"]["count"] == 3
    assert read["changes/orders"]["count"] == 10
    assert read["state/orders"]["count"] == len(lake_runs["after_second"]["state/orders"]["rows"])
    assert read["state/metrics"]["count"] == 3
    expected_orders_columns = {
        "__id",
        "__doc",
        "_id",
        "customer",
        "placed",
        "blob",
        "address",
        "__op",
        "coupon",
    }
    assert expected_orders_columns <= set(read["state/orders"]["columns"])
    assert {"__op", "___op", "__deleted", "nested", "coupon", "hour"} <= set(
        read["changes/orders"]["columns"]
    )
    assert {"value", "value__fallback"} <= set(read["changes/metrics"]["columns"])


def test_repeating_a_run_changes_nothing(lake_runs):
    before, after = lake_runs["after_second"], lake_runs["after_repeat"]
    assert {name: table["version"] for name, table in after.items()} == {
        name: table["version"] for name, table in before.items()
    }
    assert comparable(after) == comparable(before)
    # no collection had work: none was transformed (work.source_work)
    assert lake_runs["repeat"] == {}


def run_app(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SPARK_APP, *args], capture_output=True, text=True, env=app_environment()
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--flattening", "{not json"], "--flattening: "),
        (["--flattening", '{"array.encoding": "list"}'], "key 'array.encoding' is 'list'"),
        (["--rebuild-hours", "{not json"], "--rebuild-hours: not JSON"),
        (["--rebuild-hours", '["2024-05-01"]'], '--rebuild-hours: expected ["YYYY-MM-DDTHH", ...]'),
        (["--rebuild-hours", '"2024-05-01T13"'], '--rebuild-hours: expected ["YYYY-MM-DDTHH", ...]'),
        (["--committed", '{"rs0": 1}'], "unrecognized arguments: --committed"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, extra, message):
    result = run_app("--lake-root", str(tmp_path), "--topic-prefix", PREFIX, *extra)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic-prefix", PREFIX], "the following arguments are required: --lake-root"),
        (["--lake-root", "/lake"], "the following arguments are required: --topic-prefix"),
        (["--lake-root", "/lake", "--topic-prefix", "a/b"], "--topic-prefix 'a/b' is not a directory name"),
        (["--lake-root", "/lake", "--topic-prefix", ".."], "--topic-prefix '..' is not a directory name"),
    ],
)
def test_missing_or_bad_lake_arguments_exit_2(args, message):
    result = run_app(*args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr


def test_other_flattening_options_rebuild_the_changes_tables_with_them(lake_runs):
    before, after = lake_runs["after_repeat"], lake_runs["after_flattened"]
    # The copy's state is untouched (same version, files and rows); its changes have a new version.
    assert comparable(after)["state/orders"] == comparable(before)["state/orders"]
    assert after["changes/orders"]["version"] > before["changes/orders"]["version"]
    assert not set(after["changes/orders"]["files"]) & set(before["changes/orders"]["files"])
    assert lake_runs["flattened"][ORDERS]["changes_rebuilt"] is True
    assert lake_runs["flattened"][METRICS]["changes_rebuilt"] is True
    assert (
        "sales.orders: other flattening options than the changes table's: rebuilding it"
        in (lake_runs["flattened_log"])
    )
    rows = after["changes/orders"]["rows"]
    # every committed event again (the delete dropped, per delete.tombstone.handling.mode)
    assert sorted((row["_id"], row["__op"]) for row in rows) == [
        (1, "r"), (1, "u"), (2, "r"), (2, "u"), (3, "c"), (3, "r"), (4, "c"), (4, "u"), (5, "c"),
    ]  # fmt: skip
    order = next(row for row in rows if row["_id"] == 1 and row["__op"] == "r")
    assert (order["address_city"], order["tags__0"], order["tags__1"]) == ("Oslo", "a", "b")
    assert order["w_$numberLong"] == "5"
    assert order["__source_rs"] == "rs0" and not {"address", "__source_ts_ms"} & set(order)
    partial = next(row for row in rows if row["_id"] == 2 and row["__op"] == "u")
    assert (partial["nested_y"], partial["flag"]) == ("new", None)
    recorded = after["changes/orders"]["schema"].field(lake.HOUR_COLUMN).metadata
    assert json.loads(recorded[FLATTENING_METADATA.encode()]) == FLATTENING.to_json()
