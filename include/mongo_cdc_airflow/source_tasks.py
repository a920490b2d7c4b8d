"""The source-wide task bodies of the CDC DAG: discover, plan_transform, summary, stuck_collections."""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import replace

import pendulum
from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException
from pymongo.errors import ConnectionFailure

from mongo_cdc.capture.collection_kinds import (
    NOT_CAPTURED,
    STREAMED,
    TIME_SERIES,
    VIEW,
    CollectionKind,
    classify_collections,
    not_captured,
)
from mongo_cdc.capture.oplog_window import duration
from mongo_cdc.capture.shard_lifecycle import still_draining
from mongo_cdc.capture.topology import Shard, discover_shards, reconcile
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.errors import LegacyLakeError, refuse_legacy_layout
from mongo_cdc.lake.maintenance import MaintenanceSettings
from mongo_cdc.transform.applied_mark import read_mark
from mongo_cdc.transform.backlog import Backlog, behind_text, collections_behind, source_backlogs
from mongo_cdc.transform.work import plan_work
from mongo_cdc_airflow import task_ids
from mongo_cdc_airflow.assets import TABLE_ZONES, emit_table_events
from mongo_cdc_airflow.failures import deterministic_failures, fail_at_once
from mongo_cdc_airflow.hash_key import with_hash_key
from mongo_cdc_airflow.hooks import MongoCdcHook
from mongo_cdc_airflow.lake_storage import source_lake
from mongo_cdc_airflow.params import check_known, resnapshot_filters, resnapshot_request, stream_move_request
from mongo_cdc_airflow.shard_sync import is_backfill, unreachable
from mongo_cdc_airflow.variables import (
    offset_keeper,
    store_topology,
    stored_topology,
)

log = logging.getLogger(__name__)


def discover(config: SourceConfig) -> list[dict]:
    """Live shards, plus removed shards whose offset still has to be drained.

    The trigger's params are checked first (no server needed), the shards and collections they
    name right after discovery: a wrong trigger fails here, at once and without retries.
    """
    with deterministic_failures():  # a stored offset to fix by hand does not mend with retries
        return _discover(config)


def _discover(config: SourceConfig) -> list[dict]:
    context = get_current_context()
    request = resnapshot_request(context["dag_run"].conf, context["params"], is_backfill())
    with_hash_key(config)  # a missing field.hash.list key fails the run here, before anything lands
    lake = source_lake(config)
    try:  # before anything is written: a lake of the previous layout is never half converted
        refuse_legacy_layout(lake.location, config.topic_prefix)
    except LegacyLakeError as exc:
        raise AirflowFailException(str(exc)) from None
    hook = MongoCdcHook(mongo_conn_id=config.mongo_conn_id)
    with hook.source_client() as client:
        live = discover_shards(client)
        kinds = classify_collections(client, config, sharded=not any(shard.via_source for shard in live))
    log_collection_kinds(kinds)
    kinds_by_name = {kind.namespace: kind.kind for kind in kinds}
    shards = reconcile(
        stored_topology(config.name),
        live,
        lambda shard: still_draining(offset_keeper(config, shard.rs).load()),
    )
    move = stream_move_request(context["params"])
    named_shards = (request.shards if request else ()) + (move.shards if move else ())
    if request is not None or named_shards:
        live_shards = [shard for shard in shards if not shard.retiring]
        collections = request.collections if request else ()
        captured = captured_collections(config, hook, live_shards) if collections else None
        check_known(
            config.name,
            named_shards,
            collections,
            [shard.id for shard in live_shards],
            captured,
            kinds_by_name,
        )
        check_filters(hook, resnapshot_filters(context["params"]))
    if not is_backfill():  # the live sync owns the topology it drains
        store_topology(config.name, shards)
    for shard in shards:
        log.info("shard %s (replica set %s)%s", shard.id, shard.rs, " retiring" if shard.retiring else "")
    # plan_transform compares them with its own, to tell whether a failed run landed anything
    context["ti"].xcom_push(key=task_ids.COMMITTED_KEY, value=committed_batches(config))
    # the views the shard tasks read, and the collections the summary names as not captured
    context["ti"].xcom_push(key=task_ids.KINDS_KEY, value=kinds_by_name)
    context["ti"].xcom_push(key=task_ids.NOT_CAPTURED_KEY, value=not_captured(kinds))
    return [shard.to_dict() for shard in shards]


