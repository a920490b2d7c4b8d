"""One replica set captured end to end through Airflow (dag.test), a real mongod and a real Spark: the
snapshot's state equals each collection, streamed writes reach state and raw exactly once, a cleared
and rerun run changes nothing, and a deleted offset takes a new snapshot.

The tests of this module form one scenario and run in file order: snapshot, then streamed
writes, then a cleared-and-rerun DAG run.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from cdc_support import assert_state_equals_collection
from conftest import make_source
from datagen import COLLECTIONS, FALLBACK_FIELDS, load, random_writes

RUN_DATE = dt.datetime(2026, 1, 1, 5, tzinfo=dt.timezone.utc)
COUNTS = {"customers": 4000, "orders": 4000, "products": 2500}


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory):
    directory = tmp_path_factory.mktemp("replica_set_cdc")
    source = make_source(
        directory, replica_set.uri, "rs_cdc", **{"snapshot.max.threads": 2, "max.batch.size": 300}
    )
    with replica_set.client() as client:
        client.drop_database(source.database)
        load(client[source.database], COUNTS)
        source.run()  # snapshot
        yield source, client, {}


@pytest.mark.parametrize("collection", COLLECTIONS)
def test_snapshot_state_equals_collection(scenario, collection):
    source, client, _ = scenario
    assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
    snapshot_reads = [r for r in source.raw_rows(collection) if r["op"] == "r"]
    assert len(snapshot_reads) == COUNTS[collection]
    assert all(r["source"]["snapshot"] for r in snapshot_reads)


def test_streamed_writes_reach_state_and_raw_exactly_once(scenario):
    source, client, shared = scenario
    writes = random_writes(client[source.database], 1000)
    assert len(writes.events) >= 950  # a few no-op $unset writes produce no event
    source.run(logical_date=RUN_DATE)
    for collection in COLLECTIONS:
        assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
        assert source.streamed_events(collection) == writes.of(collection)
    shared["writes"] = writes


def _outputs(source):
    outputs = {}
    for collection in COLLECTIONS:
        state = sorted((r["__id"], r["__doc"], r["__event_order"]) for r in source.state_rows(collection))
        changes = sorted(
            (r["__cluster_time"], r["__event_order"], r["__op"], str(r.get("_id")))
            for r in source.change_rows(collection)
        )
        raw = [(r["cluster_time"], r["event_order"], r["op"], r["key"]) for r in source.raw_rows(collection)]
        outputs[collection] = (state, changes, raw)
    return outputs


def test_clearing_and_rerunning_a_finished_run_changes_nothing(scenario, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    source, _, shared = scenario
    assert "writes" in shared, "runs after the streaming test"
    before = _outputs(source)
    submitted = []
    submit = SparkSubmitOperator.execute
    monkeypatch.setattr(
        SparkSubmitOperator, "execute", lambda self, context: submitted.append(1) or submit(self, context)
    )
    run = source.run(logical_date=RUN_DATE)
    assert _outputs(source) == before
    # no collection had work (transform.work): the transform task succeeded without spark-submit
    assert run.get_task_instance("plan_transform").xcom_pull(task_ids="plan_transform", key="work") == []
    assert run.get_task_instance("transform").state == "success" and submitted == []


def test_deleting_the_offset_takes_a_new_snapshot_that_reaches_state(scenario):
    from airflow.models import Variable

    from mongo_cdc.capture.offsets import offset_key

    source, client, _ = scenario
    key = offset_key(source.name, "rs0")
    seq_before = json.loads(Variable.get(key))["batch_seq"]
    target = client[source.database].products.find_one({}, sort=[("_id", 1)])
    client[source.database].products.update_one({"_id": target["_id"]}, {"$set": {"price": 12345.5}})
    Variable.delete(key)  # what an operator does to force a re-snapshot
    source.run()
    offset = json.loads(Variable.get(key))
    assert offset["snapshot"]["seq"] > seq_before  # batch numbers keep increasing across the reset
    for collection in COLLECTIONS:
        assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
