"""Through Airflow: a corrupted offset fails the run naming its Variable and writes nothing; a writer
claim left by a crashed task does not block the next run."""

from __future__ import annotations

import json

from airflow.models import Variable
from datagen import load

from mongo_cdc.capture.offsets import offset_key
from mongo_cdc.lake.storage import table_if_exists


def _raw_files(source) -> list[str]:
    """Every data file of the raw tables, and each table's version."""
    tables = [
        table_if_exists(source.lake.raw_uri(f"{source.database}.{c}"), {}) for c in ("customers", "orders")
    ]
    return sorted(uri for table in tables for uri in [str(table.version()), *table.file_uris()])


def test_a_corrupted_offset_fails_the_run_naming_the_variable_and_writes_nothing(
    cdc_source, replica_set, db_name
):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        load(client[db_name], {"customers": 20, "orders": 20})
        source.run(skip_spark=True)
        client[db_name].customers.insert_one({"_id": "after"})
        key = offset_key(source.name, "rs0")
        Variable.set(key, '{"format": 1, "batch_seq": "seven"')  # a hand edit gone wrong
        files = _raw_files(source)
        run = source.run(expect="failed", skip_spark=True)
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states["shard_sync.snapshot"] == "failed" and states["shard_sync.pull"] == "upstream_failed"
        assert states["plan_transform"] == "failed" and states["transform"] == "upstream_failed"  # no Spark
        assert _raw_files(source) == files
        assert Variable.get(key) == '{"format": 1, "batch_seq": "seven"'


def test_a_claim_left_by_a_crashed_task_does_not_block_the_next_run(cdc_source, replica_set, db_name):
    source = cdc_source(db_name)
    with replica_set.client() as client:
        load(client[db_name], {"customers": 20})
        source.run(skip_spark=True)
        key = offset_key(source.name, "rs0")
        offset = json.loads(Variable.get(key))
        offset["writer"] = {
            "dag_id": source.dag_id,
            "run_id": "gone",
            "task_id": "shard_sync.pull",
            "map_index": 0,
        }
        Variable.set(key, json.dumps(offset))
        client[db_name].customers.insert_one({"_id": "after the crash"})
        source.run(skip_spark=True)
        assert json.loads(Variable.get(key))["writer"] is None
        assert any(r["op"] == "c" for r in source.raw_rows("customers"))
