"""The run's figures reach the team's monitoring through Airflow's own StatsD client: a real UDP
listener on loopback receives them with the source and replica set in their names, and each value
equals the run's summary (docs/monitoring.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from statsd_support import StatsdListener, airflow_statsd


@pytest.fixture
def statsd(monkeypatch) -> Iterator[StatsdListener]:
    with airflow_statsd(monkeypatch) as listener:
        yield listener


def test_a_snapshot_run_and_a_change_run_send_the_summarys_figures_to_statsd(
    cdc_source, replica_set, db_name, statsd
):
    source = cdc_source(db_name)
    rs = replica_set.name
    per_rs = f"{db_name}.{rs}"
    with replica_set.client() as client:
        items = client[db_name].items
        items.insert_many([{"_id": i, "v": 0} for i in range(40)])
        first = source.run(skip_spark=True)
        received = statsd.drain()
        summary = first.get_task_instance("summary").xcom_pull(task_ids="summary")
        assert statsd.total(f"airflow.mongo_cdc.snapshot_documents.{per_rs}.{db_name}__items") == 40
        assert statsd.total(f"airflow.mongo_cdc.snapshot_chunks.{per_rs}") >= 1
        assert received[f"airflow.mongo_cdc.snapshot.{per_rs}"][-1][1] == "ms"
        oplog = summary["oplog"][rs]
        for metric, figure in (("oplog_window", "window_seconds"), ("position_age", "position_age_seconds")):
            assert statsd.last(f"airflow.mongo_cdc.{metric}_seconds.{per_rs}") == oplog[figure]
        lag = statsd.last(f"airflow.mongo_cdc.lag_seconds.{per_rs}")
        assert abs(lag - summary["lag_seconds"]) < 0.01, (lag, summary["lag_seconds"])
        assert not any(name.startswith("airflow.mongo_cdc.transform") for name in received)  # not run
        statsd.received.clear()

        items.update_many({"_id": {"$lt": 5}}, {"$set": {"v": 1}})
        items.delete_one({"_id": 39})
        items.insert_one({"_id": 100, "v": 2})
        second = source.run()
        received = statsd.drain()
        summary = second.get_task_instance("summary").xcom_pull(task_ids="summary")
        ops = summary["events"][f"{db_name}.items"]
        assert ops == {"u": 5, "d": 1, "c": 1}
        for op, count in ops.items():
            assert statsd.total(f"airflow.mongo_cdc.events.{per_rs}.{db_name}__items.{op}") == count
        assert statsd.last(f"airflow.mongo_cdc.state_rows.{db_name}.{db_name}__items") == 40
        assert statsd.last(f"airflow.mongo_cdc.last_batch_seq.{per_rs}") >= 1
        assert received[f"airflow.mongo_cdc.transform.{db_name}"][-1][1] == "ms"
        assert received[f"airflow.mongo_cdc.pull.{per_rs}"][-1][1] == "ms"
        lag = statsd.last(f"airflow.mongo_cdc.lag_seconds.{per_rs}")
        assert abs(lag - summary["lag_seconds"]) < 0.01, (lag, summary["lag_seconds"])
        assert f"airflow.mongo_cdc.disconnects.{per_rs}" not in received  # none happened: no counter
