"""One broken source YAML takes only its own source down, and says everything wrong with it."""

from __future__ import annotations

import os

from datagen import load

from mongo_cdc_airflow.local_env import REPO_ROOT


def test_a_broken_source_is_an_import_error_listing_its_problems_while_the_good_one_runs(
    cdc_source, replica_set, db_name
):
    from airflow.dag_processing.dagbag import DagBag

    good = cdc_source(db_name)
    sources = os.environ["MONGO_CDC_SOURCES_DIR"]
    assert os.path.realpath(sources) != os.path.realpath(os.path.join(REPO_ROOT, "include", "sources"))
    broken = os.path.join(sources, "broken.yaml")
    with open(broken, "w") as handle:
        handle.write("topic.prefix: other\ntombstones.on.delete: yes\nmax.batch.size: 0\nmax.batch.size: 5\n")

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    ((path, error),) = bag.import_errors.items()  # Airflow keeps import errors per DAG file
    assert os.path.basename(path) == "mongo_cdc_source_config.py"
    assert "invalid mongo-cdc source configuration" in error
    assert f"{broken}: key 'tombstones.on.delete' must be true or false, got 'yes'" in error
    assert f"{broken}: key 'max.batch.size' appears twice (lines 3 and 4)" in error
    assert {good.dag_id, f"mongo_cdc_topology__{good.name}"} <= set(bag.dag_ids)
    assert "mongo_cdc__broken" not in bag.dag_ids

    with replica_set.client() as client:
        load(client[db_name], {"customers": 10})
    run = bag.get_dag(good.dag_id).test(mark_success_pattern="^transform$")
    assert run.state == "success"
    assert len(good.raw_rows("customers")) == 10

    os.remove(broken)
    assert not DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).import_errors
