"""Airflow glue for mongo-cdc: connections, offset storage in Variables, the DAG factory."""
