"""DAGs per source YAML: this module only assembles them (the task bodies live in
``source_tasks`` and ``shard_sync``, the shard lifecycle in ``mongo_cdc.capture.shard_lifecycle``).

``mongo_cdc__<source>``: discover -> snapshot_start (per shard) -> snapshot_chunks -> snapshot_copy
(per slice of chunks), beside a per-shard mapped group [pull -> snapshot (its commit) -> verify] ->
plan_transform -> Spark transform -> summary, and stuck_collections (only when the transform failed);
verification_failed (runs when a task of a shard's sync failed, fails the run when a verify did).
``mongo_cdc_topology__<source>``: a deferrable sensor that triggers the CDC DAG as soon as shards are
added to or removed from the cluster (while the CDC DAG is unpaused).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import (
    DAG,
    CronDataIntervalTimetable,
    CronTriggerTimetable,
    dag,
    task,
    task_group,
)
from airflow.task.trigger_rule import TriggerRule

from mongo_cdc.config import SourceConfig, SourceConfigError, load_sources
from mongo_cdc.config.dag_ids import cdc_dag_id, topology_dag_id
from mongo_cdc.config.dag_settings import DagSettings, resolve_callable
from mongo_cdc_airflow import chunk_copy, settings, source_tasks, task_ids
from mongo_cdc_airflow.assets import source_alias
from mongo_cdc_airflow.params import resnapshot_params
from mongo_cdc_airflow.runbook import cdc_doc, topology_doc
from mongo_cdc_airflow.sensors import ShardsChangedSensor
from mongo_cdc_airflow.shard_sync import ShardSync, sole_writer
from mongo_cdc_airflow.spark_submit import transform_task

START_DATE = pendulum.datetime(2024, 1, 1, tz="UTC")


def default_args(dag_settings: DagSettings) -> dict:
    """Task retries with exponential backoff (30 s doubling up to 10 min), and the source file's owner,
    mail and failure callback (``dag.*``).

    The retries are ``[mongo_cdc] task_retries``, read when a DAG is built: tests set 0 where a
    failure is the point, so dag.test() doesn't wait out the backoff.
    """
    args = {
        "owner": dag_settings.owner,
        "retries": settings.task_retries(),
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
    }
    callbacks = []
    if dag_settings.on_failure_callback:
        callbacks.append(resolve_callable(dag_settings.on_failure_callback))
    if dag_settings.email and dag_settings.email_on_failure:
        # Airflow 3's notifier, not the task's deprecated email settings; only imported when used
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        callbacks.append(SmtpNotifier(to=list(dag_settings.email)))
    if callbacks:
        args["on_failure_callback"] = callbacks
    return args


def dag_tags(config: SourceConfig) -> list[str]:
    """Both DAGs' tags: ``mongo-cdc``, the topic prefix, then the source file's ``dag.tags``."""
    return list(dict.fromkeys(["mongo-cdc", config.topic_prefix, *config.dag.tags]))


def dag_limits(dag_settings: DagSettings) -> dict:
    """``max_consecutive_failed_dag_runs`` when the source file sets it (else Airflow's ``[core]`` one)."""
    if dag_settings.max_consecutive_failed_runs is None:
        return {}
    return {"max_consecutive_failed_dag_runs": dag_settings.max_consecutive_failed_runs}


def build_cdc_dag(config: SourceConfig) -> DAG:
    """The CDC DAG of one source."""

    @dag(
        dag_id=cdc_dag_id(config.name),
        description=f"MongoDB CDC of '{config.name}' into {config.lake_root}",
        schedule=CronDataIntervalTimetable(config.dag.cron, timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=default_args(config.dag),
        tags=dag_tags(config),
        doc_md=cdc_doc(config),
        params=resnapshot_params(),
        **dag_limits(config.dag),
    )
    def cdc() -> None:
        @task(task_id=task_ids.DISCOVER)
        def discover() -> list[dict]:
            return source_tasks.discover(config)

        @task(task_id=task_ids.SNAPSHOT_START, map_index_template="{{ shard_id }}")
        @sole_writer(config)
        def snapshot_start(shard_entry: dict) -> dict:
            return ShardSync(config, shard_entry).start()

        # all_done here and below: a shard whose start or copy failed keeps the others going
        @task(trigger_rule=TriggerRule.ALL_DONE)
        def snapshot_chunks(shards: list[dict] | None) -> list[dict]:
            return chunk_copy.chunk_slices(config, shards)

        @task(map_index_template="{{ chunk_label }}")
        def snapshot_copy(work: dict) -> dict:
            return chunk_copy.copy_slice(config, work)

        # all_done: a shard whose snapshot_start failed is told so by its pull; the others go on
        @task(task_id=task_ids.PULL, map_index_template="{{ shard_id }}", trigger_rule=TriggerRule.ALL_DONE)
        @sole_writer(config)
        def pull(shard_entry: dict) -> dict:
            return ShardSync(config, shard_entry).pull()

        @task(
            task_id=task_ids.SNAPSHOT, map_index_template="{{ shard_id }}", trigger_rule=TriggerRule.ALL_DONE
        )
        @sole_writer(config)
        def snapshot(shard_entry: dict) -> dict:
            return ShardSync(config, shard_entry).snapshot()

        shards = discover()
        chunk_work = snapshot_chunks(shards)
        starts = snapshot_start.expand(shard_entry=shards)
        starts >> chunk_work
        # Airflow cannot map a task inside a mapped group: the chunks' fan-out sits between the groups
        copies = snapshot_copy.expand(work=chunk_work)

        # After the snapshot's commit, before the transform: its repairs are a batch this run's
        # transform applies.
        @task(task_id=task_ids.VERIFY, map_index_template="{{ shard_id }}")
        @sole_writer(config)
        def verify(shard_entry: dict, synced: dict) -> dict:
            return ShardSync(config, shard_entry).verify()

        @task_group(group_id=task_ids.SHARD_SYNC)
        def shard_sync(shard_entry: dict) -> dict:
            # The pull streams while the copies run; the commit waits for both (one offset writer at
            # a time: the copies write none). The offset and the batch numbers keep that order safe
            # (``snapshot.commit_snapshot``).
            pulled = pull(shard_entry)
            starts >> pulled
            committed = snapshot(shard_entry)
            pulled >> committed
            copies >> committed
            # the group's last task: plan_transform waits for it
            return verify(shard_entry, committed)

        @task(task_id=task_ids.PLAN_TRANSFORM, trigger_rule=TriggerRule.ALL_DONE)
        def plan_transform() -> list[str]:
            return source_tasks.plan_transform(config)

        # all_done: the summary reports (and emits the asset events of) what a failed transform left
        # behind; a failed shard reaches here through plan_transform (all_done) and fails the summary.
        @task(outlets=[source_alias(config)], trigger_rule=TriggerRule.ALL_DONE)
        def summary() -> dict:
            return source_tasks.summary(config)

        # Only when the transform failed: the run then fails here, naming the collections left behind
        # (the summary succeeds, so that its asset events are kept). No retries: it always fails.
        @task(trigger_rule=TriggerRule.ONE_FAILED, retries=0)
        def stuck_collections() -> None:
            source_tasks.stuck_collections(config)

        # Only when a shard's verification failed (or never ran because its shard failed): a leaf, so
        # the run fails too (a task that is not one fails no run), alongside the transform that heals.
        @task(task_id=task_ids.VERIFICATION_FAILED, trigger_rule=TriggerRule.ONE_FAILED, retries=0)
        def verification_failed() -> None:
            source_tasks.verification_failed()

        spark_args = plan_transform()
        synced = shard_sync.expand(shard_entry=shards)
        synced >> spark_args
        synced >> verification_failed()
        transform = transform_task(config, settings.spark_app(), spark_args)
        transform >> summary()
        transform >> stuck_collections()

    return cdc()


def build_topology_dag(config: SourceConfig, poke_interval_s: float = 180.0) -> DAG:
    """A small DAG whose sensor triggers the CDC DAG when the cluster's shard list changes."""

    @dag(
        dag_id=topology_dag_id(config.name),
        description=f"Triggers {cdc_dag_id(config.name)} when shards are added or removed",
        schedule=CronTriggerTimetable("*/15 * * * *", timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args={"owner": config.dag.owner},
        tags=dag_tags(config),
        doc_md=topology_doc(config),
        # One switch per source, the CDC DAG's: this DAG is live from the start and its sensor skips
        # while the CDC DAG is paused (sensors.reason_not_to_watch).
        is_paused_upon_creation=False,
    )
    def topology() -> None:
        ShardsChangedSensor(
            task_id="shards_changed", config=config, poke_interval=poke_interval_s, timeout=14 * 60
        ) >> TriggerDagRunOperator(
            task_id="trigger_cdc", trigger_dag_id=cdc_dag_id(config.name), wait_for_completion=False
        )

    return topology()


def _sources(directory: str | None) -> tuple[list[SourceConfig], list[SourceConfigError]]:
    return load_sources(directory or settings.sources_dir(), settings.lake_root())


def build_dags(directory: str | None = None) -> dict[str, DAG]:
    """The DAGs of every valid source. Invalid sources have none; ``raise_source_errors`` reports them."""
    configs, _ = _sources(directory)
    dags = {}
    for config in configs:
        for built in (build_cdc_dag(config), build_topology_dag(config)):
            dags[built.dag_id] = built
    return dags


def raise_source_errors(directory: str | None = None) -> None:
    """Fail with every problem of every invalid source file (dags/mongo_cdc_source_config.py calls it,
    so Airflow shows them as that file's import error while the valid sources keep their DAGs)."""
    _, errors = _sources(directory)
    if errors:
        raise SourceConfigError(
            "invalid mongo-cdc source configuration; these sources have no DAGs until it is fixed:",
            *(problem for error in errors for problem in error.problems),
        )
