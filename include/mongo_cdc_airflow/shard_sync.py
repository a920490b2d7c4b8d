"""One shard's work in a CDC run: the bodies of the mapped ``snapshot_start``, ``shard_sync.pull``
and ``shard_sync.snapshot`` (which reads the captured views too).

``ShardSync`` carries out the ``shard_lifecycle.ShardPlan`` the core decides; the MongoDB clients
come from ``MongoCdcHook``, the offset from its Variable. A snapshot's chunks are copied by the
``snapshot_copy`` tasks (``chunk_copy``) while the shard's pull streams.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Callable
from typing import NoReturn

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure

from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.shard_lifecycle import ShardPlan, plan_shard
from mongo_cdc.capture.stream_move import StreamMoveError, StreamMoveRequest, move_stream
from mongo_cdc.capture.topology import Shard
from mongo_cdc.config import SourceConfig
from mongo_cdc_airflow import task_ids
from mongo_cdc_airflow.failures import deterministic_failures, fail_at_once
from mongo_cdc_airflow.hash_key import with_hash_key
from mongo_cdc_airflow.hooks import MongoCdcHook
from mongo_cdc_airflow.params import (
    resnapshot_filters,
    resnapshot_request,
    stream_move_request,
    verify_requested,
)
from mongo_cdc_airflow.variables import offset_keeper

log = logging.getLogger(__name__)


def is_backfill() -> bool:
    """A backfill run (``airflow backfill create``, the UI's Backfill) only completes its past interval."""
    return get_current_context()["dag_run"].run_type == "backfill"


def schedule_interval_s() -> float:
    """The run's data interval: how long the committed position waits between scheduled pulls."""
    context = get_current_context()
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None or end <= start:
        from mongo_cdc.capture.streaming import DEFAULT_INTERVAL_S

        return DEFAULT_INTERVAL_S
    return (end - start).total_seconds()


def on_interval_hour(every: int, interval_start: dt.datetime | None) -> bool:
    """Whether a run whose data interval starts at ``interval_start`` is one of every ``every`` hours:
    its start is a multiple of ``every`` UTC hours since the epoch (daily at midnight for 24). Manual
    runs (no interval) and ``every`` 0 never are."""
    return bool(every) and interval_start is not None and int(interval_start.timestamp() // 3600) % every == 0


def unreachable(shard: Shard, exc: ConnectionFailure) -> RuntimeError:
    hosts = ", ".join(shard.hosts) or "the source connection's hosts"
    return RuntimeError(f"shard {shard.id}: cannot reach replica set {shard.rs} ({hosts}): {exc}")


def sole_writer(config: SourceConfig) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Wrap a per-shard task so it is its offset's only writer while it runs (offsets.WriterConflict).

    A backfill run never writes an offset, so it claims none and never waits for the live sync.
    An offset or config error fails the task at once (``failures.deterministic_failures``).
    """

    def decorate(work: Callable[..., dict]) -> Callable[..., dict]:
        @functools.wraps(work)
        def claimed(shard_entry: dict, *args: object) -> dict:
            # lets the UI label each mapped task by its shard id (map_index_template)
            get_current_context()["shard_id"] = shard_entry["id"]
            with deterministic_failures():  # an offset to fix by hand does not mend with retries
                return claim_and_work(shard_entry, *args)

        def claim_and_work(shard_entry: dict, *args: object) -> dict:
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

            keeper = offset_keeper(config, shard_entry["rs"])
            keeper.claim(me, still_running)
            try:
                return work(shard_entry, *args)
            finally:
                keeper.release(me)

        return claimed

    return decorate


class ShardSync:
    """Snapshot, pull or backfill one shard of one source."""

    def __init__(self, config: SourceConfig, shard_entry: dict) -> None:
        self.config = with_hash_key(config)
        self.shard = Shard.from_dict(shard_entry)
        self.keeper = offset_keeper(config, self.shard.rs)
        self.hook = MongoCdcHook(mongo_conn_id=config.mongo_conn_id)

    def client(self) -> MongoClient:
        return self.hook.shard_client(self.shard)

    def plan(self) -> ShardPlan:
        from mongo_cdc.capture.oplog_recovery import recovery_pending
        from mongo_cdc.capture.snapshot import newly_captured
        from mongo_cdc.capture.streaming import resume_position_lost

        def position_lost(offset: Offset) -> bool:
            with self.client() as client:
                return resume_position_lost(client, offset.resume_token)

        def new_collections(offset: Offset) -> tuple[str, ...]:
            with self.client() as client:
                return newly_captured(client, self.config, offset)

        context = get_current_context()
        plan = plan_shard(
            shard_id=self.shard.id,
            retiring=self.shard.retiring,
            offset=self.keeper.load_checked(),  # healed from, or refused by, the lake first
            snapshot_mode=self.config.snapshot_mode,
            resnapshot=resnapshot_request(context["dag_run"].conf, context["params"], backfill=False),
            position_lost=position_lost,
            oplog_lost_recovery=self.config.oplog_lost_recovery,
            recovery_pending=lambda: recovery_pending(self.keeper.lake, self.shard.rs),
            newly_captured=new_collections,
        )
        log.info("shard %s (replica set %s): %s", self.shard.id, self.shard.rs, plan.reason)
        return plan

    def capture(self, client: MongoClient) -> ReplicaSetCapture:
        """This shard's replica set as the capture steps take it, through ``client``."""
        return ReplicaSetCapture(client, self.config, self.keeper)

    def start(self) -> dict:
        """What the plan says before the copy: record the snapshot's position and chunks (or find the
        unfinished one to resume), commit where streaming without a copy starts, or record the capture
        filter the stream goes on with. The result carries the plan, and the chunks still to copy, to
        the next tasks."""
        from mongo_cdc.capture.oplog_recovery import begin_recovery
        from mongo_cdc.capture.snapshot import record_capture_filter, skip_abandoned_snapshot, start_snapshot
        from mongo_cdc.capture.stream_start import start_without_snapshot

        if is_backfill():
            log.info("backfill run: no snapshot, the pull completes the interval's history")
            return {"plan": None, "snapshot": None}
        try:
            plan = self.plan()
            result: dict = {"plan": plan.to_dict(), "snapshot": None}
            move = stream_move_request(get_current_context()["params"])
            if move is not None and move.covers(self.shard.id):
                self.move(plan, move)
            if plan.recover:
                with self.client() as client:
                    begin_recovery(client, self.shard.rs, self.keeper)
            if plan.snapshot is None and not plan.start_without_copy:
                skip_abandoned_snapshot(self.keeper)
                record_capture_filter(self.keeper, self.config)
                return result
            with self.client() as client:
                if plan.start_without_copy:
                    start_without_snapshot(client, self.shard.rs, self.keeper, self.config)
                    return result
                filters = resnapshot_filters(get_current_context()["params"])
                if self.shard.via_source:
                    started = start_snapshot(self.capture(client), only=plan.snapshot, filters=filters)
                else:
                    with self.hook.source_client() as cluster:
                        started = start_snapshot(
                            self.capture(client), cluster, self.shard.id, plan.snapshot, filters
                        )
        except ConnectionFailure as exc:
            raise unreachable(self.shard, exc) from None
        copied = self.keeper.lake.copied_chunks(started.rs, started.seq)
        missing = [chunk for chunk in started.chunks if (chunk.namespace, chunk.index) not in copied]
        result["snapshot"] = {
            "seq": started.seq,
            "chunks": len(started.chunks),
            "missing": [[chunk.namespace, chunk.index, chunk.count] for chunk in missing],
        }
        return result

    def move(self, plan: ShardPlan, move: StreamMoveRequest) -> None:
        """Move this shard's stream as the trigger asks (``stream_move``), if it streams in this run."""
        if plan.snapshot is not None or plan.start_without_copy or plan.retire or not plan.stream:
            raise StreamMoveError(
                f'shard {self.shard.id}: param "stream_from" moves a stream, but this run does not just '
                f"stream it ({plan.reason}); trigger the move once it streams"
            )
        with self.client() as client:
            move_stream(client, self.shard.rs, self.keeper, move.to, move.skip_unread)

    def started(self) -> dict:
        """What this shard's ``snapshot_start`` returned: the plan, and the snapshot it began (if any)."""
        ti = get_current_context()["ti"]
        # inside the mapped group: this shard's own, not every map index's
        started = ti.xcom_pull(task_ids=task_ids.SNAPSHOT_START, map_indexes=ti.map_index)
        if started is None:
            raise AirflowFailException(
                f"shard {self.shard.id}: its snapshot_start task failed (see its log), so it is neither "
                "snapshotted nor streamed in this run; the next run starts again"
            )
        return started

    def pull(self) -> dict:
        """Stream until caught up (the plan permitting), then retire the offset of a shard that left.
        It runs while the shard's snapshot copies (``snapshot_copy``), before that snapshot commits."""
        from mongo_cdc.capture.streaming import pull_changes
        from mongo_cdc_airflow.lineage import report_landed

        if is_backfill():
            return self.backfill()
        plan = ShardPlan.from_dict(self.started()["plan"])
        result: dict = {"rs": self.shard.rs, "events": {}}
        if plan.stream:
            # connection failures are retried inside the pull (connect.* settings), which names the
            # hosts when it gives up
            with self.client() as client:
                result = pull_changes(self.capture(client), interval_s=schedule_interval_s()).to_dict()
            report_landed(self, self.shard.hosts, self.keeper.lake, result["events"])
        else:
            log.info("snapshot.mode is initial_only: no streaming")
        if plan.retire:
            retired_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            self.keeper.commit(self.keeper.load() or Offset(), retired_at=retired_at)
            log.info("shard %s left the cluster: its stream is drained and its offset retired", self.shard.id)
        return result

    def time_series(self, client: MongoClient, result: dict) -> None:
        """Land the replica set's time-series collections after the sync (``capture.time_series``),
        reconciling them in the scheduled runs of every ``time.series.reconcile.interval.hours`` and
        when the trigger param ``verify`` asks; their figures join the sync's (``result``)."""
        from mongo_cdc.capture.time_series import capture_time_series

        context = get_current_context()
        every = self.config.time_series_reconcile_interval_hours
        scheduled = context["dag_run"].run_type == "scheduled"
        due = verify_requested(context["params"]) or (
            scheduled and on_interval_hour(every, context.get("data_interval_start"))
        )
        found = capture_time_series(self.capture(client), reconcile_due=due)
        if found.batch_seq is not None:
            result["batch_seq"] = found.batch_seq
            result["time_series"] = found.collections
            for namespace, figures in found.collections.items():
                if figures["events"]:
                    result["events"][namespace] = figures["events"]

    def snapshot(self) -> dict:
        """Commit the snapshot ``snapshot_start`` began once every chunk is copied (after the pull,
        which went on beside the copy), then read the captured views (``read_views``) and a replica
        set's time-series collections (``time_series``). The result is the shard's sync in this run:
        the pull's, with the snapshot's figures under ``snapshot``, the views' reads under ``views``
        and the time-series figures under ``time_series``."""
        from mongo_cdc.capture.snapshot import SnapshotIncompleteError, commit_snapshot
        from mongo_cdc_airflow.lineage import report_landed

        ti = get_current_context()["ti"]
        pulled = ti.xcom_pull(task_ids=task_ids.SHARD_PULL, map_indexes=ti.map_index)
        figures: dict = {"documents": {}, "seconds": 0}
        last_batch: dict = {}
        started = {"snapshot": None} if is_backfill() else self.started()
        if started["snapshot"] is not None:
            plan = self.keeper.lake.snapshot_plan(self.shard.rs, started["snapshot"]["seq"])
            if plan is None:
                raise RuntimeError(
                    f"shard {self.shard.id}: snapshot {started['snapshot']['seq']} has no plan in the lake's "
                    "snapshot log: the lake was moved or edited since snapshot_start; run again"
                )
            try:
                copied = commit_snapshot(self.keeper, plan)
            except SnapshotIncompleteError as exc:  # retrying this task copies nothing: fail at once
                raise AirflowFailException(str(exc)) from None
            report_landed(self, self.shard.hosts, self.keeper.lake, copied.documents)
            # the snapshot's rows are the source as of its position: the run's lag counts from there
            figures.update(
                documents=copied.documents,
                seconds=round(copied.seconds, 3),
                chunks=len(plan.chunks),
                newest_source_ts_ms=(copied.cluster_time >> 32) * 1000,
            )
            # the replica set's last batch is now the snapshot's, numbered after the pull's
            last_batch["batch_seq"] = self.keeper.load_checked().batch_seq
        if pulled is None:  # the copy is committed all the same: the next run streams on after it
            raise AirflowFailException(f"shard {self.shard.id}: its pull failed (see its log)")
        views = None if is_backfill() else self.read_views()
        if views is not None and views["batch_seq"] is not None:
            last_batch["batch_seq"] = views["batch_seq"]
        synced = {**pulled, **last_batch, "snapshot": figures, "views": views}
        # after the snapshot's commit: a first run's time-series read needs the position it records.
        # A sharded cluster's time-series collections are not captured
        if self.shard.via_source and not is_backfill():
            try:
                with self.client() as client:
                    self.time_series(client, synced)
            except ConnectionFailure as exc:
                raise unreachable(self.shard, exc) from None
        return synced

    def read_views(self) -> dict | None:
        """Read the captured views (``mongo_cdc.verify.view_capture``) after the pull and the snapshot,
        in the runs ``view.read.interval.runs`` picks, and empty the states of views dropped since
        their last read; None when the run reads none. Discovery named them (a sharded cluster's views
        are not captured)."""
        from mongo_cdc.capture.collection_kinds import VIEW
        from mongo_cdc.verify.view_capture import capture_views, read_due

        context = get_current_context()
        kinds = context["ti"].xcom_pull(task_ids=task_ids.DISCOVER, key=task_ids.KINDS_KEY) or {}
        views = sorted(namespace for namespace, kind in kinds.items() if kind == VIEW)
        every = self.config.view_read_interval_runs
        if not read_due(every, context.get("data_interval_start"), context.get("data_interval_end")):
            if views:
                log.info(
                    "views not read in this run (view.read.interval.runs: %d): %s", every, ", ".join(views)
                )
            return None
        try:
            with self.client() as client:
                read = capture_views(self.capture(client), views)
        except ConnectionFailure as exc:
            raise unreachable(self.shard, exc) from None
        return read.to_dict() if views or read.changes or read.not_read else None

    def verify(self) -> dict:
        """Verify the shard's collections (``mongo_cdc.verify``) when the trigger asks for it or the
        run is a scheduled one of every ``verify.interval.hours``, and always while the shard recovers
        from a lost oplog (``oplog_recovery``: then it heals, whatever ``verify.on.drift`` says);
        skipped otherwise. Its repairs are a batch the transform of this run applies. Fails after
        healing when ``verify.on.drift`` is ``fail`` and drift was found (not in a recovery, which
        expects it), and when a collection could not be verified (the others are)."""
        from mongo_cdc.capture.oplog_recovery import recovery_pending
        from mongo_cdc.verify.comparison import ShardScope
        from mongo_cdc.verify.verification import FAIL, verify_replica_set

        context = get_current_context()

        def skip(reason: str) -> NoReturn:
            # an XCom even so: the summary reads every shard's, and a missing one is an error line
            context["ti"].xcom_push(key=task_ids.VERIFICATION_KEY, value=None)
            raise AirflowSkipException(reason)

        if is_backfill():
            skip("a backfill does not verify")
        every = self.config.verify_interval_hours
        # the schedule is the scheduled runs': a manual run verifies when its trigger asks
        scheduled = context["dag_run"].run_type == "scheduled"
        due = scheduled and on_interval_hour(every, context.get("data_interval_start"))
        recovery = recovery_pending(self.keeper.lake, self.shard.rs)
        if not verify_requested(context["params"]) and not due and not recovery:
            skip(
                f"not asked (trigger param verify) and not a scheduled run of every {every} h "
                "(verify.interval.hours)"
            )
        started = time.monotonic()
        try:
            with self.client() as client:
                if self.shard.via_source:
                    result = verify_replica_set(
                        self.capture(client), self.config.verify_on_drift, recovery=recovery
                    )
                else:  # the shard's part of the cluster: the ranges it owns
                    with self.hook.source_client() as cluster:
                        scope = ShardScope(cluster, self.shard.id)
                        result = verify_replica_set(
                            self.capture(client), self.config.verify_on_drift, scope, recovery=recovery
                        )
        except ConnectionFailure as exc:
            raise unreachable(self.shard, exc) from None
        found = {**result.to_dict(), "seconds": round(time.monotonic() - started, 3)}
        context["ti"].xcom_push(key=task_ids.VERIFICATION_KEY, value=found)
        if result.failed:
            raise RuntimeError(
                f"shard {self.shard.id}: verification failed for {', '.join(sorted(result.failed))} (see "
                "the log above); the other collections were verified"
            )
        if result.drift and self.config.verify_on_drift == FAIL and not recovery:
            fail_at_once(
                f"shard {self.shard.id}: {result.drift} documents drifted from MongoDB (verify.on.drift: "
                f"fail); they were healed by batch {result.repair_batch_seq}. The report is in "
                f"raw/{self.config.topic_prefix}/_verifications (verification_id {result.verification_id})"
            )
        return found

    def backfill(self) -> dict:
        from mongo_cdc.capture.backfill import backfill_interval

        context = get_current_context()
        start, end = context["data_interval_start"], context["data_interval_end"]
        with self.client() as client:
            offset = self.keeper.load()
            result = backfill_interval(self.capture(client), offset, start, end)
        return {"rs": self.shard.rs, "events": result.history_events, "backfill": result.to_dict()}
