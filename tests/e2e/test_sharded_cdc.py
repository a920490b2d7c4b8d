"""A sharded cluster (a config-server replica set describing shard replica sets, real mongods): one
pull per shard and state the union of the shards, migrations produce no events, an added shard is
snapshotted then streamed, a removed one drained and retired, an unreachable one fails alone.

There is no mongos binary here: the tests play the router's part by writing the cluster
metadata (config.shards, config.collections, config.chunks) themselves and writing each document
straight to the shard that owns it. The pipeline connects to the config server, as Debezium's
connector does. The tests run in file order as one scenario.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass

import bson
import pytest
from airflow.models import Variable
from airflow.models.dagrun import DagRun
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from cdc_support import assert_state_equals_documents, documents
from conftest import make_source

from mongo_cdc.capture.offsets import offset_key
from mongo_cdc.capture.topology import discover_shards, make_client
from mongo_cdc.verify.comparison import ShardScope
from mongo_cdc_dev.testing import ReplicaSet

DB = "sharded_shop"
USERS = f"{DB}.users"
# sharded on g: _ids of every kind, those MongoDB takes as one (1, NumberLong(1), 1.0) among them
IDS = f"{DB}.ids"
IDS_CHUNKS = [(MinKey(), 10, "shard01"), (10, MaxKey(), "shard02")]
MIXED_IDS = [MinKey(), Int64(1), 2.5, Decimal128("3.25"), "s", ObjectId(), ObjectId(), {"a": 1},
             dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), True, MaxKey()]  # fmt: skip


@dataclass
class Cluster:
    config: ReplicaSet
    shards: dict[str, ReplicaSet]
    chunks: list[tuple[object, object, str]]  # (min k, max k, shard id)

    def cfg(self):
        return make_client(self.config.uri)

    def shard(self, shard_id: str):
        return make_client(self.shards[shard_id].uri)

    def register(self, shard_id: str) -> None:
        with self.cfg() as client:
            host = f"{shard_id}/{','.join(self.shards[shard_id].hosts)}"
            client.config.shards.insert_one({"_id": shard_id, "host": host, "state": 1})

    def set_chunks(self, chunks: list[tuple[object, object, str]], namespace: str = USERS) -> None:
        """``namespace``'s chunks on its one shard-key field (``k`` of users, ``g`` of ids)."""
        if namespace == USERS:
            self.chunks = chunks
        field = "k" if namespace == USERS else "g"
        with self.cfg() as client:
            entry = client.config.collections.find_one({"_id": namespace})
            client.config.chunks.delete_many({"uuid": entry["uuid"]})
            client.config.chunks.insert_many(
                [
                    {
                        "uuid": entry["uuid"],
                        "min": {field: lo},
                        "max": {field: hi},
                        "shard": s,
                        "lastmod": Timestamp(n + 1, 0),
                    }
                    for n, (lo, hi, s) in enumerate(chunks)
                ]
            )

    def owner(self, k: int) -> str:
        def below(bound, value):  # MinKey < every number < MaxKey
            return isinstance(bound, MinKey) or (not isinstance(bound, MaxKey) and bound <= value)

        return next(s for lo, hi, s in self.chunks if below(lo, k) and not below(hi, k))

    def insert_user(self, k: int, **fields) -> None:
        with self.shard(self.owner(k)) as client:
            client[DB].users.insert_one({"_id": f"u{k}", "k": Int64(k), **fields})

    def expected_users(self, shard_ids) -> list[dict]:
        """The union of the shards' live users, without orphans (documents outside their owner's range)."""
        union = []
        for shard_id in shard_ids:
            with self.shard(shard_id) as client:
                union.extend(d for d in documents(client, DB, "users") if self.owner(int(d["k"])) == shard_id)
        return union


