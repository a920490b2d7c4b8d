"""Reports invalid mongo-cdc source YAMLs as this file's Airflow DAG import error.

It defines no DAG. Airflow records import errors per DAG file, so the sources' DAGs
(mongo_cdc_dags.py) stay up for every valid source while this file's import error lists every
problem of every invalid one (docs/deploying.md, "Sources").
"""

from mongo_cdc_airflow.dag_factory import raise_source_errors

raise_source_errors()
