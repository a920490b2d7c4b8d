"""Airflow glue for mongo-cdc: the DAG factory, its task bodies, the MongoDB hook, Variables."""
