"""The Spark job's entry point (``cdc_transform.py``), installed as the package ``mongo_cdc_spark`` so
that ``spark-submit`` finds it inside the installed package (``mongo_cdc_airflow.settings.spark_app``)."""
