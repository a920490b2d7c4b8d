"""Re-snapshots, asked for or forced by a lost oplog position, end to end (Airflow dag.test, a real
mongod, real Spark).

An on-call re-snapshot through the trigger params and their validation, then a stored position
that the oplog has lost: ``initial`` fails saying how to re-snapshot, ``when_needed`` with
``oplog.lost.recovery`` ``resnapshot`` re-snapshots by itself. Deletes the pipeline never saw must
vanish from the state in both re-snapshots.
"""

from __future__ import annotations

import pytest
from cdc_support import (
    assert_state_equals_collection,
    overwrite_the_oplog_past,
    stored_offset,
    stream_past_everything_written_so_far,
)
from conftest import make_source
from datagen import FALLBACK_FIELDS, load

from mongo_cdc import extjson

COUNTS = {"customers": 300, "orders": 300}


def _state_ids(source, collection: str) -> set[str]:
    return {row["__id"] for row in source.state_rows(collection)}


def _by_id(row: dict) -> str:
    return row["__id"]


def _ids(documents) -> set[str]:
    return {extjson.encode_str(document["_id"]) for document in documents}


@pytest.fixture(scope="module")
def scenario(airflow_db, replica_set, tmp_path_factory):
    source = make_source(tmp_path_factory.mktemp("resnapshot"), replica_set.uri, "resnapshot")
    with replica_set.client() as client:
        client.drop_database(source.database)
        load(client[source.database], COUNTS)
        source.run()  # the initial snapshot
        yield source, client


def test_resnapshot_of_one_collection_drops_its_unseen_deletes_and_leaves_the_other_alone(scenario):
    source, client = scenario
    db = client[source.database]
    orders_before = source.state_rows("orders")
    deleted = list(db.customers.find({}, {"_id": 1}).limit(40))
    db.customers.delete_many({"_id": {"$in": [d["_id"] for d in deleted]}})
    db.customers.update_one({}, {"$set": {"name": "renamed while nobody streamed"}})
    stream_past_everything_written_so_far(source, client, "rs0")
    # After the blind spot: streamed only if the re-snapshot keeps the stored position.
    db.orders.insert_one({"_id": 10**6, "status": "new", "mixed": 1})
    seq_before = stored_offset(source, "rs0").batch_seq

    source.run(conf={"resnapshot": True, "collections": [f"{source.database}.customers"]})

    assert not _ids(deleted) & _state_ids(source, "customers")
    assert_state_equals_collection(source, client, "customers")
    assert_state_equals_collection(source, client, "orders", FALLBACK_FIELDS["orders"])
    new_order = extjson.encode_str(10**6)
    orders_after = [row for row in source.state_rows("orders") if row["__id"] != new_order]
    assert sorted(orders_after, key=_by_id) == sorted(orders_before, key=_by_id)
    snapshot = stored_offset(source, "rs0").snapshot
    assert snapshot["collections"] == [f"{source.database}.customers"] and snapshot["seq"] > seq_before


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"resnapshot": True, "collections": ["resnapshot.customer"]},
            'param "collections": unknown collection resnapshot.customer; the captured collections of '
            "source 'resnapshot' are: resnapshot.customers, resnapshot.orders",
        ),
        (
            {"resnapshot": True, "shards": ["rs9"]},
            "param \"shards\": unknown shard rs9; the shards of source 'resnapshot' are: rs0",
        ),
    ],
)
def test_an_unknown_collection_or_shard_fails_discover_naming_the_known_ones(scenario, capfd, conf, message):
    source, client = scenario
    seq_before = stored_offset(source, "rs0").batch_seq
    capfd.readouterr()
    run = source.run(conf=conf, expect="failed", skip_spark=True)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["discover"] == "failed" and states["shard_sync.snapshot"] == "upstream_failed"
    assert states["plan_transform"] == "failed" and states["transform"] == "upstream_failed"  # no Spark
    assert message in "".join(capfd.readouterr())
    assert stored_offset(source, "rs0").batch_seq == seq_before
    assert_state_equals_collection(source, client, "customers")
    assert_state_equals_collection(source, client, "orders", FALLBACK_FIELDS["orders"])


# -- the oplog loses the stored position --------------------------------------------------------


def test_oplog_loss_fails_initial_with_the_fix_and_when_needed_resnapshots(
    airflow_db, small_oplog, tmp_path, capfd
):
    source = make_source(tmp_path, small_oplog.uri, "oplog_lost")
    with small_oplog.client() as client:
        db = client[source.database]
        load(db, COUNTS)
        source.run()
        deleted = list(db.customers.find({}, {"_id": 1}).limit(30)) + list(
            db.orders.find({}, {"_id": 1}).limit(5)
        )
        db.customers.delete_many({"_id": {"$in": [d["_id"] for d in deleted]}})
        db.orders.delete_many({"_id": {"$in": [d["_id"] for d in deleted]}})
        db.orders.update_one({}, {"$set": {"status": "updated while nobody streamed"}})
        overwrite_the_oplog_past(client, stored_offset(source, "rs_small").cluster_time)

        capfd.readouterr()
        run = source.run(expect="failed", skip_spark=True)  # snapshot.mode initial
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert states["shard_sync.pull"] == "failed"
        output = "".join(capfd.readouterr())
        assert "is no longer in the oplog" in output
        assert 'trigger the DAG with the params {"resnapshot": true}' in output

        seq_before = stored_offset(source, "rs_small").batch_seq
        # the full copy is the resnapshot recovery's (heal, the default, is test_oplog_recovery's)
        settings = {"snapshot.mode": "when_needed", "oplog.lost.recovery": "resnapshot"}
        source = make_source(tmp_path, small_oplog.uri, "oplog_lost", **settings)
        source.run()
        assert stored_offset(source, "rs_small").snapshot["seq"] > seq_before
        assert not _ids(deleted) & (_state_ids(source, "customers") | _state_ids(source, "orders"))
        assert_state_equals_collection(source, client, "customers")
        assert_state_equals_collection(source, client, "orders", FALLBACK_FIELDS["orders"])
        assert {row["__rs"] for row in source.state_rows("customers")} == {"rs_small"}
