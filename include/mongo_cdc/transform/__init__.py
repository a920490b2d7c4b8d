"""Raw change events -> the ``state`` and ``changes`` tables: the Spark job's code.

``spark_apps/cdc_transform.py`` is only its entry point (arguments and ``main``). Nothing here imports
pyspark (the driver takes a SparkContext), so the pure parts unit-test fast.

* ``driver``: the driver's side: one collection's run (``CollectionTransform``), made again after a
  lost commit race, and the job's summary; ``state_commit`` and ``changes_commit``: its commits to
  the ``state`` table (MERGE, deletion markers) and the ``changes`` table (append, rebuild);
  ``table_commits``: what those share. These import deltalake.
* ``raw_slices`` and ``slice_tasks``: what each Spark task reads (a raw slice) and does with it (plan,
  transform, fold inputs). They run on executors that have only pyarrow, orjson and bson: no
  deltalake or pyspark import.
* ``raw_events``: raw rows as events; the batches a table applied (``applied_batches``).
* ``document_state``: fold a document's events into its latest version (the ``state`` table).
* ``flatten``: one ``changes`` row per event (Debezium ExtractNewDocumentState);
  ``flatten_options``: its option set, from the source YAML to the Spark job's arguments.
* ``columns``: column types of BSON-decoded values, their merge and evolution, their Arrow form.
* ``table_layout``: a table's columns, batch by batch, and a batch's Arrow record batch.
* ``keys``: one normalised key per document ``_id`` (MongoDB's ``_id`` equality).
* ``data_files``: Parquet files Spark's executors write for a Delta commit the driver makes.
* ``backlog``: the committed batches a collection's tables have not applied.
"""
