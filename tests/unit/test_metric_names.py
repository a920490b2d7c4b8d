"""Metric names and tags (docs/monitoring.md): the source, replica set and collection are tags where
the backend has tags and parts of the name where plain StatsD has none, made of what every backend
accepts. Sent through Airflow's real StatsD client to a listener on loopback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from statsd_support import airflow_statsd

from mongo_cdc_airflow.metrics import (
    MAX_PART,
    METRICS,
    SourceMetrics,
    emit_run_metrics,
    emit_state_rows,
    emit_success,
    emit_verification_metrics,
    stat_part,
)


def test_names_carry_source_replica_set_and_collection_where_statsd_has_no_tags(monkeypatch):
    with airflow_statsd(monkeypatch) as listener:
        metrics = SourceMetrics("shop")
        metrics.gauge("lag_seconds", 12.5, rs="rs0")
        metrics.count("events", 3, rs="rs0", collection="shop.orders", op="u")
        metrics.count("disconnects", 0, rs="rs0")  # nothing happened: nothing sent
        metrics.seconds("pull", 1.5, rs="rs0")
        received = listener.drain()
    assert received == {
        "airflow.mongo_cdc.lag_seconds.shop.rs0": [(12.5, "g")],
        "airflow.mongo_cdc.events.shop.rs0.shop__orders.u": [(3.0, "c")],
        "airflow.mongo_cdc.pull.shop.rs0": [(1500.0, "ms")],
    }


def test_backends_with_tags_get_one_name_per_metric_and_the_names_as_tags(monkeypatch):
    with airflow_statsd(monkeypatch, statsd_influxdb_enabled="True") as listener:
        SourceMetrics("shop").count("events", 2, rs="rs0", collection="shop.logs/2024", op="c")
        received = listener.drain()
    assert received == {
        "airflow.mongo_cdc.events,source=shop,rs=rs0,collection=shop__logs_2024,op=c": [(2.0, "c")]
    }


def test_any_collection_name_becomes_a_valid_bounded_name_part():
    assert stat_part("shop.orders") == "shop__orders"
    assert stat_part("café ☕/%20#?") == "caf_____20__"
    long_a, long_b = stat_part("a" * 200), stat_part("a" * 199 + "b")
    assert len(long_a) == len(long_b) == MAX_PART and long_a != long_b


def test_parsing_the_dags_imports_no_metrics_or_lineage_code(tmp_path):
    """With metrics and lineage off nothing changes: building the DAGs (what every parse does) loads
    neither the metrics and lineage modules nor a StatsD client; only a running task does."""
    (tmp_path / "shop.yaml").write_text("topic.prefix: shop\n")
    probe = (
        "import sys\n"
        "from mongo_cdc.config import load_source\n"
        "from mongo_cdc_airflow.dag_factory import build_cdc_dag, build_topology_dag\n"
        f"config = load_source({str(tmp_path / 'shop.yaml')!r})\n"
        "build_cdc_dag(config), build_topology_dag(config)\n"
        "watched = ('mongo_cdc_airflow.metrics', 'mongo_cdc_airflow.lineage', 'statsd')\n"
        "print(sorted(m for m in sys.modules if m in watched))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_code_sends_every_declared_metric_with_its_declared_parts(monkeypatch):
    """What the summary and the transform send, each figure present, is exactly ``METRICS``
    (docs/monitoring.md's table is checked against it in test_monitoring_page.py), each name with
    the parts its declaration says."""
    pull = {
        "rs": "rs0",
        "newest_source_ts_ms": 1_000,
        "oplog": {"window_seconds": 7200, "headroom_seconds": 3600, "position_age_seconds": 5},
        "batch_seq": 7,
        "events": {"shop.orders": {"c": 2}},
        "disconnects": 1,
        "primary_elections": 1,
        "seconds": 1.0,
        "snapshot": {"documents": {"shop.orders": 3}, "chunks": 1, "seconds": 2.0},
    }
    verification = {
        "rs": "rs0",
        "repair_batch_seq": 8,
        "collections": {"shop.orders": {"missing": 1, "extra": 0, "different": 0}},
        "seconds": 0.5,
    }
    with airflow_statsd(monkeypatch) as listener:
        emit_run_metrics("shop", [pull], run_end_ms=2_000)
        emit_verification_metrics("shop", [verification])
        emit_state_rows("shop", {"shop.orders": 3})
        SourceMetrics("shop").seconds("transform", 3.0)
        emit_success("shop", 1_700_000_000.0, 3600.0)
        received = listener.drain()
    sent = {}
    for name in received:
        _, _, metric, *parts = name.split(".")
        sent[metric] = len(parts)
    assert sent == {metric: 1 + len(declared.per) for metric, declared in METRICS.items()}


def test_a_views_read_counts_its_changes_as_events(monkeypatch):
    """A view has no stream: the changes its read lands (``views``) are counted as its events."""
    pull = {
        "rs": "rs0",
        "events": {"shop.orders": {"u": 1}},
        "views": {"changes": {"shop.open": {"c": 2, "d": 1}}},
    }
    with airflow_statsd(monkeypatch) as listener:
        emit_run_metrics("shop", [pull], run_end_ms=2_000)
        received = listener.drain()
    events = {name.split(".", 3)[3]: sent for name, sent in received.items() if ".mongo_cdc.events." in name}
    assert events == {
        "shop.rs0.shop__orders.u": [(1.0, "c")],
        "shop.rs0.shop__open.c": [(2.0, "c")],
        "shop.rs0.shop__open.d": [(1.0, "c")],
    }


def test_an_undeclared_metric_or_tag_set_is_refused():
    metrics = SourceMetrics("shop")
    with pytest.raises(ValueError, match="metric 'lag' as a gauge per \\('rs',\\) is not declared"):
        metrics.gauge("lag", 1.0, rs="rs0")
    with pytest.raises(ValueError, match="not declared in METRICS"):
        metrics.gauge("lag_seconds", 1.0, collection="shop.orders")
