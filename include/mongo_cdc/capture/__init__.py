"""Capture: reading MongoDB (snapshots and change streams) into raw batches the lake lands.

* Topology and shards: ``topology`` (replica sets and shards found from a URI),
  ``shard_lifecycle`` (a shard added or removed between runs).
* Snapshots: ``snapshot`` (the initial and on-demand copies), ``chunking`` (a collection split
  into ``_id`` ranges copied in parallel).
* Streaming: ``streaming`` (one micro-batch pull from the stored resume token),
  ``pull_progress`` (its progress lines), ``stream_filter`` (which namespaces and operations a
  stream returns), ``oplog_window`` (a resume position the oplog no longer holds),
  ``heartbeats``, ``collection_events`` (drops and renames), ``transactions`` (BEGIN/END
  records), ``oversized_events`` (events over 16 MB), ``backfill`` (history from the oplog).
* Events: ``change_cursor`` (a change stream read raw), ``raw_rows`` (a change-stream event or a
  snapshot read as a raw row), ``raw_tables`` (raw rows and documents as Arrow), ``document_ids``
  (a document's ``_id`` read from its own element), ``capture_modes`` (what a stream is asked
  for), ``field_filters`` (fields excluded or renamed).
* ``offsets``: per-replica-set resume positions and committed batch numbers.

Capture imports the lake and the config; the lake never imports capture.
"""
