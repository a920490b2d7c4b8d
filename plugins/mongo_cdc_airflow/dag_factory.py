"""One CDC DAG per source YAML: discover -> per-shard snapshot + pull -> Spark transform -> summary."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import timedelta

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, CronDataIntervalTimetable, dag, get_current_context, task, task_group

from mongo_cdc.config import SourceConfig, SourceConfigError, load_sources, sources_dir
from mongo_cdc.offsets import OffsetKeeper
from mongo_cdc.topology import discover_shards
from mongo_cdc_airflow.connections import VariableOffsetStore, mongo_client

log = logging.getLogger(__name__)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SOURCES_DIR = os.path.join(REPO_ROOT, "include", "sources")
SPARK_APP = os.environ.get("MONGO_CDC_SPARK_APP", os.path.join(REPO_ROOT, "spark_apps", "cdc_transform.py"))

# Tests set MONGO_CDC_TASK_RETRIES=0 where a failure is the point, so dag.test() doesn't wait out backoffs.
DEFAULT_ARGS = {
    "retries": int(os.environ.get("MONGO_CDC_TASK_RETRIES", "3")),
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}


def _label_map_index(shard: dict) -> None:
    """Lets the UI label each mapped task by its shard id (map_index_template below)."""
    get_current_context()["shard_id"] = shard["id"]


def _keeper(config: SourceConfig, shard: dict) -> OffsetKeeper:
    return OffsetKeeper(VariableOffsetStore(), config.name, shard["rs"])


def build_cdc_dag(config: SourceConfig) -> DAG:
    """The CDC DAG of one source."""

    @dag(
        dag_id=f"mongo_cdc__{config.name}",
        description=f"MongoDB CDC of '{config.name}' into {config.lake_root}",
        schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["mongo-cdc", config.topic_prefix],
        doc_md=f"Change-data-capture of the source defined in `{config.path}`.",
    )
    def cdc() -> None:
        @task
        def discover() -> list[dict]:
            from airflow.sdk import Variable

            with mongo_client(config.mongo_conn_id) as client:
                shards = [shard.to_dict() for shard in discover_shards(client)]
            Variable.set(f"mongo_cdc.{config.name}.topology", json.dumps(shards))
            log.info("shards: %s", ", ".join(s["id"] for s in shards))
            return shards

        @task(map_index_template="{{ shard_id }}")
        def snapshot(shard: dict) -> dict:
            from mongo_cdc.snapshot import needs_snapshot, run_snapshot, start_without_snapshot

            _label_map_index(shard)
            keeper = _keeper(config, shard)
            offset = keeper.load()
            with mongo_client(config.mongo_conn_id) as client:
                if needs_snapshot(offset, config.snapshot_mode):
                    result = run_snapshot(client, config, shard["rs"], keeper)
                    return {"documents": result.documents, "seconds": round(result.seconds, 3)}
                if offset is None or offset.resume_token is None:
                    start_without_snapshot(client, keeper)
            return {"documents": {}, "seconds": 0}

        @task(map_index_template="{{ shard_id }}")
        def pull(shard: dict, snapshot_result: dict) -> dict:
            from mongo_cdc.streaming import pull_changes

            _label_map_index(shard)
            if config.snapshot_mode == "initial_only":
                log.info("snapshot.mode is initial_only: no streaming")
                return {"rs": shard["rs"], "events": {}, "snapshot": snapshot_result}
            with mongo_client(config.mongo_conn_id) as client:
                result = pull_changes(client, config, shard["rs"], _keeper(config, shard)).to_dict()
            result["snapshot"] = snapshot_result
            return result

        @task_group
        def shard_sync(shard: dict) -> dict:
            return pull(shard, snapshot(shard))

        @task
        def plan_transform(shards: list[dict]) -> list[str]:
            """Spark arguments; committed batch numbers come from the offsets, the source of truth."""
            committed = {}
            for shard in shards:
                offset = _keeper(config, shard).load()
                committed[shard["rs"]] = offset.batch_seq if offset else 0
            return [
                "--lake-root",
                config.lake_root,
                "--topic-prefix",
                config.topic_prefix,
                "--committed",
                json.dumps(committed, sort_keys=True),
            ]

        @task
        def summary(shards: list[dict]) -> dict:
            # Explicit map indexes: how a mapped group's output resolves outside the group depends on
            # its size (one shard gives a bare dict), and the summary must see every shard.
            ti = get_current_context()["ti"]
            pulls = ti.xcom_pull(task_ids="shard_sync.pull", map_indexes=list(range(len(shards))))
            return summarize(list(pulls), pendulum.now("UTC"))

        shards = discover()
        pulls = shard_sync.expand(shard=shards)
        spark_args = plan_transform(shards)
        pulls >> spark_args
        transform = SparkSubmitOperator(
            task_id="transform",
            application=SPARK_APP,
            conn_id=config.spark_conn_id,
            application_args=spark_args,
            name=f"mongo_cdc__{config.name}",
            conf={
                "spark.pyspark.python": sys.executable,
                "spark.pyspark.driver.python": sys.executable,
                "spark.ui.enabled": "false",
            },
        )
        transform >> summary(shards)

    return cdc()


def summarize(pulls: list[dict], run_end: pendulum.DateTime) -> dict:
    """Events per collection and op across shards, and the lag of the newest event at run end."""
    events: dict[str, dict[str, int]] = {}
    newest = None
    for pull_result in pulls:
        for namespace, ops in pull_result.get("events", {}).items():
            for op, count in ops.items():
                events.setdefault(namespace, {}).setdefault(op, 0)
                events[namespace][op] += count
        for namespace, count in pull_result.get("snapshot", {}).get("documents", {}).items():
            events.setdefault(namespace, {}).setdefault("r", 0)
            events[namespace]["r"] += count
        ts_ms = pull_result.get("newest_source_ts_ms")
        if ts_ms is not None and (newest is None or ts_ms > newest):
            newest = ts_ms
    lag_s = None if newest is None else round(run_end.timestamp() - newest / 1000, 3)
    for namespace in sorted(events):
        log.info("%s: %s", namespace, ", ".join(f"{op}={n}" for op, n in sorted(events[namespace].items())))
    log.info("lag from the newest event to run end: %s s", lag_s)
    return {"events": events, "lag_seconds": lag_s}


def build_dags(directory: str | None = None) -> dict[str, DAG]:
    """Every source's DAG; any invalid source file fails the import with its file, key and fix."""
    configs, errors = load_sources(directory or sources_dir(DEFAULT_SOURCES_DIR))
    if errors:
        raise SourceConfigError(
            "invalid mongo-cdc source configuration:\n" + "\n".join(str(e) for e in errors)
        )
    return {f"mongo_cdc__{c.name}": build_cdc_dag(c) for c in configs}
