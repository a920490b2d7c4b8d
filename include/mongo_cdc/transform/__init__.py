"""Raw change events -> the ``state`` and ``changes`` tables: the Spark job's code.

``spark_apps/cdc_transform.py`` is only its entry point (arguments and ``main``). One module imports
pyspark at run time: ``state_commit``, whose plan keeps the documents folded apart on the executors'
disks between its Spark jobs (``StorageLevel``; ``RDD`` names their type). ``driver`` and
``collection_run`` name ``SparkContext`` for type checking only: the driver is given one. The rest
imports no pyspark, so the pure parts unit-test fast.

* ``driver``: the driver's side: one collection's run (``CollectionTransform``), made again after a
  lost commit race, the job shared by small collections, and the job's summary;
  ``collection_run``: what a try of a collection's run works within (its tables' places, the
  batches it applies and how each commit records them, its slices on Spark); ``state_commit`` and
  ``changes_commit``: its commits to the ``state`` table (``state_merge``'s rule, file by file or a
  small table written again whole; the deletion markers) and the ``changes`` table (append,
  rebuild); ``table_commits``: what those share. These import deltalake.
* ``raw_slices`` and ``slice_tasks``: what each Spark task reads (a raw slice) and does with it (plan,
  transform, fold); ``whole_collection``: a small collection's whole run in one task;
  ``task_contract``: what the driver hands a task and a task hands back; ``stored_rows``: the stored
  versions and deletion markers a task reads by key; ``table_formats``: the derived tables' own
  columns. They run on executors that have only pyarrow, orjson and bson: no deltalake or pyspark
  import.
* ``raw_events``: raw rows as events; the batches a table applied (``applied_batches``).
* ``document_state``: fold a document's events into its latest version (the ``state`` table).
* ``flatten``: one ``changes`` row per event (Debezium ExtractNewDocumentState);
  ``flatten_options``: its option set, from the source YAML to the Spark job's arguments.
* ``column_types``: column types of BSON-decoded values, their merge and evolution;
  ``column_survey``: what a batch of decoded documents needs from a table's columns;
  ``arrow_columns``: their Arrow form.
* ``table_layout``: a table's columns, batch by batch, and a batch's Arrow record batch.
* ``keys``: one normalised key per document ``_id`` (MongoDB's ``_id`` equality).
* ``data_files``: Parquet files Spark's executors write for a Delta commit the driver makes.
* ``backlog``: the committed batches a collection's tables have not applied.
"""
