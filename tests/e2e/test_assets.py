"""Every collection's state and changes tables are Airflow Assets. A run's summary
emits their events with the documented extras, and a DAG scheduled on a state Asset (the example in
docs/reading.md) is queued by it. The same runs send their figures to the team's monitoring through
Airflow's own StatsD client: a real UDP listener on loopback receives them with the source and
replica set in their names, each value equal to the run's summary (docs/monitoring.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.sdk import Asset
from cdc_support import asset_events, documented_downstream_dag
from sqlalchemy import select
from statsd_support import StatsdListener, airflow_statsd

from mongo_cdc.lake import table_uri
from mongo_cdc.lake.storage import LakeLocation, table_if_exists
from mongo_cdc_airflow.assets import OPLOG_FIGURES, TABLE_ZONES, table_asset_uri
from mongo_cdc_airflow.metrics import stat_part


def test_asset_uris_are_the_table_locations_in_airflows_normal_form():
    cases = {
        ("/lake/my lake", "db.orders#1"): "file:///lake/my%20lake/state/acc/db/orders!231",
        ("s3://bucket/lake", "db.a?b"): "s3://bucket/lake/state/acc/db/a!3Fb",
        ("s3://bucket/lake", "db.café"): "s3://bucket/lake/state/acc/db/caf!C3!A9",
        ("s3://bucket", "db.orders"): "s3://bucket/state/acc/db/orders",
    }
    for (root, namespace), expected in cases.items():
        uri = table_asset_uri(LakeLocation(root), "state", "acc", namespace)
        assert uri == expected
        # what Airflow makes of the URI a downstream DAG writes: the same asset (name and URI)
        asset = Asset(uri)
        assert (asset.name, asset.uri) == (uri, uri)


def register_downstream_dag(directory: Path, uri: str) -> str:
    """Parse the documented downstream DAG with Airflow's DagBag, write it to the metadata DB the way the
    DAG processor does, and unpause it (paused DAGs are not queued); its dag_id."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    directory.mkdir()
    (directory / "orders_report.py").write_text(documented_downstream_dag(uri))
    bag = DagBag(dag_folder=str(directory))
    assert not bag.import_errors, bag.import_errors
    [dag_id] = bag.dag_ids
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    with create_session() as session:
        session.get(DagModel, dag_id).is_paused = False
    return dag_id


