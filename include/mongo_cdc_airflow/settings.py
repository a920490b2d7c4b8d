"""mongo-cdc's deployment settings: Airflow's config section ``[mongo_cdc]`` (declared in ``provider``).

Each option is read as Airflow reads its own (``airflow.cfg``, or the environment variable
``AIRFLOW__MONGO_CDC__<OPTION>``); when it is not set, the environment variable it had before the
section existed (``MONGO_CDC_SOURCES_DIR``, ...) still counts, then the built-in default.
"""

from __future__ import annotations

import importlib.util
import os

from airflow.sdk.configuration import conf

from mongo_cdc_airflow.provider import OPTIONS, SECTION


def option(name: str) -> str | None:
    """``[mongo_cdc] <name>``, else its legacy environment variable; None when neither is set."""
    value = conf.get(SECTION, name, fallback=None)
    return value or os.environ.get(OPTIONS[name].legacy_env) or None


def sources_dir() -> str:
    """The folder of the source files."""
    dags_folder = conf.get("core", "dags_folder")
    return option("sources_dir") or os.path.join(os.path.dirname(dags_folder), "include", "sources")


def lake_root() -> str | None:
    """The lake of sources without ``lake.root`` (None: the core's, ``$AIRFLOW_HOME/mongo-cdc-lake``)."""
    return option("lake_root")


def spark_app() -> str:
    """The Spark entry point ``spark-submit`` runs: the installed package's own file by default, or in a
    checkout used through ``PYTHONPATH=<repo>/include`` (no install), ``spark_apps/`` beside ``include/``."""
    configured = option("spark_app")
    if configured:
        return configured
    spec = importlib.util.find_spec("mongo_cdc_spark")
    if spec is not None and spec.origin is not None:
        return os.path.join(os.path.dirname(spec.origin), "cdc_transform.py")
    include = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(os.path.dirname(include), "spark_apps", "cdc_transform.py")


def task_retries() -> int:
    """Retries of every task: 3 unless set."""
    value = option("task_retries")
    if value is None:
        return 3
    if not value.strip().isdigit():
        raise ValueError(
            f"[{SECTION}] task_retries is {value!r}; set it to a whole number of retries, 0 or more "
            f"(airflow.cfg, AIRFLOW__MONGO_CDC__TASK_RETRIES or {OPTIONS['task_retries'].legacy_env})"
        )
    return int(value)
