"""The ``transform`` task: spark-submit of the Spark job, runnable on a cluster whose Pythons lack mongo_cdc.

When the task runs (never when the DAG is parsed), ``CdcTransformOperator``

* ships the ``mongo_cdc`` package the Airflow worker imports to the executors, as a zip passed to
  ``--py-files`` (``package_zip``: built once per package content, then reused);
* takes Spark properties from the Spark connection's ``conf`` extra (``spark_conf``), over the defaults
  (executors and driver run the Airflow worker's Python, Spark UI off);
* hands the lake's credentials to spark-submit in its environment (``environment``), never on its
  command line, which every local user can read.

The provider itself reads only a few connection extras (``queue``, ``deploy-mode``, ``spark-binary``,
``namespace``, …) and takes Spark properties only as the operator's ``conf`` argument.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Connection

import mongo_cdc
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.dag_ids import cdc_dag_id
from mongo_cdc.lake.storage import STORAGE_OPTIONS_ENV
from mongo_cdc_airflow import task_ids
from mongo_cdc_airflow.lake_storage import lake_location, source_lake

log = logging.getLogger(__name__)

PY_FILES_CACHE = os.path.join(tempfile.gettempdir(), "mongo-cdc-py-files")
PY_FILES_PROPERTY = "spark.submit.pyFiles"


def package_zip(cache_dir: str = PY_FILES_CACHE) -> str:
    """A zip of the importable ``mongo_cdc`` package (its ``.py`` files), for ``--py-files``.

    Named by a hash of the files' paths and contents, so a changed package gets a new zip and an
    unchanged one is not zipped again. Written under a temporary name and renamed, so tasks running at
    once never see a half-written zip.
    """
    package_dir = os.path.dirname(os.path.abspath(mongo_cdc.__file__))
    sources: list[tuple[str, bytes]] = []
    for directory, subdirectories, files in os.walk(package_dir):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, "rb") as source:
                    sources.append((os.path.relpath(path, package_dir).replace(os.sep, "/"), source.read()))
    digest = hashlib.sha256()
    for relative, content in sources:
        digest.update(relative.encode() + b"\0" + hashlib.sha256(content).digest())
    path = os.path.join(cache_dir, f"mongo_cdc-{digest.hexdigest()[:20]}.zip")
    if os.path.exists(path):
        return path
    os.makedirs(cache_dir, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=cache_dir, prefix=".building-", suffix=".zip")
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for relative, content in sources:
                archive.writestr(f"mongo_cdc/{relative}", content)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
    log.info("built %s from %s (%d files)", path, package_dir, len(sources))
    return path


def spark_conf(
    conn_id: str, extra: Mapping[str, Any], operator_conf: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The defaults, then the operator's ``conf``, then the connection's ``conf`` extra (each wins).

    The extra is a JSON object of Spark properties: ``{"conf": {"spark.executor.memory": "2g"}}``.
    """
    conf: dict[str, Any] = {
        # client deploy mode: the driver is this Airflow worker's Python, which imports mongo_cdc
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",
        **(operator_conf or {}),
    }
    overrides = extra.get("conf", {})
    if not isinstance(overrides, dict):
        raise ValueError(
            f"Spark connection '{conn_id}': extra 'conf' must be a JSON object of Spark properties, "
            f'e.g. {{"conf": {{"spark.executor.memory": "2g"}}}}; got {overrides!r}'
        )
    for key, value in overrides.items():
        if not key.startswith("spark."):
            raise ValueError(
                f"Spark connection '{conn_id}': extra 'conf' key '{key}' is not a Spark property "
                "(they start with 'spark.'); remove it or fix its name"
            )
        if not isinstance(value, str | int | float | bool):
            raise ValueError(
                f"Spark connection '{conn_id}': extra 'conf' property '{key}' must be a string, number "
                f"or boolean; got {value!r}"
            )
        conf[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return conf


def submit_settings(
    conn_id: str, extra: Mapping[str, Any], operator_conf: Mapping[str, Any] | None, py_files: str | None
) -> tuple[dict[str, Any], str]:
    """The Spark properties (``spark_conf``) and ``--py-files`` value (with ``package_zip``) of a run."""
    conf = spark_conf(conn_id, extra, operator_conf)
    # --py-files replaces a spark.submit.pyFiles property: ship the user's files as well
    user_py_files = conf.pop(PY_FILES_PROPERTY, None)
    return conf, ",".join(p for p in (py_files, user_py_files, package_zip()) if p)


class CdcTransformOperator(SparkSubmitOperator):
    """SparkSubmitOperator that ships ``mongo_cdc`` and reads Spark properties from its connection.

    Both happen in ``execute``: building the zip at DAG-parse time would slow every parse, and the
    Python paths are the worker's, not the DAG processor's.
    A run whose ``plan_transform`` found no collection with work (``task_ids.WORK_KEY``) starts no
    spark-submit: the task succeeds at once.
    """

    def __init__(self, *, config: SourceConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.lineage: Any = None  # the OpenLineage provider's OperatorLineage, when it is configured

    def execute(self, context: Any) -> None:
        # when it runs, not when the DAG is parsed: metrics and lineage may be off
        from mongo_cdc_airflow.lineage import openlineage_enabled, transform_lineage
        from mongo_cdc_airflow.metrics import SourceMetrics

        extra = Connection.get(self._conn_id).extra_dejson
        self.conf, self.py_files = submit_settings(self._conn_id, extra, self.conf, self.py_files)
        location = lake_location(self.config.lake_root, self.config.lake_conn_id)
        if location.storage_options and (self._deploy_mode or extra.get("deploy-mode")) == "cluster":
            raise ValueError(cluster_mode_credentials_error(self.config.lake_conn_id, self._conn_id))
        # after the checks of the settings: a wrong one fails every run, idle or not
        work = context["ti"].xcom_pull(task_ids=task_ids.PLAN_TRANSFORM, key=task_ids.WORK_KEY)
        if work == []:  # plan_transform found no collection with work (``work.source_work``)
            log.info("no collection has transform work (see plan_transform's log): Spark is not started")
            return
        log.info("shipping %s to the executors; Spark properties: %s", self.py_files, sorted(self.conf))
        # Not env_vars: on YARN and Kubernetes the hook turns those into --conf arguments.
        started = time.monotonic()
        with environment(location.to_env()):
            super().execute(context)
        SourceMetrics(self.config.name).seconds("transform", time.monotonic() - started)
        if openlineage_enabled():
            # here, not in the provider's call after the task: that runs in a forked process, where
            # neither XCom (the supervisor's channel) nor delta-rs (its runtime's threads) can be used
            pending = context["ti"].xcom_pull(task_ids=task_ids.PLAN_TRANSFORM, key=task_ids.PENDING_KEY)
            self.lineage = transform_lineage(source_lake(self.config), pending or ())

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The OpenLineage provider's question once the task succeeded (asked only when it is
        installed): the raw tables of the collections this run had to bring up to date in, their
        changes and state tables out (``lineage``, made by ``execute``)."""
        return self.lineage


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with ``variables`` set while the block runs, then as it was.

    How the lake's credentials reach the Spark job: spark-submit inherits the task process's
    environment and the driver (client deploy mode) inherits spark-submit's; no other local user
    can read a process's environment (``/proc/<pid>/environ`` is its owner's alone), whereas its
    command line is everyone's (``ps``). The executors need no copy: every Spark task carries the
    driver's ``LakeLocation`` in its closure.
    """
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def cluster_mode_credentials_error(lake_conn_id: str | None, spark_conn_id: str) -> str:
    """Why a cluster-mode driver cannot get the lake connection's credentials, and the fixes."""
    return (
        f"lake connection '{lake_conn_id}' has credentials, but Spark connection '{spark_conn_id}' runs "
        "the driver in cluster deploy mode, where it does not inherit spark-submit's environment and the "
        "only other ways there are the command line or Spark properties that the cluster shows in clear. "
        'Either use client deploy mode (remove "deploy-mode" from the Spark connection\'s extra), or '
        "remove lake.connection.id from the source and give the driver the credentials through the "
        f"cluster's own secret mechanism: the {STORAGE_OPTIONS_ENV} environment variable (a JSON object of "
        "delta-rs storage options, e.g. from a Kubernetes secret with "
        f"spark.kubernetes.driver.secretKeyRef.{STORAGE_OPTIONS_ENV}=<secret>:<key>) or ambient "
        "credentials (an instance profile or workload identity)"
    )


def transform_task(config: SourceConfig, application: str, application_args: Any) -> CdcTransformOperator:
    """The CDC DAG's ``transform`` task (``application_args``: the plan_transform task's output).

    One at a time across every run of the DAG, live and backfill alike (the scheduler counts a task's
    running instances over all runs; a backfill ignores the DAG's ``max_active_runs``, and each of its
    runs' transform also applies the live batches still pending): the collections' tables have one
    writer.
    """
    return CdcTransformOperator(
        task_id=task_ids.TRANSFORM,
        max_active_tis_per_dag=1,
        application=application,
        conn_id=config.spark_conn_id,
        application_args=application_args,
        name=cdc_dag_id(config.name),
        config=config,
    )