def queued_dags(uri: str) -> set[str]:
    """The DAGs the scheduler will start for events of the asset ``uri`` (AssetDagRunQueue)."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        return set(
            session.scalars(
                select(AssetDagRunQueue.target_dag_id)
                .join(AssetModel, AssetModel.id == AssetDagRunQueue.asset_id)
                .where(AssetModel.uri == uri)
            )
        )


def assert_metrics_match_summary(statsd: StatsdListener, run, source, rs: str) -> dict[str, list]:
    """The figures every run sends equal its summary's (lag within 10 ms: computed apart); what the
    listener received (since the caller last cleared it)."""
    received = statsd.drain()
    summary = run.get_task_instance("summary").xcom_pull(task_ids="summary")
    per_rs = f"airflow.mongo_cdc.%s.{source.name}.{rs}"
    for metric, figure in (("oplog_window", "window_seconds"), ("position_age", "position_age_seconds")):
        assert statsd.last(per_rs % f"{metric}_seconds") == summary["oplog"][rs][figure]
    assert abs(statsd.last(per_rs % "lag_seconds") - summary["lag_seconds"]) < 0.01
    for namespace, ops in summary["events"].items():
        for op, count in ops.items():
            # the summary counts a snapshot's reads as op r; the metrics as snapshot_documents
            metric = f"snapshot_documents.{source.name}.{rs}" if op == "r" else f"events.{source.name}.{rs}"
            name = f"airflow.mongo_cdc.{metric}.{stat_part(namespace)}" + ("" if op == "r" else f".{op}")
            assert statsd.total(name) == count, name
    assert received[f"airflow.mongo_cdc.transform.{source.name}"][-1][1] == "ms"
    assert received[per_rs % "pull"][-1][1] == "ms"
    assert per_rs % "disconnects" not in received  # none happened: no counter
    # every shard synced and the transform succeeded: the stalled-source alert's figures
    assert statsd.last(f"airflow.mongo_cdc.schedule_interval_seconds.{source.name}") == 3600  # hourly
    succeeded_at = statsd.last(f"airflow.mongo_cdc.last_success_timestamp_seconds.{source.name}")
    assert run.start_date.timestamp() <= succeeded_at <= run.end_date.timestamp()
    return received


@pytest.fixture
def statsd(monkeypatch) -> Iterator[StatsdListener]:
    with airflow_statsd(monkeypatch) as listener:
        yield listener


def test_a_run_emits_each_touched_tables_event_and_its_metrics_and_queues_the_dag_scheduled_on_it(
    cdc_source, replica_set, db_name, tmp_path, statsd
):
    source = cdc_source(db_name)
    counts = {"customers": 10, "orders": 4}
    with replica_set.client() as client:
        for collection, n in counts.items():
            client[db_name][collection].insert_many([{"_id": i, "n": i} for i in range(n)])

    def uris(collection: str) -> dict[str, str]:
        namespace = f"{db_name}.{collection}"
        location, prefix = source.location, source.prefix
        return {zone: table_asset_uri(location, zone, prefix, namespace) for zone in TABLE_ZONES}

    def check(extra: dict, zone: str, collection: str, rows: int, new_events: int, run) -> None:
        delta = table_if_exists(table_uri(source.location, zone, source.prefix, db_name, collection))
        last = source.lake.last_batch(replica_set.name)
        oplog = run.get_task_instance("summary").xcom_pull(task_ids="summary")["oplog"][replica_set.name]
        assert extra == {
            "collection": f"{db_name}.{collection}",
            "table": table_uri(source.location, zone, source.prefix, db_name, collection),
            "rows": rows,
            "new_events": new_events,
            "table_version": delta.version(),
            "committed": {replica_set.name: {"batch_seq": last.seq, "cluster_time": last.cluster_time}},
            "batches_behind": 0,
            "oplog": {replica_set.name: {figure: oplog[figure] for figure in OPLOG_FIGURES}},
        }
        assert extra["oplog"][replica_set.name]["window_seconds"] >= 0

    downstream = register_downstream_dag(tmp_path / "downstream", uris("customers")["state"])
    run = source.run()
    events = asset_events(source.dag_id, run.run_id)
    assert set(events) == {uri for collection in counts for uri in uris(collection).values()}
    for collection, n in counts.items():
        # the snapshot: every document is one event, one state row and one change row
        assert len(source.change_rows(collection)) == n
        for zone, uri in uris(collection).items():
            check(events[uri], zone, collection, n, n, run)
    assert downstream in queued_dags(uris("customers")["state"])
    assert downstream not in queued_dags(uris("orders")["state"])
    received = assert_metrics_match_summary(statsd, run, source, replica_set.name)
    per_rs = f"airflow.mongo_cdc.%s.{source.name}.{replica_set.name}"
    assert received[per_rs % "snapshot"][-1][1] == "ms" and statsd.last(per_rs % "last_batch_seq") >= 1
    assert sum(value for value, _ in received[per_rs % "snapshot_chunks"]) >= len(counts)
    for collection, n in counts.items():
        namespace = stat_part(f"{db_name}.{collection}")
        assert statsd.total(f"{per_rs % 'snapshot_documents'}.{namespace}") == n
        assert statsd.last(f"airflow.mongo_cdc.state_rows.{source.name}.{namespace}") == n
    statsd.received.clear()

    # the next run touches customers only: only its tables get events
    with replica_set.client() as client:
        client[db_name].customers.insert_many([{"_id": i} for i in range(10, 13)])
        client[db_name].customers.delete_one({"_id": 0})
    before = {uri: extra["table_version"] for uri, extra in events.items()}
    run = source.run()
    events = asset_events(source.dag_id, run.run_id)
    assert set(events) == set(uris("customers").values())
    check(events[uris("customers")["state"]], "state", "customers", 12, 4, run)
    check(events[uris("customers")["changes"]], "changes", "customers", 14, 4, run)
    assert all(events[uri]["table_version"] > before[uri] for uri in events)
    received = assert_metrics_match_summary(statsd, run, source, replica_set.name)
    state_rows = f"airflow.mongo_cdc.state_rows.{source.name}.%s"
    assert statsd.last(state_rows % stat_part(f"{db_name}.customers")) == 12
    assert state_rows % stat_part(f"{db_name}.orders") not in received  # untouched: no event
