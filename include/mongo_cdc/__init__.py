"""mongo-cdc core: change-data-capture from MongoDB into a Delta lake (no Airflow import anywhere here).

Four stages, each a package, each importing only the ones below it:

* ``config``: a source's YAML as a ``SourceConfig`` (``load_source``, ``load_sources``); every key
  declared once (``config.source.SETTINGS``), the reference page rendered from the declarations.
* ``capture``: MongoDB into raw batches. The Airflow layer calls ``topology.discover_shards``,
  ``shard_lifecycle.plan_shard``, ``snapshot.start_snapshot`` / ``copy_chunks`` /
  ``commit_snapshot``, ``streaming.pull_changes`` and ``backfill.backfill_interval``, each with
  one replica set as a ``replica_set.ReplicaSetCapture`` whose ``offsets.OffsetKeeper`` holds its
  position.
* ``lake``: where tables live and how batches land exactly once: ``lake.table_uri`` and the raw
  schema, ``landing.SourceLake``, the ledger ``batch_log.Batch`` / ``BatchWindow``,
  ``storage.LakeLocation``, ``table_reads.read_rows``, ``maintenance.maintain_table``.
* ``transform``: raw events into the ``state`` and ``changes`` tables, run by the Spark job
  ``spark_apps/cdc_transform.py``; ``transform.backlog`` tells which collections are behind.

``extjson`` (Extended JSON, lossless and fast) is shared by all of them. Developer tooling (the
bench, the mongod launcher) lives in ``mongo_cdc_dev``, outside this package, which is zipped and
shipped to every Spark executor.
"""

__version__ = "0.1.0"
