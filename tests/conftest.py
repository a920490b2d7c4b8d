from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from cdc_support import CdcSource

from mongo_cdc_airflow import local_env
from mongo_cdc_dev.testing import ReplicaSet

# S3 (moto's server), the lake connection and s3:// lake locations: fixtures in tests/support/s3_support.py
pytest_plugins = ["s3_support"]

# ---------------------------------------------------------------------------------------------
# Tiers: a test's folder says what it needs, and marks it so (-m unit, -m "not system", ...).
# ---------------------------------------------------------------------------------------------

TIERS = ("unit", "integration", "e2e", "system")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if tier := _tier(item):
            item.add_marker(tier)
    # The slowest tiers first: make test's two processes (pytest -n) take files in this order, and a
    # minutes-long system file started last would leave one process working alone at the end.
    items.sort(key=lambda item: -TIERS.index(_tier(item) or "unit"))


def _tier(item: pytest.Item) -> str | None:
    """The tier of a test: its folder under tests/."""
    tests = Path(__file__).parent
    if item.path.is_relative_to(tests) and (folder := item.path.relative_to(tests).parts[0]) in TIERS:
        return folder
    return None


# ---------------------------------------------------------------------------------------------
# MongoDB: one real single-member replica set per test session (change streams need a replica set).
# Self-contained: uses only mongo_cdc_dev.testing and pytest.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def replica_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    with ReplicaSet("rs0", tmp_path_factory.mktemp("mongod")) as rs:
        yield rs


@pytest.fixture
def small_oplog(tmp_path: Path) -> Iterator[ReplicaSet]:
    """A replica set whose 1 MB oplog is truncated within seconds (checkpoints every second)."""
    with ReplicaSet(
        "rs_small", tmp_path / "mongod", extra_args=("--oplogSize", "1", "--syncdelay", "1")
    ) as rs:
        yield rs


@pytest.fixture
def db_name(request: pytest.FixtureRequest) -> str:
    """A database name no other test uses, so tests sharing ``replica_set`` don't see each other's data."""
    # MongoDB caps database names at 63 bytes and forbids characters such as "/. \"$".
    stem = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:40]
    return f"t_{stem}_{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------
# Airflow: a private AIRFLOW_HOME with a SQLite metadata DB for the whole session. Airflow reads
# its configuration when first imported, so the environment is set here, at conftest import.
# ---------------------------------------------------------------------------------------------

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="mongo-cdc-airflow-")
atexit.register(shutil.rmtree, _AIRFLOW_HOME, True)
local_env.configure(
    _AIRFLOW_HOME, lake_root=os.path.join(_AIRFLOW_HOME, "lake"), mongo_uri="mongodb://unset/"
)
os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"


@pytest.fixture(scope="session")
def airflow_db() -> str:
    local_env.migrate()
    return _AIRFLOW_HOME


@pytest.fixture
def cdc_source(airflow_db: str, replica_set: ReplicaSet, tmp_path: Path) -> Callable[..., CdcSource]:
    """Factory: write a source YAML for one test database and get a handle to run its DAG."""
    return lambda database, **settings: make_source(tmp_path, replica_set.uri, database, **settings)


def make_source(
    directory: Path, mongo_uri: str, database: str, storage_options: dict | None = None, **settings: object
) -> CdcSource:
    """A source capturing one database into ``directory/lake`` (or its ``lake.root``), its DAG the only
    one parsed, its tables maintained only if ``settings`` say so; ``storage_options``: how the test
    itself reaches an object-store lake.

    Task retries are off (MONGO_CDC_TASK_RETRIES=0) so a failing run ends at once under dag.test().
    """
    sources = directory / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    config = {
        "topic.prefix": "acc",
        "database.include.list": [database],
        "lake.root": str(directory / "lake"),
        # no maintenance unless a test asks for it: a run compacts the collections whose namespace's
        # CRC-32 falls in the hour's slot (lake.maintenance.maintained), so with the default daily
        # interval 1 run in 24 rewrote a table's files under a test that counts them
        "lake.optimize.interval.hours": 0,
    }
    config.update(settings)
    (sources / f"{database}.yaml").write_text(yaml.safe_dump(config))
    os.environ["MONGO_CDC_SOURCES_DIR"] = str(sources)
    os.environ["AIRFLOW_CONN_MONGO_DEFAULT"] = local_env.mongo_connection(mongo_uri)
    os.environ["MONGO_CDC_TASK_RETRIES"] = "0"
    options = tuple(sorted((storage_options or {}).items()))
    return CdcSource(database, database, str(config["lake.root"]), "acc", options)


@pytest.fixture(scope="module")
def spark() -> Iterator:
    """A local Spark session for a module's readers (its JVM is gone before the next module)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def spark_context(request: pytest.FixtureRequest) -> Iterator:
    """A local SparkContext (2 cores) in this process for a module that runs the Spark job's code in
    process (its Python workers import mongo_cdc like this process); gone before the next module."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext

    context = SparkContext(
        conf=SparkConf()
        .setMaster("local[2]")
        .setAppName(request.module.__name__)
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
    )
    context.setLogLevel("WARN")
    yield context
    context.stop()
