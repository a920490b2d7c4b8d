"""The DAG's transform on a real Spark standalone cluster whose executors' Python lacks mongo_cdc.

The cluster (``mongo_cdc_dev.spark_cluster``): a master and one worker, each its own JVM started with
the pinned pyspark's ``spark-class``, on loopback ports, the worker with 2 cores and 1 GiB for
executors.

The executors' Python is a venv the test creates without pip and without the shared venv's
site-packages; its site-packages holds symlinks to the third-party packages the job needs
(``EXECUTOR_PACKAGES``) and nothing else, so no editable-install finder or ``.pth`` file can bring in
``mongo_cdc``. Spark also puts the worker JVM's own ``PYTHONPATH`` on its Python workers' path, so the
master and worker start without one (the tests run with ``PYTHONPATH=<repo>/include``). A probe job on
the cluster, with that Python and nothing shipped, shows an executor cannot import ``mongo_cdc`` but
can import the rest; the DAG run then only succeeds if the transform task ships the package itself.

The driver runs in client mode in this process's Python (which has the package), as in a deployment
where the Airflow worker submits the job. The lake is a local directory, which the executors on this
machine share; or (the ``s3`` case) on moto's S3, whose credentials reach the executors only inside
the Spark tasks the driver sends them, never in their environment, a command line or a log.

A state table too large to write again whole is MERGEd by the executors (issue 51): the driver's
Spark event log shows the MERGE's job and its tasks, the table's history holds no delta-rs MERGE, and
the executors, which have no deltalake, wrote the files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from cdc_support import assert_state_equals_collection
from datagen import COLLECTIONS, FALLBACK_FIELDS, load
from deltalake import DeltaTable
from s3_support import SECRET_LAKE_CONN_ID

from mongo_cdc.lake import table_uri
from mongo_cdc.lake.storage import file_actions
from mongo_cdc.transform.state_merge import REWRITE_MAX_ROWS
from mongo_cdc.transform.stored_rows import keyed_files
from mongo_cdc_dev.spark_cluster import SPARK_CLASS, StandaloneCluster
from mongo_cdc_dev.spark_event_log import event_log_conf, spark_jobs

SPARK_SUBMIT = os.path.join(os.path.dirname(sys.executable), "spark-submit")
EXECUTOR_PACKAGES = ("pyarrow", "orjson", "bson")
WORKER_CORES, WORKER_MEMORY, EXECUTOR_MEMORY = 2, "1g", "512m"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(SPARK_CLASS), reason="pyspark's spark-class not installed"),
]


# One cluster, executor Python and probe for the module: both lakes' runs share them.
@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    directory = tmp_path_factory.mktemp("cluster") / "spark"
    with StandaloneCluster(directory, workers=1, cores=WORKER_CORES, memory=WORKER_MEMORY) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with only EXECUTOR_PACKAGES (symlinked from this venv) besides the standard library."""
    venv = tmp_path_factory.mktemp("executor") / "executor-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site_packages = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    for package in EXECUTOR_PACKAGES:
        os.symlink(os.path.join(ours, package), os.path.join(site_packages, package))
    return python


def cluster_conf(executor_python: str) -> dict[str, str]:
    """What the Spark connection's ``conf`` extra sets: the executors' Python, their memory, the
    driver's address (executors connect back to it)."""
    return {
        "spark.pyspark.python": executor_python,
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
    }


PROBE = textwrap.dedent(
    """
    import importlib.util, json, sys
    from pyspark.sql import SparkSession

    modules = ("mongo_cdc", "deltalake", *sys.argv[1].split(","))

    def probe(_):
        return {"python": sys.executable, **{m: importlib.util.find_spec(m) is not None for m in modules}}

    spark = SparkSession.builder.getOrCreate()
    print("PROBE " + json.dumps(spark.sparkContext.parallelize([0], 1).map(probe).collect()[0]))
    spark.stop()
    """
)