@pytest.fixture(scope="module")
def cluster(airflow_db, tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    with (
        ReplicaSet("cfg", base, role="configsvr") as cfg,
        ReplicaSet("shard01", base, role="shardsvr") as s1,
        ReplicaSet("shard02", base, role="shardsvr") as s2,
        ReplicaSet("shard03", base, role="shardsvr") as s3,
    ):
        cluster = Cluster(cfg, {"shard01": s1, "shard02": s2, "shard03": s3}, [])
        cluster.register("shard01")
        cluster.register("shard02")
        with cluster.cfg() as client:
            client.config.collections.insert_many(
                [
                    {"_id": USERS, "key": {"k": 1}, "uuid": Binary(uuid.uuid4().bytes, 4)},
                    {"_id": IDS, "key": {"g": 1}, "uuid": Binary(uuid.uuid4().bytes, 4)},
                ]
            )
        cluster.set_chunks([(MinKey(), 1000, "shard01"), (1000, MaxKey(), "shard02")])
        cluster.set_chunks(IDS_CHUNKS, IDS)
        for shard_id in cluster.shards:
            with cluster.shard(shard_id) as client:
                # every shard of a sharded collection has the shard key index
                client[DB].users.create_index("k")
                client[DB].ids.create_index("g")
        # one quick reconnection: a stopped shard's pull then fails in seconds, not after the
        # default backoff (about 23 minutes)
        # every scheduled run verifies (a test's single one)
        source = make_source(
            base,
            cfg.uri,
            DB,
            **{
                "connect.max.attempts": 1,
                "connect.backoff.initial.delay.ms": 100,
                "verify.interval.hours": 1,
            },
        )
        yield cluster, source


def test_discovery_maps_one_group_per_shard_and_state_is_the_union(cluster):
    cluster, source = cluster
    for k in [*range(0, 300), *range(1000, 1300)]:
        cluster.insert_user(k, name=f"user {k}")
    with cluster.shard("shard01") as client:
        client[DB].notes.insert_many([{"_id": i, "text": f"note {i}"} for i in range(20)])  # unsharded
        # an orphan: its key belongs to shard02's range, yet a copy sits on shard01
        client[DB].users.insert_one({"_id": "orphan", "k": Int64(1500), "name": "left behind by a migration"})
        client[DB].create_collection("empty")
        client[DB].gone.insert_many([{"_id": n} for n in range(3)])
    for index, value in enumerate(MIXED_IDS):
        with cluster.shard("shard01" if index * 2 < 10 else "shard02") as client:
            client[DB].ids.insert_one({"_id": value, "g": index * 2})

    with cluster.cfg() as client:
        assert [s.id for s in discover_shards(client)] == ["shard01", "shard02"]
    run = source.run()
    pulls = sorted(
        (ti.map_index, ti.rendered_map_index)
        for ti in run.get_task_instances()
        if ti.task_id == "shard_sync.pull"
    )
    assert pulls == [(0, "shard01"), (1, "shard02")]
    assert [s["id"] for s in json.loads(Variable.get(f"mongo_cdc.{DB}.topology"))] == ["shard01", "shard02"]

    assert_state_equals_documents(source, "users", cluster.expected_users(["shard01", "shard02"]))
    assert "orphan" not in {json.loads(r["__doc"])["_id"] for r in source.state_rows("users")}
    with cluster.shard("shard01") as client:
        assert_state_equals_documents(source, "notes", documents(client, DB, "notes"))


def test_migration_writes_produce_no_events(cluster):
    cluster, source = cluster
    with cluster.shard("shard01") as client:
        moved = client[DB].users.find_one({"_id": "u5"})
        client[DB].users.update_one({"_id": "u7"}, {"$set": {"name": "renamed"}})
    with cluster.shard("shard02") as client:
        # what a chunk migration writes on the recipient: flagged fromMigrate in the oplog
        client.admin.command("applyOps", [{"op": "i", "ns": USERS, "o": moved, "fromMigrate": True}])
        client[DB].users.delete_one({"_id": "u1001"})
    cluster.insert_user(2500, name="new on shard02")
    source.run()

    streamed = {
        (r["source"]["rs"], json.loads(r["key"])["id"], r["op"]) for r in source.raw_rows("users") if r["op"]
    }
    assert ("shard02", '"u5"', "c") not in streamed
    assert {("shard01", '"u7"', "u"), ("shard02", '"u1001"', "d"), ("shard02", '"u2500"', "c")} <= streamed
    assert_state_equals_documents(source, "users", cluster.expected_users(["shard01", "shard02"]))


def _owned_ids(cluster) -> list[dict]:
    """The ids documents each shard owns (by g, per IDS_CHUNKS after the migration test's move)."""
    with cluster.shard("shard01") as one, cluster.shard("shard02") as two:
        return [d for d in documents(one, DB, "ids") if d["g"] < 6] + [
            d for d in documents(two, DB, "ids") if d["g"] >= 6
        ]


def test_each_shard_verifies_the_ranges_it_owns_and_a_chunk_migration_is_no_drift(cluster):
    cluster, source = cluster
    # a chunk migration of ids' [6, 10) to shard02, as MongoDB makes it: fromMigrate writes on both
    # shards (no change stream shows them), then the new owner in config.chunks
    with cluster.shard("shard01") as one, cluster.shard("shard02") as two:
        moved = list(one[DB].ids.find({"g": {"$gte": 6, "$lt": 10}}))
        assert len(moved) == 2
        two.admin.command("applyOps", [{"op": "i", "ns": IDS, "o": d, "fromMigrate": True} for d in moved])
        one.admin.command(
            "applyOps", [{"op": "d", "ns": IDS, "o": {"_id": d["_id"]}, "fromMigrate": True} for d in moved]
        )
        # drift: NumberLong(1) becomes 1.0 (one _id to MongoDB) by a write no stream shows
        one.admin.command(
            "applyOps",
            [{"op": "u", "ns": IDS, "o": {"_id": 1.0, "g": 2, "v": "drifted"}, "o2": {"_id": Int64(1)},
              "fromMigrate": True}],
        )  # fmt: skip
        one[DB].gone.drop()
    cluster.set_chunks([(MinKey(), 6, "shard01"), (6, MaxKey(), "shard02")], IDS)

    with cluster.cfg() as cfg, cluster.shard("shard01") as one, cluster.shard("shard02") as two:
        first = source.verify_reporting(one, "shard01", ShardScope(cfg, "shard01"))
        second = source.verify_reporting(two, "shard02", ShardScope(cfg, "shard02"))
    assert not first.failed and not second.failed and first.skipped is None is second.skipped
    # shard01: the drifted document only; the unsharded collections are its own (the first shard)
    assert first.drift == 1 and first.collections[IDS]["different"] == 1
    assert first.collections[IDS]["example_keys"] == ['["n","1"]']
    assert {namespace: found["source_count"] for namespace, found in first.collections.items()} == {
        IDS: 3,
        USERS: 300,
        f"{DB}.notes": 20,
        f"{DB}.empty": 0,
    }
    # shard02: the migrated documents are compared where they are now (their state rows still name
    # shard01); u5's copy on shard02 and the orphan on shard01 are no shard's range: no drift
    assert second.drift == 0 and set(second.collections) == {IDS, USERS}
    assert second.collections[IDS]["source_count"] == len(MIXED_IDS) - 3
    gone = [
        row
        for row in source.verification_rows()
        if row["verification_id"] == first.verification_id and row["namespace"] == f"{DB}.gone"
    ]
    assert [(row["action"], row["note"]) for row in gone] == [
        ("skipped", "dropped or renamed while it was verified")
    ]


def test_added_shard_triggers_a_run_and_is_snapshotted_then_streamed(cluster):
    cluster, source = cluster
    cluster.register("shard03")
    cluster.set_chunks([(MinKey(), 1000, "shard01"), (1000, 3000, "shard02"), (3000, MaxKey(), "shard03")])
    for k in range(3000, 3100):
        cluster.insert_user(k, name=f"user {k}")

    import os

    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    topology = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag(
        f"mongo_cdc_topology__{DB}"
    )

    def pause_cdc_dag(paused: bool) -> None:
        with create_session() as session:
            session.get(DagModel, source.dag_id).is_paused = paused

    # the shard watch follows the CDC DAG's pause switch: paused, it triggers nothing
    pause_cdc_dag(True)
    run = topology.test()
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {
        "shards_changed": "skipped",
        "trigger_cdc": "skipped",
    }
    assert not DagRun.find(dag_id=source.dag_id, run_type="operator_triggered")
    # unpaused, the sensor defers and its trigger (run in line by dag.test) sees shard03
    pause_cdc_dag(False)
    run = topology.test()
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {
        "shards_changed": "success",
        "trigger_cdc": "success",
    }
    assert run.get_task_instance("shards_changed").xcom_pull(task_ids="shards_changed") == [
        "shard01",
        "shard02",
        "shard03",
    ]
    assert DagRun.find(dag_id=source.dag_id, run_type="operator_triggered", state="queued")

    cluster.insert_user(3100, name="in shard03 before its snapshot")
    cluster.insert_user(900, name="written on shard01 meanwhile")
    source.run()  # what the triggered run does
    shard03_reads = [r for r in source.raw_rows("users") if r["source"]["rs"] == "shard03" and r["op"] == "r"]
    assert len(shard03_reads) == 101
    cluster.insert_user(3101, name="streamed from shard03")
    # a scheduled run, due to verify (verify.interval.hours: 1): it heals the drift the test before
    # found (the run before could not: shard03's snapshot was not applied yet, whose copy removes
    # what it did not find)
    run = source.run(scheduled=True)
    verified = {
        ti.rendered_map_index: ti.state
        for ti in run.get_task_instances()
        if ti.task_id == "shard_sync.verify"
    }
    assert verified == {"shard01": "success", "shard02": "success", "shard03": "success"}
    assert_state_equals_documents(source, "users", cluster.expected_users(["shard01", "shard02", "shard03"]))
    assert_state_equals_documents(source, "ids", _owned_ids(cluster), frozenset({"_id"}))
    # one repair row, landed by the shard that owns the document (changes rows do not name a
    # replica set: its raw row does), and readers of changes see it
    repaired = [
        row["source"]["rs"]
        for row in source.raw_rows("ids")
        if row["after"] is not None and bson.decode(row["after"]).get("v") == "drifted"
    ]
    assert repaired == ["shard01"]
    assert [row["__op"] for row in source.change_rows("ids") if row.get("v") == "drifted"] == ["r"]
    assert ("shard03", '"u3101"', "c") in {
        (r["source"]["rs"], json.loads(r["key"])["id"], r["op"]) for r in source.raw_rows("users")
    }


def test_removed_shard_is_drained_and_retired_without_deletes(cluster):
    cluster, source = cluster
    cluster.insert_user(3200, name="last write on shard03")
    with cluster.shard("shard03") as client:
        client[DB].users.update_one({"_id": "u3000"}, {"$set": {"name": "updated before removal"}})
        before_removal = documents(client, DB, "users")
    # the balancer has moved shard03's chunks away; the shard is removed from the cluster
    with cluster.cfg() as client:
        client.config.shards.delete_one({"_id": "shard03"})
    cluster.set_chunks([(MinKey(), 1000, "shard01"), (1000, MaxKey(), "shard02")])
    with cluster.shard("shard02") as client:  # the migrated documents, copied with fromMigrate writes
        client.admin.command(
            "applyOps", [{"op": "i", "ns": USERS, "o": d, "fromMigrate": True} for d in before_removal]
        )

    source.run()
    raw = {
        (r["source"]["rs"], json.loads(r["key"])["id"], r["op"]) for r in source.raw_rows("users") if r["op"]
    }
    assert {("shard03", '"u3200"', "c"), ("shard03", '"u3000"', "u")} <= raw
    assert not any(rs == "shard03" and op == "d" for rs, _, op in raw)
    assert json.loads(Variable.get(offset_key(DB, "shard03")))["retired_at"]
    assert_state_equals_documents(source, "users", cluster.expected_users(["shard01", "shard02"]))

    source.run()  # the retired shard is gone for good
    assert [s["id"] for s in json.loads(Variable.get(f"mongo_cdc.{DB}.topology"))] == ["shard01", "shard02"]


def test_unreachable_shard_fails_alone_and_the_others_still_land(cluster):
    cluster, source = cluster
    before = json.loads(Variable.get(offset_key(DB, "shard01")))["batch_seq"]
    cluster.shards["shard02"].stop()
    try:
        cluster.insert_user(950, name="lands while shard02 is down")
        run = source.run(expect="failed")
        states = {(ti.task_id, ti.rendered_map_index): ti.state for ti in run.get_task_instances()}
        assert states[("shard_sync.pull", "shard01")] == "success"
        # shard02's run stops where it first needs the server: its snapshot_start plans with it
        assert states[("snapshot_start", "shard02")] == "failed"
        [pull] = [
            ti for ti in run.get_task_instances() if ti.task_id == "shard_sync.pull" and ti.map_index == 1
        ]
        assert pull.state == "failed"  # told its snapshot_start failed
        assert states[("transform", None)] == "success"
        assert json.loads(Variable.get(offset_key(DB, "shard01")))["batch_seq"] > before
        assert "u950" in {json.loads(r["__doc"])["_id"] for r in source.state_rows("users")}
    finally:
        cluster.shards["shard02"].start()
    source.run()
    assert_state_equals_documents(source, "users", cluster.expected_users(["shard01", "shard02"]))
