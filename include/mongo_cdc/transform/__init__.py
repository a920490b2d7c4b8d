"""Raw change events -> the ``state`` and ``changes`` tables: the pure-Python half of the Spark job.

Nothing here imports pyspark, so it unit-tests fast; ``spark_apps/cdc_transform.py`` distributes it.

* ``raw_events``: raw rows as events; the batches a table applied (``applied_batches``).
* ``document_state``: fold a document's events into its latest version (the ``state`` table).
* ``flatten``: one ``changes`` row per event (Debezium ExtractNewDocumentState);
  ``flatten_options``: its option set, from the source YAML to the Spark job's arguments.
* ``columns``: column types of BSON-decoded values, their merge and evolution, their Arrow form.
* ``table_layout``: a table's columns, batch by batch, and a batch's Arrow record batch.
* ``keys``: one normalised key per document ``_id`` (MongoDB's ``_id`` equality).
* ``data_files``: Parquet files Spark's executors write for a Delta commit the driver makes.
"""
