"""mongo-cdc DAGs: one per source YAML in include/sources/ (or $MONGO_CDC_SOURCES_DIR)."""

from mongo_cdc_airflow.dag_factory import build_dags

globals().update(build_dags())