def log_collection_kinds(kinds: list[CollectionKind]) -> None:
    """One line per kind of what the source does with the collections its filters match, and a
    warning naming each one it does not capture, with why."""
    by_kind: dict[str, list[str]] = {}
    for kind in kinds:
        by_kind.setdefault(kind.kind, []).append(kind.namespace)
    for name in (STREAMED, VIEW, TIME_SERIES):
        if by_kind.get(name):
            log.info("%s: %d: %s", name, len(by_kind[name]), ", ".join(by_kind[name]))
    for kind in kinds:
        if kind.kind == NOT_CAPTURED:
            log.warning("%s", kind.describe())


def captured_collections(config: SourceConfig, hook: MongoCdcHook, shards: list[Shard]) -> set[str]:
    from mongo_cdc.capture.snapshot import captured_collections

    known: set[str] = set()
    for shard in shards:
        try:
            with hook.shard_client(shard) as client:
                known.update(f"{db}.{coll}" for db, coll in captured_collections(client, config))
        except ConnectionFailure as exc:
            raise unreachable(shard, exc) from None
    return known


def check_filters(hook: MongoCdcHook, filters: dict[str, str] | None) -> None:
    """The server accepts every filter of the trigger's re-snapshot (``snapshot_filters``)."""
    from mongo_cdc.capture.snapshot_filters import refused_filters

    if not filters:
        return
    with hook.source_client() as client:
        refused = refused_filters(client, filters)
    if refused:
        fail_at_once("; ".join(refused))


def committed_batches(config: SourceConfig) -> dict[str, int]:
    """The last batch the lake committed of every replica set this source ever streamed."""
    return source_lake(config).committed()


def plan_transform(config: SourceConfig) -> list[str]:
    """Spark arguments. Runs even when a shard failed, so the other shards' data still lands (the
    lake's batch log, not this run's XComs, says what is committed). Fails at once (no retries, so
    the transform never starts Spark) when discover failed, or when every shard failed without
    committing a batch: a skip would not do, since a run whose last tasks are skipped succeeds.
    """
    context = get_current_context()
    ti = context["ti"]
    shards = ti.xcom_pull(task_ids=task_ids.DISCOVER)
    if shards is None:
        raise AirflowFailException("discover failed (see its log): nothing was pulled, so no transform")
    pulls = [ti.xcom_pull(task_ids=task_ids.SHARD_SNAPSHOT, map_indexes=i) for i in range(len(shards))]
    landed = committed_batches(config) != ti.xcom_pull(task_ids=task_ids.DISCOVER, key=task_ids.COMMITTED_KEY)
    if all(result is None for result in pulls) and not landed:
        raise AirflowFailException(
            "every shard failed before committing a batch (see their tasks): nothing new to transform"
        )
    hours: tuple[str, ...] = ()
    if is_backfill():
        from mongo_cdc.capture.backfill import hour_partitions

        hours = tuple(hour_partitions(context["data_interval_start"], context["data_interval_end"]))
    # none for manual runs
    maintenance = maintenance_settings(
        config, context.get("data_interval_start"), context.get("data_interval_end")
    )
    # Whether the job will find work, asked as it asks it: a run with nothing starts no Spark (the
    # transform task reads the work key). The collections that may be behind, for the summary's asset
    # events: one catching up after a failed run has tables that change although no batch of it landed.
    lake = source_lake(config)
    plan = plan_work(lake, lake.batches(), config.flattening, hours, maintenance)
    if plan.first is None:
        log.info("no collection has transform work: the transform starts no Spark")
    else:  # the job logs every collection's work: asking each here would read every table twice
        log.info("transform work for %s (the first by name): %s", plan.first, ", ".join(plan.reasons))
    ti.xcom_push(key=task_ids.WORK_KEY, value=[] if plan.first is None else [plan.first])
    ti.xcom_push(key=task_ids.PENDING_KEY, value=list(plan.pending))
    return [
        "--lake-root",
        config.lake_root,
        "--topic-prefix",
        config.topic_prefix,
        "--run-id",
        context["run_id"],
        *config.flattening.spark_arguments(),
        *(["--rebuild-hours", json.dumps(list(hours))] if hours else []),
        *maintenance_arguments(maintenance),
    ]


