"""A self-contained local Airflow for the demo and the tests: SQLite metadata DB, env-var connections.

Import this before anything imports Airflow: Airflow reads its configuration at import time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Java's class-data archive of a local Spark driver's classes, made by `make` (the Makefile's
# SPARK_CLASSES, from ``mongo_cdc_dev/spark_classes_job.py``); absent, Spark only starts slower.
SPARK_CLASS_ARCHIVE = os.path.join(REPO_ROOT, ".local", "spark-classes.jsa")


def configure(airflow_home: str, lake_root: str, mongo_uri: str, sources_dir: str | None = None) -> None:
    """Point this process (and its children) at a private Airflow home, the repo's DAGs and a lake."""
    os.environ.update(airflow_env(airflow_home, lake_root, mongo_uri, sources_dir))


def airflow_env(
    airflow_home: str, lake_root: str, mongo_uri: str, sources_dir: str | None = None
) -> dict[str, str]:
    """The environment of a private Airflow (creates ``airflow_home``); for this process or for the
    ``airflow`` components a test starts as child processes."""
    os.makedirs(airflow_home, exist_ok=True)
    bin_dir = os.path.dirname(sys.executable)
    return {
        "AIRFLOW_HOME": airflow_home,
        "AIRFLOW__CORE__DAGS_FOLDER": os.path.join(REPO_ROOT, "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": os.path.join(REPO_ROOT, "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{os.path.join(airflow_home, 'airflow.db')}",
        "AIRFLOW_CONN_MONGO_DEFAULT": mongo_connection(mongo_uri),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "MONGO_CDC_LAKE_ROOT": lake_root,
        "MONGO_CDC_SOURCES_DIR": sources_dir or os.path.join(REPO_ROOT, "include", "sources"),
        # spark-submit finds SPARK_HOME through the python on PATH
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "SPARK_SUBMIT_OPTS": local_driver_options(),
    }


def local_driver_options() -> str:
    """JVM options of a local ``spark-submit`` (its driver JVM, ``SPARK_SUBMIT_OPTS``): the demo's
    and the tests' jobs last seconds, where the JIT's first tier alone is cheaper than compiling hot
    code again at the second, and mapping Spark's classes from ``SPARK_CLASS_ARCHIVE`` saves loading
    them; together about half a short job's CPU. Not for production runs, whose long jobs want the
    full JIT."""
    options = ["-XX:TieredStopAtLevel=1"]
    if os.path.exists(SPARK_CLASS_ARCHIVE):
        options.append(f"-XX:SharedArchiveFile={SPARK_CLASS_ARCHIVE}")  # a stale one is ignored
    return " ".join(options)


def mongo_connection(uri: str) -> str:
    """An Airflow connection (JSON form) for a ``mongodb://h1,h2/?replicaSet=x`` URI."""
    hosts, _, query = uri.removeprefix("mongodb://").partition("/?")
    extra = dict(part.split("=", 1) for part in query.split("&") if part)
    return json.dumps({"conn_type": "mongo", "host": hosts, "extra": extra})


def migrate(env: Mapping[str, str] | None = None) -> None:
    """Create or upgrade the SQLite metadata database (idempotent); ``env``: another Airflow's environment."""
    subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "airflow"), "db", "migrate"],
        check=True,
        env=dict(env) if env is not None else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
