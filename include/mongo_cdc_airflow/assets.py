"""Each collection's ``state`` and ``changes`` tables as Airflow Assets, so downstream DAGs schedule on them.

The collections are known only when a run has landed them, so the DAG declares one ``AssetAlias``
per source (``mongo_cdc__<source>``) as the summary task's outlet, and the summary adds an event
for each table the run's transform touched, with extras: ``rows`` (the table's live rows),
``new_events`` (this run's events of the collection), ``table_version`` (its Delta version) and
``committed`` (per replica set, the last batch the lake committed and its position). A downstream
DAG schedules on ``Asset(table_asset_uri(...))`` (the table's URI, ``file://`` for a local lake).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias

from mongo_cdc import lake
from mongo_cdc.config import SourceConfig
from mongo_cdc.landing import SourceLake
from mongo_cdc.storage import table_if_exists


def source_alias(config: SourceConfig) -> AssetAlias:
    return AssetAlias(f"mongo_cdc__{config.name}")


def table_asset_uri(source_lake: SourceLake, zone: str, namespace: str) -> str:
    """The Asset URI of a collection's ``state`` or ``changes`` table."""
    db, _, collection = namespace.partition(".")
    uri = lake.table_uri(source_lake.location, zone, source_lake.prefix, db, collection)
    return f"file://{uri}" if source_lake.location.is_local else uri


def emit_table_events(
    outlet_events: Any, config: SourceConfig, source_lake: SourceLake, events: dict[str, dict[str, int]]
) -> list[str]:
    """Add an asset event for each table of the collections with new events; their URIs."""
    committed = {
        batch.rs: {"batch_seq": batch.seq, "cluster_time": batch.cluster_time}
        for batch in source_lake.batches()
    }
    emitted = []
    for namespace, ops in sorted(events.items()):
        for zone in ("state", "changes"):
            db, _, collection = namespace.partition(".")
            uri = lake.table_uri(source_lake.location, zone, source_lake.prefix, db, collection)
            table = table_if_exists(uri, source_lake.options)
            if table is None:
                continue
            extra = {
                "rows": table.to_pyarrow_dataset().count_rows(),
                "new_events": sum(ops.values()),
                "table_version": table.version(),
                "committed": committed,
            }
            asset_uri = table_asset_uri(source_lake, zone, namespace)
            outlet_events[source_alias(config)].add(Asset(uri=asset_uri, name=asset_uri), extra=extra)
            emitted.append(asset_uri)
    return emitted
