"""mongo-cdc core: change-data-capture from MongoDB into a Parquet lake (no Airflow imports)."""

__version__ = "0.1.0"
