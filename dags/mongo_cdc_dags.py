"""mongo-cdc DAGs: one per source YAML in [mongo_cdc] sources_dir (docs/deploying.md)."""

from mongo_cdc_airflow.dag_factory import build_dags

globals().update(build_dags())
