"""DAGs per source YAML.

``mongo_cdc__<source>``: discover -> per-shard mapped group [snapshot -> pull] -> plan_transform
-> Spark transform -> summary. ``mongo_cdc_topology__<source>``: a sensor that triggers the CDC
DAG as soon as shards are added to or removed from the cluster.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import (
    DAG,
    CronDataIntervalTimetable,
    CronTriggerTimetable,
    Param,
    PokeReturnValue,
    Variable,
    dag,
    get_current_context,
    task,
    task_group,
)
from airflow.task.trigger_rule import TriggerRule
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure

from mongo_cdc.config import SourceConfig, SourceConfigError, load_sources, sources_dir
from mongo_cdc.offsets import Offset, OffsetKeeper, offset_key
from mongo_cdc.topology import Shard, discover_shards, reconcile, topology_changed
from mongo_cdc_airflow.connections import VariableOffsetStore, mongo_client, shard_client

log = logging.getLogger(__name__)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SOURCES_DIR = os.path.join(REPO_ROOT, "include", "sources")
SPARK_APP = os.environ.get("MONGO_CDC_SPARK_APP", os.path.join(REPO_ROOT, "spark_apps", "cdc_transform.py"))
START_DATE = pendulum.datetime(2024, 1, 1, tz="UTC")


def default_args() -> dict:
    """Task retries with exponential backoff (30 s doubling up to 10 min).

    Read when a DAG is built: tests set MONGO_CDC_TASK_RETRIES=0 where a failure is the point,
    so dag.test() doesn't wait out the backoff.
    """
    return {
        "retries": int(os.environ.get("MONGO_CDC_TASK_RETRIES", "3")),
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
    }


def topology_variable(source: str) -> str:
    return f"mongo_cdc.{source}.topology"


def stored_topology(source: str) -> list[Shard]:
    key = topology_variable(source)
    text = Variable.get(key, default=None)
    if text is None:
        return []
    try:
        return [Shard.from_dict(entry) for entry in json.loads(text)]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"Variable '{key}' is not a valid shard list ({exc}); delete it "
            f"(`airflow variables delete {key}`): the next run discovers the shards again"
        ) from None


def _label_map_index(shard: dict) -> None:
    """Lets the UI label each mapped task by its shard id (map_index_template below)."""
    get_current_context()["shard_id"] = shard["id"]


def is_backfill() -> bool:
    """A backfill run (``airflow backfill create``, the UI's Backfill) only completes its past interval."""
    return get_current_context()["dag_run"].run_type == "backfill"


def backfill_interval_hours() -> list[str]:
    from mongo_cdc.backfill import hour_partitions

    context = get_current_context()
    return hour_partitions(context["data_interval_start"], context["data_interval_end"])


def _keeper(config: SourceConfig, rs: str) -> OffsetKeeper:
    return OffsetKeeper(VariableOffsetStore(), config.name, rs)


def sole_writer(config: SourceConfig) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Wrap a per-shard task so it is its offset's only writer while it runs (offsets.WriterConflict).

    A backfill run never writes an offset, so it claims none and never waits for the live sync.
    """

    def decorate(work: Callable[..., dict]) -> Callable[..., dict]:
        @functools.wraps(work)
        def claimed(shard_entry: dict, *args: object) -> dict:
            if is_backfill():
                return work(shard_entry, *args)
            ti = get_current_context()["ti"]
            me = {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "map_index": ti.map_index}

            def still_running(holder: dict) -> bool:
                running = ti.get_ti_count(
                    dag_id=holder["dag_id"],
                    run_ids=[holder["run_id"]],
                    task_ids=[holder["task_id"]],
                    map_index=holder.get("map_index"),
                    states=["running"],
                )
                return running > 0

            keeper = _keeper(config, shard_entry["rs"])
            keeper.claim(me, still_running)
            try:
                return work(shard_entry, *args)
            finally:
                keeper.release(me)

        return claimed

    return decorate


def _unreachable(shard: Shard, exc: ConnectionFailure) -> RuntimeError:
    hosts = ", ".join(shard.hosts) or "the source connection's hosts"
    return RuntimeError(f"shard {shard.id}: cannot reach replica set {shard.rs} ({hosts}): {exc}")


def resnapshot_params() -> dict[str, Param]:
    """The trigger form's on-call re-snapshot (README: re-snapshots). Scheduled runs use the defaults."""
    return {
        "resnapshot": Param(
            False,
            type="boolean",
            title="Re-snapshot",
            description="Copy the collections below again, then stream. Their state tables are reconciled: "
            "documents that no longer exist disappear.",
        ),
        "collections": Param(
            [],
            type="array",
            items={"type": "string"},
            title="Collections to re-snapshot",
            description="<db>.<collection> names, one per line. Empty: every captured collection. "
            "With names, streaming goes on from its stored position, so the other collections miss nothing.",
        ),
        "shards": Param(
            [],
            type="array",
            items={"type": "string"},
            title="Shards to re-snapshot",
            description="Shard ids, one per line (a plain replica set is one shard named like the set). "
            "Empty: every shard.",
        ),
    }


def check_resnapshot_params(config: SourceConfig, params: Mapping[str, Any], shards: list[Shard]) -> None:
    """Fail before anything is copied when the trigger names a shard or collection the source lacks."""
    if params["resnapshot"] and is_backfill():
        raise ValueError(
            "a backfill only completes past intervals and cannot re-snapshot; trigger the DAG with "
            '{"resnapshot": true} as a normal run instead'
        )
    if not params["resnapshot"]:
        if params["collections"] or params["shards"]:
            raise ValueError(
                'params "collections" and "shards" choose what to re-snapshot; set "resnapshot" to true too'
            )
        return
    live = [shard for shard in shards if not shard.retiring]
    known_shards = sorted(shard.id for shard in live)
    unknown = sorted(set(params["shards"]) - set(known_shards))
    if unknown:
        raise ValueError(
            f'param "shards": unknown shard {", ".join(unknown)}; '
            f"the shards of source '{config.name}' are: {', '.join(known_shards)}"
        )
    if params["collections"]:
        from mongo_cdc.snapshot import captured_collections

        known: set[str] = set()
        for shard in live:
            try:
                with shard_client(config.mongo_conn_id, shard) as client:
                    known.update(f"{db}.{coll}" for db, coll in captured_collections(client, config))
            except ConnectionFailure as exc:
                raise _unreachable(shard, exc) from None
        unknown = sorted(set(params["collections"]) - known)
        if unknown:
            captured = ", ".join(sorted(known)) or "none"
            raise ValueError(
                f'param "collections": unknown collection {", ".join(unknown)}; '
                f"the captured collections of source '{config.name}' are: {captured}"
            )


def snapshot_selection(
    config: SourceConfig, shard: Shard, offset: Offset | None, client: MongoClient
) -> tuple[str, ...] | None:
    """What a run copies on ``shard`` before streaming: collection names (``()``: all), or None."""
    from mongo_cdc.snapshot import needs_snapshot, resume_position_lost

    params = get_current_context()["params"]
    if needs_snapshot(offset, config.snapshot_mode):
        return ()
    if params["resnapshot"] and (not params["shards"] or shard.id in params["shards"]):
        log.info("re-snapshot requested by the trigger: %s", ", ".join(params["collections"]) or "all")
        return tuple(params["collections"])
    # when_needed has an offset here: needs_snapshot asked for no snapshot
    if config.snapshot_mode == "when_needed" and resume_position_lost(client, offset.resume_token):
        log.warning(
            "shard %s: the stored resume position is no longer in the oplog; re-snapshotting it "
            "(snapshot.mode when_needed)",
            shard.id,
        )
        return ()
    return None


def build_cdc_dag(config: SourceConfig) -> DAG:
    """The CDC DAG of one source."""

    @dag(
        dag_id=f"mongo_cdc__{config.name}",
        description=f"MongoDB CDC of '{config.name}' into {config.lake_root}",
        schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=default_args(),
        tags=["mongo-cdc", config.topic_prefix],
        doc_md=f"Change-data-capture of the source defined in `{config.path}`.",
        params=resnapshot_params(),
    )
    def cdc() -> None:
        @task
        def discover() -> list[dict]:
            """Live shards, plus removed shards whose offset still has to be drained."""
            store = VariableOffsetStore()

            def has_active_offset(shard: Shard) -> bool:
                offset = _keeper(config, shard.rs).load()
                return offset is not None and not offset.retired_at

            with mongo_client(config.mongo_conn_id) as client:
                live = discover_shards(client)
            shards = reconcile(stored_topology(config.name), live, has_active_offset)
            check_resnapshot_params(config, get_current_context()["params"], shards)
            if not is_backfill():  # the live sync owns the topology it drains
                store.set(topology_variable(config.name), json.dumps([s.to_dict() for s in shards]))
            for shard in shards:
                log.info(
                    "shard %s (replica set %s)%s", shard.id, shard.rs, " retiring" if shard.retiring else ""
                )
            return [shard.to_dict() for shard in shards]

        @task(map_index_template="{{ shard_id }}")
        @sole_writer(config)
        def snapshot(shard_entry: dict) -> dict:
            from mongo_cdc.snapshot import run_snapshot, start_without_snapshot

            _label_map_index(shard_entry)
            if is_backfill():
                log.info("backfill run: no snapshot, the pull completes the interval's history")
                return {"documents": {}, "seconds": 0}
            shard = Shard.from_dict(shard_entry)
            keeper = _keeper(config, shard.rs)
            offset = keeper.load()
            if offset is not None and offset.retired_at and not shard.retiring:
                log.info("shard %s is back after being retired: starting it afresh", shard.id)
                offset = None
            if shard.retiring:
                return {"documents": {}, "seconds": 0}
            try:
                with shard_client(config.mongo_conn_id, shard) as client:
                    only = snapshot_selection(config, shard, offset, client)
                    if only is not None:
                        if shard.via_source:
                            result = run_snapshot(client, config, shard.rs, keeper, only=only)
                        else:
                            with mongo_client(config.mongo_conn_id) as cluster:
                                result = run_snapshot(
                                    client, config, shard.rs, keeper, cluster, shard.id, only
                                )
                        return {"documents": result.documents, "seconds": round(result.seconds, 3)}
                    if offset is None or offset.resume_token is None:
                        start_without_snapshot(client, config, shard.rs, keeper)
            except ConnectionFailure as exc:
                raise _unreachable(shard, exc) from None
            return {"documents": {}, "seconds": 0}

        @task(map_index_template="{{ shard_id }}")
        @sole_writer(config)
        def pull(shard_entry: dict, snapshot_result: dict) -> dict:
            from mongo_cdc.streaming import pull_changes

            _label_map_index(shard_entry)
            shard = Shard.from_dict(shard_entry)
            if is_backfill():
                return backfill(shard)
            if config.snapshot_mode == "initial_only":
                log.info("snapshot.mode is initial_only: no streaming")
                return {"rs": shard.rs, "events": {}, "snapshot": snapshot_result}
            keeper = _keeper(config, shard.rs)
            # connection failures are retried inside the pull (connect.* settings), which names the
            # hosts when it gives up
            with shard_client(config.mongo_conn_id, shard) as client:
                result = pull_changes(
                    client, config, shard.rs, keeper, interval_s=schedule_interval_s()
                ).to_dict()
            if shard.retiring:
                retired_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
                keeper.commit(keeper.load() or Offset(), retired_at=retired_at)
                log.info("shard %s left the cluster: its stream is drained and its offset retired", shard.id)
            result["snapshot"] = snapshot_result
            return result

        def backfill(shard: Shard) -> dict:
            from mongo_cdc.backfill import backfill_interval

            context = get_current_context()
            start, end = context["data_interval_start"], context["data_interval_end"]
            offset = _keeper(config, shard.rs).load()
            with shard_client(config.mongo_conn_id, shard) as client:
                result = backfill_interval(client, config, shard.rs, offset, start, end)
            return {"rs": shard.rs, "events": result.history_events, "backfill": result.to_dict()}

        @task_group
        def shard_sync(shard_entry: dict) -> dict:
            return pull(shard_entry, snapshot(shard_entry))

        @task(trigger_rule=TriggerRule.ALL_DONE)
        def plan_transform() -> list[str]:
            """Spark arguments; committed batches of every replica set this source ever streamed.

            Runs even when a shard failed, so the other shards' data still lands; the offsets
            (not this run's XComs) say what is committed, retired shards included.
            """
            store = VariableOffsetStore()
            prefix = offset_key(config.name, "")
            committed = {}
            for key in store.keys(prefix):
                if key != topology_variable(config.name):
                    offset = _keeper(config, key.removeprefix(prefix)).load()
                    committed[key.removeprefix(prefix)] = offset.batch_seq if offset else 0
            return [
                "--lake-root",
                config.lake_root,
                "--topic-prefix",
                config.topic_prefix,
                "--committed",
                json.dumps(committed, sort_keys=True),
                *config.flattening.spark_arguments(),
                *(["--rebuild-hours", json.dumps(backfill_interval_hours())] if is_backfill() else []),
            ]

        # Default trigger rule: a failed transform must fail the run. A failed shard reaches here
        # through plan_transform (all_done) and is reported below.
        @task
        def summary(shards: list[dict]) -> dict:
            # Explicit map indexes: how a mapped group's output resolves outside the group depends on
            # its size (one shard gives a bare dict), and the summary must see every shard.
            ti = get_current_context()["ti"]
            pulls = [ti.xcom_pull(task_ids="shard_sync.pull", map_indexes=i) for i in range(len(shards))]
            result = summarize([p for p in pulls if p is not None], pendulum.now("UTC"))
            failed = [shard["id"] for shard, p in zip(shards, pulls, strict=True) if p is None]
            if failed:
                raise RuntimeError(
                    f"shards {', '.join(failed)} did not sync (see their pull tasks); the other shards' "
                    "changes landed and they catch up at the next run"
                )
            return result

        shards = discover()
        pulls = shard_sync.expand(shard_entry=shards)
        spark_args = plan_transform()
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


def build_topology_dag(config: SourceConfig, poke_interval_s: float = 180.0) -> DAG:
    """A small DAG whose sensor triggers the CDC DAG when the cluster's shard list changes."""

    @dag(
        dag_id=f"mongo_cdc_topology__{config.name}",
        description=f"Triggers mongo_cdc__{config.name} when shards are added or removed",
        schedule=CronTriggerTimetable("*/15 * * * *", timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["mongo-cdc", config.topic_prefix],
    )
    def topology() -> None:
        @task.sensor(poke_interval=poke_interval_s, timeout=14 * 60, mode="reschedule", soft_fail=True)
        def shards_changed() -> PokeReturnValue:
            with mongo_client(config.mongo_conn_id) as client:
                live = discover_shards(client)
            changed = topology_changed(stored_topology(config.name), live)
            if changed:
                log.info("shard list changed: now %s", ", ".join(s.id for s in live))
            return PokeReturnValue(is_done=changed, xcom_value=[s.id for s in live])

        shards_changed() >> TriggerDagRunOperator(
            task_id="trigger_cdc", trigger_dag_id=f"mongo_cdc__{config.name}", wait_for_completion=False
        )

    return topology()


def summarize(pulls: list[dict], run_end: pendulum.DateTime) -> dict:
    """Events per collection and op across shards, the lag of the newest event at run end, and faults.

    The faults are the disconnects and primary elections the pulls rode out (Debezium's
    ``NumberOfDisconnects`` / ``NumberOfPrimaryElections``); ``oplog`` has each replica set's oplog
    window and headroom.
    """
    events: dict[str, dict[str, int]] = {}
    newest = None
    faults = {"disconnects": 0, "primary_elections": 0}
    for pull_result in pulls:
        for counter in faults:
            faults[counter] += pull_result.get(counter, 0)
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
    log.info("disconnects: %d, primary elections: %d", faults["disconnects"], faults["primary_elections"])
    return {"events": events, "lag_seconds": lag_s, **faults, "oplog": oplog_windows(pulls)}


def schedule_interval_s() -> float:
    """The run's data interval: how long the committed position waits between scheduled pulls."""
    context = get_current_context()
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None or end <= start:
        from mongo_cdc.streaming import DEFAULT_INTERVAL_S

        return DEFAULT_INTERVAL_S
    return (end - start).total_seconds()


def oplog_windows(pulls: list[dict]) -> dict[str, dict]:
    """Each replica set's oplog window and headroom as its pull measured them (see ``oplog_window``)."""
    windows = {pull["rs"]: pull["oplog"] for pull in pulls if pull.get("oplog")}
    for rs, window in sorted(windows.items()):
        log.info(
            "replica set %s: oplog window %s s, committed position %s s old, headroom %s s",
            rs, window["window_seconds"], window["position_age_seconds"], window["headroom_seconds"],
        )  # fmt: skip
    return windows


def build_dags(directory: str | None = None) -> dict[str, DAG]:
    """Every source's DAGs; any invalid source file fails the import with its file, key and fix."""
    configs, errors = load_sources(directory or sources_dir(DEFAULT_SOURCES_DIR))
    if errors:
        raise SourceConfigError(
            "invalid mongo-cdc source configuration:\n" + "\n".join(str(e) for e in errors)
        )
    dags = {}
    for config in configs:
        for built in (build_cdc_dag(config), build_topology_dag(config)):
            dags[built.dag_id] = built
    return dags