def maintenance_settings(
    config: SourceConfig, interval_start: dt.datetime | None, interval_end: dt.datetime | None
) -> MaintenanceSettings | None:
    """The ``--maintain`` settings of every scheduled run, for one share of the collections: the run
    whose interval starts at UTC hour H since the epoch maintains ``slot`` H mod
    ``lake.optimize.interval.hours`` (``lake.maintenance.maintained``), so each table is compacted and
    vacuumed once per interval (daily by default) and no run visits every table of a source of
    thousands. A run whose interval is longer than an hour (a ``dag.schedule`` slower than hourly)
    has no slot: the hours it spans hold several shares, so it maintains every table that is due. None
    (no maintenance) for manual runs (no interval) and an interval of 0."""
    every = config.lake_optimize_interval_hours
    if not every or interval_start is None or interval_end is None:
        return None
    settings = MaintenanceSettings(every, config.lake_retention_hours)
    if interval_end - interval_start > dt.timedelta(hours=1):
        return settings
    return replace(settings, slot=int(interval_start.timestamp() // 3600) % every)


def maintenance_arguments(settings: MaintenanceSettings | None) -> list[str]:
    """The job's ``--maintain`` argument for ``maintenance_settings``' answer, if any."""
    return [] if settings is None else ["--maintain", settings.to_text()]


def summary(config: SourceConfig) -> dict:
    """The run's figures (``summarize``), each collection's committed batches its tables have not
    applied (``batches_behind``), and an asset event for each table the run touched, brought up to
    date or left behind (``assets``: their URIs). Runs even when the transform failed, to report
    what it left behind (``stuck_collections`` fails the run then). A run with a failed shard fails
    here, and a failed task's asset events are dropped."""
    # when the task runs, not when the DAG is parsed: metrics may be off
    from mongo_cdc_airflow.metrics import (
        emit_run_metrics,
        emit_state_rows,
        emit_success,
        emit_verification_metrics,
    )

    context = get_current_context()
    ti = context["ti"]
    shards = ti.xcom_pull(task_ids=task_ids.DISCOVER)
    if shards is None:
        raise AirflowFailException("discover failed (see its log): nothing was pulled, so nothing to report")
    # Explicit map indexes: how a mapped group's output resolves outside the group depends on
    # its size (one shard gives a bare dict), and the summary must see every shard.
    pulls = [ti.xcom_pull(task_ids=task_ids.SHARD_SNAPSHOT, map_indexes=i) for i in range(len(shards))]
    run_end = pendulum.now("UTC")
    run_end_ms = int(run_end.timestamp() * 1000)
    result = summarize([p for p in pulls if p is not None], run_end)
    verifications = [
        ti.xcom_pull(task_ids=task_ids.SHARD_VERIFY, key=task_ids.VERIFICATION_KEY, map_indexes=i)
        for i in range(len(shards))
    ]
    result["verification"] = verified_collections([v for v in verifications if v is not None])
    result["not_captured"] = report_not_captured(
        ti.xcom_pull(task_ids=task_ids.DISCOVER, key=task_ids.NOT_CAPTURED_KEY) or {}
    )
    emit_verification_metrics(config.name, [v for v in verifications if v is not None])
    lake = source_lake(config)
    batches = lake.batches()
    backlogs = source_backlogs(lake, batches)
    result["batches_behind"] = report_backlogs(backlogs)
    emit_run_metrics(config.name, [p for p in pulls if p is not None], run_end_ms)
    failed = [shard["id"] for shard, p in zip(shards, pulls, strict=True) if p is None]
    if failed:  # a retry reads the same pull results: fail at once
        fail_at_once(
            f"shards {', '.join(failed)} did not sync (see their shard_sync tasks); the other shards' "
            "changes landed and they catch up at the next run"
        )
    committed_before = ti.xcom_pull(task_ids=task_ids.DISCOVER, key=task_ids.COMMITTED_KEY)
    # a backfill rewrites changes rows only: the state never reads history events
    zones = ("changes",) if is_backfill() else TABLE_ZONES
    pending = ti.xcom_pull(task_ids=task_ids.PLAN_TRANSFORM, key=task_ids.PENDING_KEY) or []
    mark = read_mark(lake)
    figures = {} if mark is None else mark.figures(context["run_id"])  # this run's transform left them
    tables = emit_table_events(
        context["outlet_events"], config, lake, batches, result, committed_before, pending, backlogs, figures,
        zones,
    )  # fmt: skip
    result["assets"] = [table.uri for table in tables]
    emit_state_rows(config.name, {table.namespace: table.rows for table in tables if table.zone == "state"})
    if transform_succeeded(ti):
        emit_success(config.name, run_end.timestamp(), config.dag.interval_seconds(run_end))
    return result


def run_task_states(ti, task_id: str) -> dict[str, str]:
    """The states of ``task_id``'s instances in ``ti``'s run, by their names."""
    states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[task_id], run_ids=[ti.run_id])
    return states.get(ti.run_id, {})


def transform_succeeded(ti) -> bool:
    """Whether this run's transform succeeded (it does when no collection had work, without Spark)."""
    return run_task_states(ti, task_ids.TRANSFORM).get(task_ids.TRANSFORM) == "success"


def verified_collections(verifications: list[dict]) -> dict[str, dict]:
    """What the run's verifications (``verify_replica_set``'s results) found, per collection: when,
    and its drift (missing, extra, different); logged one line each."""
    found: dict[str, dict] = {}
    for verification in verifications:
        for namespace, counts in verification["collections"].items():
            entry = found.setdefault(namespace, {"verified_at": verification["verified_at"], "missing": 0,
                                                 "extra": 0, "different": 0})  # fmt: skip
            for kind in ("missing", "extra", "different"):
                entry[kind] += counts[kind]
    for namespace, entry in sorted(found.items()):
        log.info("verified %s at %s: %d missing, %d extra, %d different", namespace, entry["verified_at"],
                 entry["missing"], entry["extra"], entry["different"])  # fmt: skip
    return found


def report_not_captured(skipped: dict[str, str]) -> dict[str, str]:
    """Log each collection the filters match that the source does not capture, with why (discover
    found them); the same, for the run's result."""
    for namespace, reason in sorted(skipped.items()):
        log.warning("not captured: %s: %s", namespace, reason)
    return skipped


def report_backlogs(backlogs: dict[str, Backlog]) -> dict[str, int]:
    """Log each collection behind the committed batches (or one line saying none is); each
    collection's count."""
    behind = {namespace: backlog.batches for namespace, backlog in backlogs.items()}
    for namespace, backlog in backlogs.items():
        if backlog.batches:
            log.warning(
                "%s is %d committed batches behind (state %d, changes %d): the transform has not applied "
                "them (if it failed, its log says why); the first run whose transform succeeds catches up",
                namespace, backlog.batches, backlog.of_table("state"), backlog.of_table("changes"),
            )  # fmt: skip
    if not any(behind.values()):
        log.info("the tables of all %d collections have applied every committed batch", len(behind))
    return behind


def stuck_collections(config: SourceConfig) -> None:
    """Fails the run when the transform failed (or never ran), naming each collection it left behind
    the committed batches and by how many. A failed summary would drop the run's asset events, which
    report these counts too, so the failure is this task's."""
    lake = source_lake(config)
    behind = collections_behind(source_backlogs(lake, lake.batches()))
    if behind:
        raise AirflowFailException(
            f"the transform failed for {behind_text(behind)}; the other collections landed. Each one's "
            "error and traceback are in the transform task's log (search for 'FAILED'): fix its cause "
            "and the next run catches it up"
        )
    raise AirflowFailException(
        "the transform did not succeed (see its log, or plan_transform's if it never ran); no collection "
        "is behind the committed batches"
    )


def verification_failed() -> None:
    """Fails the run when a shard's ``verify`` failed: that task's log says why; the drift it found
    was healed by this run's transform unless ``verify.on.drift`` is ``report``. Runs too when a
    task before a verify failed (Airflow's one_failed counts upstream failures), and passes then:
    the summary already fails such a run, naming the shard."""
    ti = get_current_context()["ti"]
    failed = sorted(
        name for name, state in run_task_states(ti, task_ids.SHARD_VERIFY).items() if state == "failed"
    )
    if not failed:
        log.info("no verify task failed: a task before one did, and the summary reports it")
        return
    raise AirflowFailException(
        f"{', '.join(failed)} failed (see its log): drift found under verify.on.drift: fail, or a "
        "collection that could not be verified"
    )


def summarize(pulls: list[dict], run_end: pendulum.DateTime) -> dict:
    """Events per collection and op across shards (a view's: the changes its read found), the lag of
    the newest event at run end, and faults.

    The newest event is the newest change a pull read, or the position of a snapshot the run took
    (its rows are the source as of then). The lag is in seconds (``lag_seconds``) and as text
    (``lag``: ``3 h 12 min``). The faults are the disconnects and primary elections the pulls rode
    out (Debezium's ``NumberOfDisconnects`` / ``NumberOfPrimaryElections``); ``oplog`` has each
    replica set's oplog window and headroom.
    """
    events: dict[str, dict[str, int]] = {}
    newest = None
    faults = {"disconnects": 0, "primary_elections": 0}
    for pull_result in pulls:
        for counter in faults:
            faults[counter] += pull_result.get(counter, 0)
        snapshot = pull_result.get("snapshot") or {}
        copied = {namespace: {"r": count} for namespace, count in (snapshot.get("documents") or {}).items()}
        views = (pull_result.get("views") or {}).get("changes") or {}
        # the streamed events, the snapshot's reads, and the changes the views' reads found
        for found in (pull_result.get("events", {}), copied, views):
            for namespace, ops in found.items():
                for op, count in ops.items():
                    events.setdefault(namespace, {}).setdefault(op, 0)
                    events[namespace][op] += count
        for ts_ms in (pull_result.get("newest_source_ts_ms"), snapshot.get("newest_source_ts_ms")):
            if ts_ms is not None and (newest is None or ts_ms > newest):
                newest = ts_ms
    lag_s = None if newest is None else round(run_end.timestamp() - newest / 1000, 3)
    lag = None if lag_s is None else duration(max(lag_s, 0))
    for namespace in sorted(events):
        log.info("%s: %s", namespace, ", ".join(f"{op}={n}" for op, n in sorted(events[namespace].items())))
    log.info("lag from the newest event to run end: %s", lag or "none (no event or snapshot in this run)")
    log.info("disconnects: %d, primary elections: %d", faults["disconnects"], faults["primary_elections"])
    return {
        "events": events, "lag_seconds": lag_s, "lag": lag, **faults, "oplog": oplog_windows(pulls),
        "time_series": time_series_freshness(pulls),
    }  # fmt: skip


def time_series_freshness(pulls: list[dict]) -> dict[str, dict]:
    """How fresh each time-series collection's tables are (``capture.time_series.freshness``): they
    are read in batches, not streamed, so the lag above does not tell."""
    found = {ns: figures for pull in pulls for ns, figures in (pull.get("time_series") or {}).items()}
    for namespace, figures in sorted(found.items()):
        log.info(
            "%s (time-series, read in batches): measurements timed up to %s; written later than %d s after "
            "their time, updated or deleted ones land at a reconcile (every %d h; this run: %s)",
            namespace, figures["landed_up_to"], figures["lateness_seconds"],
            figures["reconcile_interval_hours"], "reconciled" if figures["reconciled"] else "not reconciled",
        )  # fmt: skip
    return found


def oplog_windows(pulls: list[dict]) -> dict[str, dict]:
    """Each replica set's oplog window and headroom as its pull measured them when it ended, against
    the position it committed (see ``oplog_window``)."""
    windows = {pull["rs"]: pull["oplog"] for pull in pulls if pull.get("oplog")}
    for rs, window in sorted(windows.items()):
        log.info(
            "replica set %s: oplog window %s (%s of %s), committed position %s old after the pull, "
            "headroom %s",
            rs, window["window"], window["used"], window["max"], window["position_age"], window["headroom"],
        )  # fmt: skip
    return windows
