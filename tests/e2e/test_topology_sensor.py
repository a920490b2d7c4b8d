"""The topology sensor's log names the stored and live shard ids it compared."""

from __future__ import annotations

import json
import logging
import os

from mongo_cdc_airflow.variables import topology_variable


def test_the_sensor_logs_the_shard_ids_it_compares(cdc_source, replica_set, db_name, caplog):
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models import Variable
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    source = cdc_source(db_name)
    # a stored topology with a shard the cluster no longer has: the sensor sees a change at once
    gone = {"id": "shard_gone", "rs": "shard_gone", "hosts": ["h:1"], "via_source": False, "retiring": False}
    Variable.set(topology_variable(source.name), json.dumps([gone]))
    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    # the shard watch follows the CDC DAG's pause switch: the DAGs stored as the DAG processor
    # stores them, the CDC DAG unpaused
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    with create_session() as session:
        session.get(DagModel, source.dag_id).is_paused = False
    # the tests' Airflow logs warnings only (conftest); the sensor's lines are INFO
    caplog.set_level(logging.INFO, logger="mongo_cdc_airflow")
    run = bag.get_dag(f"mongo_cdc_topology__{source.name}").test()
    output = caplog.text
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["shards_changed"] == "success"
    assert (
        f"stored shards (Variable {topology_variable(source.name)}): shard_gone; live shards: rs0" in output
    )
    assert f"shard list changed (added: rs0; removed: shard_gone): triggering {source.dag_id}" in output
