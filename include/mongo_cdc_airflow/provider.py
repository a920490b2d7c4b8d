"""mongo-cdc as an Airflow provider: ``get_provider_info``, the ``apache_airflow_provider`` entry point
in pyproject.toml. Airflow then lists the package (``airflow providers list``), its hook, and its
config section ``[mongo_cdc]`` with each option's description, type and default (``airflow config
list``); ``settings`` reads the options.

Airflow calls it while it loads its own configuration, so this module imports no Airflow (that
import would come back here half loaded) and nothing heavy: every Airflow process discovers it.
"""

from __future__ import annotations

from dataclasses import dataclass

import mongo_cdc

DISTRIBUTION = "mongo-cdc"
INTEGRATION = "MongoDB CDC"
SECTION = "mongo_cdc"


@dataclass(frozen=True)
class Option:
    kind: str  # the provider schema's type: "string" or "integer"
    legacy_env: str  # the environment variable of releases before [mongo_cdc]
    default: str  # the built-in default, as docs/deploying.md says it
    description: str
    example: str


OPTIONS = {
    "sources_dir": Option(
        "string",
        "MONGO_CDC_SOURCES_DIR",
        "`include/sources` beside the DAGs folder (`<dags_folder>/../include/sources`)",
        "Folder of the source YAML files, one DAG per file",
        "/srv/mongo-cdc/sources",
    ),
    "lake_root": Option(
        "string",
        "MONGO_CDC_LAKE_ROOT",
        "`$AIRFLOW_HOME/mongo-cdc-lake`",
        "The lake of every source whose file has no `lake.root`: a local directory or an s3://, gs://, "
        "abfs:// or abfss:// URI",
        "s3://my-bucket/lake",
    ),
    "spark_app": Option(
        "string",
        "MONGO_CDC_SPARK_APP",
        "`cdc_transform.py` of the installed package (`mongo_cdc_spark`)",
        "The Spark application the transform task submits",
        "/opt/mongo-cdc/cdc_transform.py",
    ),
    "task_retries": Option(
        "integer",
        "MONGO_CDC_TASK_RETRIES",
        "`3`",
        "Retries of every task (but those that always fail at once), with exponential backoff from 30 s",
        "3",
    ),
}


def get_provider_info() -> dict:
    return {
        "package-name": DISTRIBUTION,
        "name": "mongo-cdc",
        "description": "Change-data-capture from MongoDB into Delta Lake tables: one DAG per source file.",
        "integrations": [{"integration-name": INTEGRATION, "external-doc-url": "https://www.mongodb.com/"}],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": ["mongo_cdc_airflow.hooks"]}],
        "config": provider_config(),
    }


def provider_config() -> dict:
    """The ``config`` entry of ``get_provider_info``: the section and each option's description, type,
    default (None: the built-in one the description names) and example."""
    return {
        SECTION: {
            "description": "mongo-cdc: its source files, default lake, Spark entry point and task retries.",
            "options": {
                name: {
                    "description": f"{spec.description}. Unset: ${spec.legacy_env}, else {spec.default}.",
                    "version_added": mongo_cdc.__version__,
                    "type": spec.kind,
                    "example": spec.example,
                    "default": None,
                }
                for name, spec in OPTIONS.items()
            },
        }
    }
