"""Raw change events -> the ``state`` and ``changes`` tables: the pure-Python half of the Spark job.

Nothing here imports pyspark, so it unit-tests fast; ``spark_apps/cdc_transform.py`` distributes it.

* ``raw_events``: raw files to apply (committed, past a table's watermarks) and their rows.
* ``document_state``: fold a document's events into its latest version (the ``state`` table).
* ``flatten``: one ``changes`` row per event (Debezium ExtractNewDocumentState);
  ``flatten_options``: its option set, from the source YAML to the Spark job's arguments.
* ``ejson_types``: BSON -> column types, their merge across documents, value conversion.
* ``table_layout``: a table's columns and rows.
* ``versioned_table``: version directories, the public symlink, ``_mongo_cdc.json``.
"""
