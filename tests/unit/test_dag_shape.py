"""The DAGs' schedule, retry and mapping settings, as a user sees them in the Airflow UI."""

from __future__ import annotations

import importlib

from airflow.sdk import CronDataIntervalTimetable

from mongo_cdc.capture.topology import Shard
from mongo_cdc.config import load_source
from mongo_cdc_airflow.dag_factory import build_cdc_dag, build_topology_dag
from mongo_cdc_airflow.sensors import reason_not_to_watch


def test_cdc_dag_is_hourly_with_intervals_one_run_at_a_time_and_backoff_retries(tmp_path, monkeypatch):
    monkeypatch.delenv("MONGO_CDC_TASK_RETRIES", raising=False)
    (tmp_path / "shop.yaml").write_text("topic.prefix: shop\n")
    config = load_source(str(tmp_path / "shop.yaml"))
    dag = build_cdc_dag(config)
    assert dag.dag_id == "mongo_cdc__shop"
    assert isinstance(dag.timetable, CronDataIntervalTimetable)  # real hourly data intervals
    assert (dag.catchup, dag.max_active_runs) == (False, 1)
    assert {t.task_id for t in dag.tasks} == {
        "discover",
        "snapshot_start",
        "snapshot_chunks",
        "snapshot_copy",
        "shard_sync.snapshot",
        "shard_sync.pull",
        "shard_sync.verify",
        "plan_transform",
        "transform",
        "summary",
        "stuck_collections",
        "verification_failed",
    }
    # a snapshot's chunks fan out as mapped tasks labelled by shard, collection and chunk numbers;
    # a failed shard (start or copy) leaves the others going
    assert dag.get_task("snapshot_copy").map_index_template == "{{ chunk_label }}"
    assert dag.get_task("snapshot_chunks").trigger_rule == "all_done"
    assert dag.get_task("shard_sync.snapshot").trigger_rule == "all_done"
    pull = dag.get_task("shard_sync.pull")
    assert pull.retries == 3 and pull.retry_exponential_backoff
    # the pull streams while the copies run: it waits for snapshot_start only, and the snapshot's
    # commit waits for the pull and every copy
    assert pull.upstream_task_ids == {"discover", "snapshot_start"} and pull.trigger_rule == "all_done"
    assert {"shard_sync.pull", "snapshot_copy"} <= dag.get_task("shard_sync.snapshot").upstream_task_ids
    # the verification follows its shard's commit, and the transform that applies its repairs follows it
    assert "shard_sync.snapshot" in dag.get_task("shard_sync.verify").upstream_task_ids
    assert "shard_sync.verify" in dag.get_task("plan_transform").upstream_task_ids
    assert dag.get_task("verification_failed").upstream_task_ids == {"shard_sync.verify"}
    assert dag.get_task("verification_failed").trigger_rule == "one_failed"
    assert dag.get_task("transform")._conn_id == "spark_default"
    assert (
        dag.get_task("plan_transform").trigger_rule == "all_done"
    )  # one failed shard doesn't block the rest
    # a failed transform is reported by the summary (which keeps its asset events) and fails the run
    # in stuck_collections, which runs only then
    assert dag.get_task("summary").trigger_rule == "all_done"
    assert dag.get_task("summary").upstream_task_ids == {"transform"}
    assert dag.get_task("stuck_collections").trigger_rule == "one_failed"
    assert dag.get_task("stuck_collections").retries == 0
    assert dag.get_task("stuck_collections").upstream_task_ids == {"transform"}

    topology = build_topology_dag(config)
    assert topology.get_task("trigger_cdc").trigger_dag_id == "mongo_cdc__shop"


def test_the_topology_dag_is_live_from_the_start_and_its_sensor_waits_in_the_triggerer(tmp_path):
    """One pause switch per source, the CDC DAG's (the sensor follows it), and no worker slot held
    while the sensor waits."""
    (tmp_path / "shop.yaml").write_text("topic.prefix: shop\n")
    topology = build_topology_dag(load_source(str(tmp_path / "shop.yaml")))
    assert topology.is_paused_upon_creation is False
    sensor = topology.get_task("shards_changed")
    assert sensor.poke_interval <= 300 and sensor.timeout < 15 * 60  # one wait per 15-minute run
    classpath, kwargs = sensor.trigger().serialize()
    # the triggerer rebuilds it from its class path and kwargs
    module, _, name = classpath.rpartition(".")
    assert getattr(importlib.import_module(module), name)(**kwargs).serialize() == (classpath, kwargs)
    assert kwargs["source"] == "shop" and kwargs["mongo_conn_id"] == "mongo_default"


def test_the_shard_watch_skips_while_the_cdc_dag_is_paused_or_has_not_run():
    stored = [Shard(id="rs0", rs="rs0", hosts=("h:1",))]
    assert "mongo_cdc__shop is paused" in reason_not_to_watch("shop", True, stored)
    assert "has not stored its shards yet" in reason_not_to_watch("shop", False, [])
    assert reason_not_to_watch("shop", False, stored) is None


def test_one_transform_runs_at_a_time_across_live_and_backfill_runs(tmp_path):
    """The scheduler reads the serialized DAG and counts a task's running instances over every run of
    the DAG whatever its type; backfill runs ignore max_active_runs, so the limit is on the task."""
    from airflow.serialization.serialized_objects import DagSerialization, LazyDeserializedDAG

    (tmp_path / "shop.yaml").write_text("topic.prefix: shop\n")
    data = DagSerialization.to_dict(build_cdc_dag(load_source(str(tmp_path / "shop.yaml"))))
    assert LazyDeserializedDAG(data=data).has_task_concurrency_limits  # the scheduler checks limits
    scheduled = DagSerialization.from_dict(data)
    assert scheduled.get_task("transform").max_active_tis_per_dag == 1
    # the shards' pulls still run side by side: a live pull is its offset's only writer (sole_writer),
    # a backfill's lands only history hours, whose commits Delta refuses to overlap
    assert scheduled.get_task("shard_sync.pull").max_active_tis_per_dag is None
