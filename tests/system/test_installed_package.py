"""The wheel as a new user installs it into the Airflow 3 they already run (issue 49, acceptance a).

The wheel is built from the checkout (sdist, then the wheel from it). For each supported Airflow
release, a fresh venv gets that Airflow and its MongoDB and Spark providers first, then the wheel:
Airflow's and the providers' versions must not move. Then, from a directory outside the checkout,
with no PYTHONPATH and an environment holding no setting of this session: a fresh AIRFLOW_HOME whose
DAGs folder holds only what ``mongo-cdc-dag-file`` wrote, settings in ``[mongo_cdc]``
(``AIRFLOW__MONGO_CDC__*``) and connections in ``AIRFLOW_CONN_*``. Airflow lists no import error,
lists the provider and its config section, and ``airflow dags test`` snapshots then streams one
source against the real mongod (the transform's Spark entry point found in the installed package):
the state table equals MongoDB.

Marked slow: each release is a venv (packages from uv's cache, or PyPI), a migrated SQLite
database and two DAG runs with spark-submit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cdc_support import CdcSource, assert_state_equals_collection

from mongo_cdc_airflow import local_env

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).with_name("uv")
# The supported Airflow releases (the oldest, the previous minor release's last, and the lock's), each
# installed with the packages of its release date, as its constraint file would pin them (those files
# are not on PyPI, which is all these tests reach): with today's, Airflow 3.2.2's task runs fail
# (FastAPI 0.165 breaks its execution API; 3.3 caps FastAPI below 0.137).
AIRFLOW_RELEASES = {"3.2.2": "2026-05-30T00:00:00Z", "3.3.2": "2026-09-18T00:00:00Z"}
PROVIDERS = ("apache-airflow-providers-mongo", "apache-airflow-providers-apache-spark")


def run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    started = time.monotonic()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    # where the test's minutes go (pytest shows it with -s or on a failure)
    print(f"{time.monotonic() - started:6.1f} s  {' '.join(command[:4])}")
    return done.stdout


def install(python: Path, *arguments: str) -> None:
    """``uv pip install`` from uv's cache alone when it holds every package (pyspark's only release
    is a source distribution, which an online install revalidates, downloads and builds again: 25
    s a release), else from PyPI."""
    command = [str(UV), "pip", "install", "--quiet", "--python", str(python), *arguments]
    if subprocess.run([*command, "--offline"], capture_output=True, timeout=900).returncode:
        run(command)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run([str(UV), "build", "--quiet", "--out-dir", str(out), str(ROOT)])
    (built,) = out.glob("mongo_cdc-*.whl")
    return built


def json_result(output: str) -> object:
    """A CLI command's JSON output: its last line (Airflow logs to stdout too, before it)."""
    return json.loads(output.strip().splitlines()[-1])


def airflow_versions(python: Path) -> dict[str, str]:
    frozen = run([str(UV), "pip", "freeze", "--python", str(python)])
    pins = dict(line.split("==", 1) for line in frozen.splitlines() if "==" in line)
    return {name: version for name, version in pins.items() if name.startswith("apache-airflow")}


def clean_environment(venv: Path, home: Path) -> dict[str, str]:
    """Only what a machine has (no PYTHONPATH, no Airflow or mongo-cdc setting of this session), the
    new venv's bin first on PATH (spark-submit finds its Spark there) and no folder of the checkout."""
    path = [part for part in os.environ["PATH"].split(os.pathsep) if not part.startswith(str(ROOT))]
    env = {key: os.environ[key] for key in ("HOME", "LANG", "JAVA_HOME", "TMPDIR") if key in os.environ}
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), AIRFLOW_HOME=str(home))
    return env


@pytest.mark.slow
@pytest.mark.parametrize("release", AIRFLOW_RELEASES)
def test_the_wheel_installs_beside_airflow_and_runs_a_source_without_the_checkout(
    release, wheel, replica_set, db_name, tmp_path
):
    venv, home, outside = tmp_path / "venv", tmp_path / "airflow", tmp_path / "elsewhere"
    outside.mkdir()
    run([str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)])
    python = venv / "bin" / "python"
    install(python, "--exclude-newer", AIRFLOW_RELEASES[release], f"apache-airflow=={release}", *PROVIDERS)
    before = airflow_versions(python)
    assert before["apache-airflow"] == release
    install(python, str(wheel))
    assert airflow_versions(python) == before, "installing the wheel moved Airflow or a provider"

    sources, lake = tmp_path / "sources", tmp_path / "lake"
    sources.mkdir()
    (sources / f"{db_name}.yaml").write_text(f"topic.prefix: acc\ndatabase.include.list: [{db_name}]\n")
    env = clean_environment(venv, home)
    env.update(
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__MONGO_CDC__SOURCES_DIR=str(sources),
        AIRFLOW__MONGO_CDC__LAKE_ROOT=str(lake),
        AIRFLOW__MONGO_CDC__TASK_RETRIES="0",
        AIRFLOW_CONN_MONGO_DEFAULT=local_env.mongo_connection(replica_set.uri),
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        # the JIT's first tier only, as the other tests' short Spark jobs run (docs/development.md)
        SPARK_SUBMIT_OPTS=local_env.local_driver_options(),
    )

    def airflow(*args: str) -> str:
        return run([str(venv / "bin" / "airflow"), *args], env, outside)

    airflow("db", "migrate")
    run([str(venv / "bin" / "mongo-cdc-dag-file")], env, outside)
    assert sorted(path.name for path in (home / "dags").iterdir()) == [
        "mongo_cdc_dags.py",
        "mongo_cdc_source_config.py",
    ]
    airflow("dags", "reserialize")
    assert json_result(airflow("dags", "list-import-errors", "--output", "json")) == []
    dag_id = f"mongo_cdc__{db_name}"
    assert "mongo-cdc" in airflow("providers", "list")
    section = airflow("config", "list", "--section", "mongo_cdc", "--include-descriptions")
    assert "[mongo_cdc]" in section and "sources_dir" in section and "MONGO_CDC_SOURCES_DIR" in section

    source = CdcSource(db_name, db_name, str(lake), "acc")
    with replica_set.client() as client:
        collection = client[db_name].customers
        collection.insert_many([{"_id": i, "name": f"c{i}", "n": i} for i in range(20)])
        airflow("dags", "test", dag_id, "2026-01-01T00:00:00+00:00")  # the snapshot
        assert_state_equals_collection(source, client, "customers")
        collection.insert_one({"_id": 100, "name": "new"})
        collection.update_one({"_id": 3}, {"$set": {"n": 33}, "$unset": {"name": ""}})
        collection.delete_one({"_id": 5})
        airflow("dags", "test", dag_id, "2026-01-01T01:00:00+00:00")  # streamed
        assert_state_equals_collection(source, client, "customers")
    runs = json_result(airflow("dags", "list-runs", dag_id, "--output", "json"))
    assert sorted(run["state"] for run in runs) == ["success", "success"]
