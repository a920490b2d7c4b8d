"""The run's figures as metrics, through Airflow's own metrics client.

The user's ``[metrics]`` settings decide where they go (StatsD, Datadog, OpenTelemetry, or nowhere):
mongo-cdc has nothing to configure. Every metric is named ``mongo_cdc.<metric>``; the source, the
replica set, the collection and the operation it concerns are tags where the backend has tags
(Datadog, OpenTelemetry, StatsD with ``statsd_influxdb_enabled``) and are appended to the name, in
that order, where plain StatsD has none: ``mongo_cdc.lag_seconds.inventory.rs0``. docs/monitoring.md
lists them and what to alert on.

Names and tag values are made of what every backend accepts: a dot inside a name (``shop.orders``)
becomes ``__`` so that it does not split StatsD's hierarchy, any other character outside
``[A-Za-z0-9_-]`` becomes ``_``, and a part longer than ``MAX_PART`` keeps its start and a hash of
the whole (StatsD names are limited to 250 characters).

``METRICS`` declares every metric: its type and what it is per, after the source. Only these are
sent (``SourceMetrics`` refuses any other name or tag set), so the monitoring page's table, the
statsd-exporter mapping and the alert rules under monitoring/ are checked against it by the tests.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk.configuration import conf
from airflow.sdk.observability.stats import Stats  # 3.2's task SDK has only the class; 3.3 keeps it

PREFIX = "mongo_cdc"


@dataclass(frozen=True)
class Metric:
    kind: str  # "gauge", "counter" or "timer"
    per: tuple[str, ...]  # its tags after ``source``, in the order plain StatsD appends them


_PER_RS = ("rs",)
_PER_COLLECTION = ("rs", "collection")
# Every metric mongo-cdc sends (docs/monitoring.md says what each is and when to alert).
METRICS = {
    "lag_seconds": Metric("gauge", _PER_RS),
    "position_age_seconds": Metric("gauge", _PER_RS),
    "oplog_window_seconds": Metric("gauge", _PER_RS),
    "oplog_headroom_seconds": Metric("gauge", _PER_RS),
    "last_batch_seq": Metric("gauge", _PER_RS),
    "events": Metric("counter", ("rs", "collection", "op")),
    "snapshot_documents": Metric("counter", _PER_COLLECTION),
    "snapshot_chunks": Metric("counter", _PER_RS),
    "disconnects": Metric("counter", _PER_RS),
    "primary_elections": Metric("counter", _PER_RS),
    "state_rows": Metric("gauge", ("collection",)),
    "drift_missing": Metric("gauge", _PER_COLLECTION),
    "drift_extra": Metric("gauge", _PER_COLLECTION),
    "drift_different": Metric("gauge", _PER_COLLECTION),
    "repaired_documents": Metric("counter", _PER_COLLECTION),
    "last_success_timestamp_seconds": Metric("gauge", ()),
    "schedule_interval_seconds": Metric("gauge", ()),
    "snapshot": Metric("timer", _PER_RS),
    "pull": Metric("timer", _PER_RS),
    "verify": Metric("timer", _PER_RS),
    "transform": Metric("timer", ()),
}
MAX_PART = 60
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")
# the [metrics] switches of the backends that carry tags (Airflow's own names for them)
TAGGED_BACKENDS = ("statsd_datadog_enabled", "statsd_influxdb_enabled", "otel_on")


def stat_part(name: str) -> str:
    """``name`` as one part of a metric name or a tag value (see the module's docstring)."""
    part = _NOT_ALLOWED.sub("_", name.replace(".", "__"))
    if len(part) <= MAX_PART:
        return part
    return f"{part[: MAX_PART - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


class SourceMetrics:
    """One source's metrics; ``tags`` of each call, in order, say which replica set, collection, op."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.tagged = any(conf.getboolean("metrics", switch, fallback=False) for switch in TAGGED_BACKENDS)

    def _named(self, metric: str, kind: str, tags: Mapping[str, str]) -> tuple[str, dict[str, str] | None]:
        declared = METRICS.get(metric)
        if declared != Metric(kind, tuple(tags)):
            raise ValueError(
                f"metric {metric!r} as a {kind} per {tuple(tags)} is not declared in METRICS "
                f"({declared}); declare it there and in docs/monitoring.md"
            )
        values = {"source": stat_part(self.source), **{key: stat_part(value) for key, value in tags.items()}}
        if self.tagged:
            return f"{PREFIX}.{metric}", values
        return ".".join((PREFIX, metric, *values.values())), None

    def gauge(self, metric: str, value: float, **tags: str) -> None:
        name, tag_values = self._named(metric, "gauge", tags)
        Stats.gauge(name, value, tags=tag_values)

    def count(self, metric: str, value: int, **tags: str) -> None:
        if value:
            name, tag_values = self._named(metric, "counter", tags)
            Stats.incr(name, value, tags=tag_values)

    def seconds(self, metric: str, seconds: float, **tags: str) -> None:
        """A timer, in milliseconds as StatsD timers are."""
        name, tag_values = self._named(metric, "timer", tags)
        Stats.timing(name, seconds * 1000, tags=tag_values)


def emit_run_metrics(source: str, pulls: Iterable[Mapping[str, Any]], run_end_ms: int) -> None:
    """Each replica set's figures from its pull result (``ShardSync.pull``).

    Per replica set: ``lag_seconds`` (its newest event or snapshot position to ``run_end_ms``),
    ``oplog_window_seconds``, ``oplog_headroom_seconds`` (absent when the oplog is unbounded),
    ``position_age_seconds``, ``last_batch_seq``; counters ``events`` (per collection and op, a
    view's read's changes among them), ``disconnects``, ``primary_elections``, ``snapshot_documents``
    (per collection), ``snapshot_chunks``; timers ``snapshot`` and ``pull``.
    """
    metrics = SourceMetrics(source)
    for pull in pulls:
        rs = pull["rs"]
        snapshot = pull.get("snapshot") or {}
        read_up_to = (pull.get("newest_source_ts_ms"), snapshot.get("newest_source_ts_ms"))
        newest = max((ts for ts in read_up_to if ts is not None), default=None)
        if newest is not None:
            metrics.gauge("lag_seconds", max(run_end_ms - newest, 0) / 1000, rs=rs)
        oplog = pull.get("oplog") or {}
        for metric, key in (
            ("oplog_window_seconds", "window_seconds"),
            ("oplog_headroom_seconds", "headroom_seconds"),
            ("position_age_seconds", "position_age_seconds"),
        ):
            if oplog.get(key) is not None:
                metrics.gauge(metric, oplog[key], rs=rs)
        if pull.get("batch_seq"):
            metrics.gauge("last_batch_seq", pull["batch_seq"], rs=rs)
        # the streamed events, and the changes the views' reads found (``ShardSync.read_views``)
        views = (pull.get("views") or {}).get("changes") or {}
        for found in (pull.get("events", {}), views):
            for namespace, ops in sorted(found.items()):
                for op, count in sorted(ops.items()):
                    metrics.count("events", count, rs=rs, collection=namespace, op=op)
        for counter in ("disconnects", "primary_elections"):
            metrics.count(counter, pull.get(counter, 0), rs=rs)
        for namespace, count in sorted((snapshot.get("documents") or {}).items()):
            metrics.count("snapshot_documents", count, rs=rs, collection=namespace)
        metrics.count("snapshot_chunks", snapshot.get("chunks") or 0, rs=rs)
        if snapshot.get("chunks"):  # a snapshot was committed in this run
            metrics.seconds("snapshot", snapshot["seconds"], rs=rs)
        if pull.get("seconds") is not None:  # the shard streamed
            metrics.seconds("pull", pull["seconds"], rs=rs)


def emit_state_rows(source: str, state_rows: Mapping[str, int]) -> None:
    """Each collection's live documents in its state table (``state_rows``: namespace to rows, from
    the summary's asset events)."""
    metrics = SourceMetrics(source)
    for namespace, rows in sorted(state_rows.items()):
        metrics.gauge("state_rows", rows, collection=namespace)


def emit_verification_metrics(source: str, verifications: Iterable[Mapping[str, Any]]) -> None:
    """Each replica set's verification (``ShardSync.verify``'s result): per collection the drift it
    found, gauges ``drift_missing``, ``drift_extra``, ``drift_different`` (0 when it matched), and
    the counter ``repaired_documents`` when a repair batch was landed; the timer ``verify``."""
    metrics = SourceMetrics(source)
    for verification in verifications:
        rs = verification["rs"]
        repaired = verification.get("repair_batch_seq") is not None
        for namespace, found in sorted(verification.get("collections", {}).items()):
            for kind in ("missing", "extra", "different"):
                metrics.gauge(f"drift_{kind}", found[kind], rs=rs, collection=namespace)
            if repaired:
                drifted = found["missing"] + found["extra"] + found["different"]
                metrics.count("repaired_documents", drifted, rs=rs, collection=namespace)
        if verification.get("seconds") is not None:
            metrics.seconds("verify", verification["seconds"], rs=rs)


def emit_success(source: str, run_end_s: float, interval_s: float) -> None:
    """A run whose every shard synced and whose transform succeeded: its end, in Unix seconds
    (``last_success_timestamp_seconds``), and the schedule's interval (``schedule_interval_seconds``),
    which the stalled-source alert compares (monitoring/prometheus-rules.yaml)."""
    metrics = SourceMetrics(source)
    metrics.gauge("last_success_timestamp_seconds", run_end_s)
    metrics.gauge("schedule_interval_seconds", interval_s)