@pytest.fixture(scope="module")
def probe(
    spark_cluster: StandaloneCluster, executor_python: str, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """What a Python worker on the cluster's executor can import when nothing is shipped, and the
    probe's application directory on the worker (``app``)."""
    found = probe_executor(spark_cluster, cluster_conf(executor_python), tmp_path_factory.mktemp("probe"))
    (app,) = spark_cluster.work_dir().glob("app-*")
    return {**found, "app": app}


def probe_executor(cluster: StandaloneCluster, conf: dict[str, str], directory: Path) -> dict:
    script = directory / "probe.py"
    script.write_text(PROBE)
    conf_args = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    done = subprocess.run(
        [SPARK_SUBMIT, "--master", cluster.url, *conf_args, str(script), ",".join(EXECUTOR_PACKAGES)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("PROBE "))


@pytest.mark.parametrize("lake", ["local", "s3"])
def test_transform_runs_on_a_standalone_cluster_whose_executors_lack_mongo_cdc(
    spark_cluster,
    executor_python,
    probe,
    cdc_source,
    replica_set,
    db_name,
    tmp_path,
    monkeypatch,
    request,
    lake,
):
    conf = cluster_conf(executor_python)
    assert probe == {
        "python": executor_python,
        "mongo_cdc": False,
        "deltalake": False,
        **dict.fromkeys(EXECUTOR_PACKAGES, True),
        "app": probe["app"],
    }
    apps_before = set(spark_cluster.work_dir().glob("app-*"))

    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        json.dumps({"conn_type": "spark", "host": spark_cluster.url, "extra": {"conf": conf}}),
    )
    if lake == "s3":  # the executors' only way to the lake's credentials: the tasks Spark sends them
        location = request.getfixturevalue("s3_lake_with_a_unique_secret")
        source = cdc_source(
            db_name,
            storage_options=dict(location.storage_options),
            **{"lake.root": location.root, "lake.connection.id": SECRET_LAKE_CONN_ID},
        )
    else:
        source = cdc_source(db_name)
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 40, "orders": 60, "products": 20})
        source.run()  # snapshot, pull, then the transform on the cluster
        for collection in COLLECTIONS:
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])

    # the transform's executor ran on this cluster and fetched the package the task shipped; the
    # probe's executor, with nothing shipped, did not get it
    (transform_app,) = set(spark_cluster.work_dir().glob("app-*")) - apps_before
    assert not list(probe["app"].glob("*/mongo_cdc-*.zip"))
    assert list(transform_app.glob("*/mongo_cdc-*.zip")), sorted(transform_app.rglob("*"))
    if lake == "s3":  # nor is the secret in the master's, the worker's or the executors' logs
        secret = location.storage_options["AWS_SECRET_ACCESS_KEY"]
        logs = [
            *spark_cluster.directory.glob("*.log"),
            *(p for p in spark_cluster.work_dir().rglob("*") if p.is_file()),
        ]
        assert logs and not [log for log in logs if secret.encode() in log.read_bytes()]
        assert not (tmp_path / "lake").exists()


def test_a_state_merge_of_several_files_runs_on_the_executors(
    spark_cluster, executor_python, probe, cdc_source, replica_set, db_name, monkeypatch, tmp_path
):
    assert probe["deltalake"] is False  # the executors could not run a delta-rs MERGE
    # the driver's event log: each Spark job it ran, with its description and its tasks
    events = tmp_path / "spark-events"
    events.mkdir()
    conf = {**cluster_conf(executor_python), **event_log_conf(events)}
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT",
        json.dumps({"conn_type": "spark", "host": spark_cluster.url, "extra": {"conf": conf}}),
    )
    source = cdc_source(db_name)
    with replica_set.client() as client:
        items = client[db_name].items
        # zero-padded string _ids sort as inserted: the snapshot's files and the next run's new
        # documents hold key ranges of their own (above REWRITE_MAX_ROWS: the state is MERGEd)
        items.insert_many([{"_id": f"a{n:05}", "n": n} for n in range(REWRITE_MAX_ROWS + 500)])
        source.run()
        items.insert_many([{"_id": f"b{n:03}", "n": n} for n in range(50)])
        source.run()
        state = DeltaTable(table_uri(source.location, "state", source.prefix, db_name, "items"))
        files = keyed_files(file_actions(state), "")
        changed = ('["s","a00007"]', '["s","b003"]')
        holding = {file.path for file in files if any(file.min_key <= key <= file.max_key for key in changed)}
        assert len(files) >= 2 and len(holding) == 2, (files, state.history())  # a..., b...: two at least

        items.update_many({"_id": {"$in": ["a00007", "b003"]}}, {"$set": {"n": -1}})
        logs_before = set(events.iterdir())
        source.run()
        assert_state_equals_collection(source, client, "items")

    state.update_incremental()
    kept = {file.path for file in keyed_files(file_actions(state), "")}
    assert {file.path for file in files} - kept == holding  # only those files were written again
    assert "MERGE" not in {entry.get("operation") for entry in state.history()}  # no delta-rs MERGE
    (driver_log,) = set(events.iterdir()) - logs_before  # the last run's driver
    merges = [
        job.tasks
        for job in spark_jobs(driver_log.read_text().splitlines())
        if re.fullmatch(rf"{db_name}\.items: state MERGE of \d+ key ranges", job.description)
    ]
    assert len(merges) == 1 and merges[0] >= 2, merges  # one Spark job of a task per key range
