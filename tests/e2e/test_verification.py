"""Verification against MongoDB, end to end (Airflow dag.test, a real mongod, real Spark): writes
racing a verification are never drift; writes the change stream never shows (``applyOps`` with
``fromMigrate``) are found by ``_id`` range, only reported under ``verify.on.drift: report``, and
healed by the same run's transform under ``fail``, which then fails the verify task. Damaged data
files met by the verification and by the transform are named with their fix, and the fixes heal
them: a raw file restored, a state file taken out of its table's log by a verifying run, which lands
its documents again (read back by deltalake, DuckDB and Spark).

One module-wide source and three DAG runs (and one without Spark) serve every test, in order; the
``report`` verifications are the core's call the verify task makes, without a DAG run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import threading

import pyarrow as pa
import pytest
from bson import DatetimeConversion, Decimal128, Int64, MaxKey, MinKey, ObjectId
from cdc_support import assert_state_equals_collection, documents
from conftest import make_source
from deltalake import DeltaTable
from reader_support import duckdb_connection
from statsd_support import airflow_statsd

from mongo_cdc import extjson, lake
from mongo_cdc.lake.readers import spark_table
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.verify.verification import VerificationResult

DB = "verification"
FIRST_RUN = dt.datetime(2025, 1, 1, 5, tzinfo=dt.timezone.utc)
MIXED = frozenset({"_id"})  # _ids of several types: Extended JSON text in the state
SETTINGS = {"snapshot.chunk.size": 40}


def _mixed_ids() -> list:
    return [
        *(ObjectId() for _ in range(100)),
        *range(1, 60),  # int32; 1 becomes 1.0 by a write the stream never shows
        Int64(1000),
        2.5,
        Decimal128("3.25"),
        *(f"s{n:03}" for n in range(30)),
        {"a": 1},
        dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc),
        MinKey(),
        MaxKey(),
    ]


def _source(tmp, replica_set, **settings):
    return make_source(tmp, replica_set.uri, DB, **SETTINGS, **settings)


def _last_verification(source, collection: str) -> list[dict]:
    rows = source.verification_rows()
    last = max(rows, key=lambda row: row["verified_at"])["verification_id"]
    namespace = f"{DB}.{collection}"
    return [row for row in rows if row["verification_id"] == last and row["namespace"] == namespace]


def _drift(rows: list[dict]) -> dict[str, int]:
    return {kind: sum(row[kind] for row in rows) for kind in ("missing", "extra", "different")}


def _task_states(run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verification")
    source = _source(tmp, replica_set)
    with replica_set.client() as client:
        client.drop_database(DB)
        client[DB].items.insert_many([{"_id": value, "n": index} for index, value in enumerate(_mixed_ids())])
        client[DB].create_collection("empty")
        client[DB].gone.insert_many([{"_id": n} for n in range(5)])
        run = source.run(logical_date=FIRST_RUN)  # manual, not asked: no verification
        assert _task_states(run)["shard_sync.verify"] == "skipped"
        yield tmp, source, client


def _migrate(client, *operations: dict) -> None:
    """Writes flagged fromMigrate, as a chunk migration makes them: no change stream shows them."""
    client.admin.command("applyOps", [{"ns": f"{DB}.items", "fromMigrate": True, **op} for op in operations])


def _verify_here(source, replica_set) -> VerificationResult:
    with replica_set.client(datetime_conversion=DatetimeConversion.DATETIME_MS) as client:
        return source.verify_reporting(client, "rs0")


def test_writes_racing_a_verification_are_not_drift(scenario, replica_set):
    _, source, client = scenario
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.wait(0.02):  # paced: some writes per second while the verification reads
            client[DB].items.insert_one({"_id": f"race{n}", "n": n})
            client[DB].items.update_one({"_id": (n % 50) + 2}, {"$set": {"n": f"race{n}"}})
            if n % 3 == 0:
                client[DB].items.delete_one({"_id": f"race{n // 3}"})
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        result = _verify_here(source, replica_set)
    finally:
        stop.set()
        writer.join()
    assert result.skipped is None and not result.failed, (result.skipped, result.failed)
    assert result.collections[f"{DB}.items"]["source_count"] > 0
    assert result.drift == 0 and not result.failed and result.repair_batch_seq is None
    assert _drift(_last_verification(source, "items")) == {"missing": 0, "extra": 0, "different": 0}


def test_writes_the_stream_never_showed_are_reported_then_healed_and_fail_fails_after(
    scenario, replica_set, monkeypatch
):
    tmp, source, client = scenario
    _migrate(
        client,
        {"op": "i", "o": {"_id": "drift-new", "n": -1}},
        {"op": "u", "o": {"_id": 1.0, "n": "replaced"}, "o2": {"_id": 1}},  # 1 -> 1.0: one key
        {"op": "d", "o": {"_id": MaxKey()}},
    )
    client[DB].items.insert_one({"_id": "streamed", "n": 0})  # the stream shows this one
    client[DB].gone.drop()
    drifted = ['["maxKey"]', '["n","1"]', '["s","drift-new"]']

    committed = source.lake.committed()
    reported = _verify_here(source, replica_set)  # verify.on.drift: report heals nothing
    assert sorted(reported.collections[f"{DB}.items"]["example_keys"]) == drifted
    assert source.lake.committed() == committed
    rows = _last_verification(source, "items")
    assert {row["action"] for row in rows if row["example_keys"]} == {"reported"}

    failing = _source(tmp, replica_set, **{"verify.on.drift": "fail"})
    second_run = FIRST_RUN + dt.timedelta(hours=1)
    with airflow_statsd(monkeypatch) as statsd:
        run = failing.run(logical_date=second_run, conf={"verify": True}, expect="failed")
        received = statsd.drain()
    # the drift reaches the team's monitoring (docs/monitoring.md): a gauge per kind, the repairs
    items = f"airflow.mongo_cdc.%s.{failing.name}.{replica_set.name}.{DB}__items"
    for kind in ("missing", "extra", "different"):
        assert statsd.last(items % f"drift_{kind}") == 1
    assert statsd.total(items % "repaired_documents") == 3
    assert received[f"airflow.mongo_cdc.verify.{failing.name}.{replica_set.name}"][-1][1] == "ms"

    states = _task_states(run)
    assert states["shard_sync.verify"] == "failed" and states["transform"] == "success"
    rows = _last_verification(source, "items")
    assert len(rows) > 3 and [row["range_index"] for row in rows] == list(range(len(rows)))
    assert _drift(rows) == {"missing": 1, "extra": 1, "different": 1}
    assert sorted(key for row in rows for key in row["example_keys"]) == drifted
    assert {row["action"] for row in rows if row["example_keys"]} == {"repaired"}
    assert sum(row["source_count"] for row in rows) == client[DB].items.count_documents({})
    # healed by the same run's transform, the racing writes of the test before streamed too
    assert_state_equals_collection(source, client, "items", MIXED)
    repairs = [row for row in source.change_rows("items") if row["__cluster_time"] == rows[0]["cluster_time"]]
    assert sorted(row["__op"] for row in repairs) == ["d", "r", "r"]
    empty = _last_verification(source, "empty")
    assert [(row["source_count"], row["lake_count"], row["action"]) for row in empty] == [(0, 0, "clean")]
    gone = _last_verification(source, "gone")
    assert [row["action"] for row in gone] == ["skipped"]  # its drop is not applied yet


def _data_files(source, zone: str) -> list[str]:
    """The live data files of a table of ``items``, newest first."""
    uri = lake.table_uri(LakeLocation(source.lake_root), zone, source.prefix, DB, "items")
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    return [f"{uri}/{action['path']}" for action in sorted(actions, key=lambda a: -a["modification_time"])]


def test_damaged_data_files_are_named_with_their_fix_and_the_fixes_heal_them(scenario, replica_set, spark):
    tmp, source, client = scenario
    state_file = _data_files(source, "state")[0]
    os.remove(state_file)
    failed = _verify_here(source, replica_set).failed[f"{DB}.items"]
    assert state_file in failed and "(missing)" in failed and '"resnapshot": true' in failed
    assert '{"verify": true}' in failed  # verify heals a state table

    client[DB].items.insert_one({"_id": "after-damage"})
    source.run(logical_date=FIRST_RUN + dt.timedelta(hours=2), skip_spark=True)  # lands it in raw
    raw_file = _data_files(source, "raw")[0]
    shutil.copy(raw_file, tmp / "raw-backup.parquet")
    with open(raw_file, "r+b") as damaged:
        damaged.truncate(100)
    done = subprocess.run(source.transform_command(), capture_output=True, text=True, check=False)
    failure = json.loads(done.stdout.strip().splitlines()[-1])["failed"][f"{DB}.items"]["error"]
    assert failure.startswith("LakeFileError") and raw_file in failure and "truncated: 100 of" in failure
    assert state_file in done.stdout + done.stderr  # the whole message is logged; the summary has its start

    # the documented fixes: the raw file restored from a backup; the state healed by a run that
    # verifies (verify.on.drift: repair), which takes the lost file out of the log and lands its
    # documents again from MongoDB
    shutil.copy(tmp / "raw-backup.parquet", raw_file)
    healing = _source(tmp, replica_set)
    healing.run(logical_date=FIRST_RUN + dt.timedelta(hours=3), conf={"verify": True})
    rows = _last_verification(source, "items")
    assert state_file in rows[0]["note"] and _drift(rows)["missing"] > 0 and _drift(rows)["different"] == 0
    assert_state_equals_collection(source, client, "items", MIXED)  # read by deltalake
    uri = lake.table_uri(LakeLocation(source.lake_root), "state", source.prefix, DB, "items")
    expected = sorted(extjson.encode_str(doc["_id"]) for doc in documents(client, DB, "items"))
    by_duckdb = [
        row[0] for row in duckdb_connection().sql(f"SELECT __id FROM delta_scan('{uri}')").fetchall()
    ]
    assert sorted(by_duckdb) == expected
    assert sorted(row["__id"] for row in spark_table(spark, uri).select("__id").collect()) == expected
