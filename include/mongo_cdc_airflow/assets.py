"""Each collection's ``state`` and ``changes`` tables as Airflow Assets, so downstream DAGs schedule on them.

The collections are known only when a run has landed them, so the CDC DAG declares one
``AssetAlias`` per source (``mongo_cdc__<source>``) as the ``summary`` task's outlet, and the
summary adds, through it, one asset event for each table of each collection the run touched:
the collections its pulls read events of (snapshot reads included) and those named by the
batches the lake committed during the run, those the transform had batches to apply for (one
catching up after a failed run), and each collection still behind the committed batches (its
transform failed: ``batches_behind`` in the extras says by how many, every run until it catches
up). The asset's URI is the table's location
(``table_asset_uri``); its name is the same string, so ``Asset("<uri>")`` in a downstream DAG
names the very same asset. The event's extras (``table_event_extra``) are small and JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote

from airflow.sdk import Asset, AssetAlias

from mongo_cdc import lake
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.dag_ids import cdc_dag_id
from mongo_cdc.lake.batch_log import Batch, last_batches
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation, row_count
from mongo_cdc.namespace import Namespace
from mongo_cdc.transform.applied_mark import TableFigures
from mongo_cdc.transform.backlog import Backlog, collections_behind

log = logging.getLogger(__name__)

TABLE_ZONES = ("state", "changes")
_URI_PATH_SAFE = "/" + lake.layout.NAME_ESCAPE
# The figures of each replica set's oplog window (``oplog_window.OplogWindow.to_dict``) an event
# carries: in seconds for programs, as text (``3 h 12 min``) for people
OPLOG_FIGURES = (
    "window_seconds",
    "position_age_seconds",
    "headroom_seconds",
    "window",
    "position_age",
    "headroom",
)


class TableEvent(NamedTuple):
    """An asset event the summary added: the table's zone, its collection, its Asset URI, its rows."""

    zone: str
    namespace: str
    uri: str
    rows: int


def source_alias(config: SourceConfig) -> AssetAlias:
    """The alias the source's table events go through (a DAG may schedule on it: any of its tables)."""
    return AssetAlias(cdc_dag_id(config.name))


def table_asset_uri(location: LakeLocation, zone: str, prefix: str, namespace: str) -> str:
    """The Asset URI of a collection's ``state`` or ``changes`` table: ``file://<absolute path>`` for a
    local lake, the table's URI (``s3://bucket/...``) otherwise.

    The path is percent-encoded where the lake root holds what a URI cannot (the names in it are
    escaped already, their ``!`` legal in a URI path), so the URI is already in the form Airflow
    normalises Asset URIs to.
    """
    uri = lake.table_uri(location, zone, prefix, *Namespace.parse(namespace))
    if location.is_local:
        return f"file://{quote(uri, safe=_URI_PATH_SAFE)}"
    scheme, _, rest = uri.partition("://")
    bucket, _, path = rest.partition("/")
    return f"{scheme}://{bucket}/{quote(path, safe=_URI_PATH_SAFE)}"


def touched_namespaces(
    events: Mapping[str, Any], batches: list[Batch], before: Mapping[str, int]
) -> list[str]:
    """The collections a run touched: those its pulls read events of, and those of the batches
    committed after ``before`` (the last batch per replica set when the run began), which also
    covers a pull's earlier try that landed batches and then failed."""
    landed = {
        namespace
        for batch in batches
        if batch.seq > before.get(batch.rs, 0)
        for namespace in (*batch.namespaces, *(batch.collections or ()))
    }
    return sorted(landed | set(events))


def committed_positions(batches: list[Batch]) -> dict[str, dict[str, int | None]]:
    """Per replica set, its last committed batch and that batch's position (packed cluster time)."""
    last = last_batches(batches)
    return {rs: {"batch_seq": batch.seq, "cluster_time": batch.cluster_time} for rs, batch in last.items()}


def table_event_extra(
    namespace: str,
    uri: str,
    rows: int,
    new_events: int,
    version: int,
    committed: dict[str, dict],
    batches_behind: int,
    oplog: Mapping[str, Mapping],
) -> dict[str, Any]:
    """An asset event's extras (docs/reading.md, "Airflow Assets"): the collection's name as MongoDB
    has it next to its table's URI, whose path holds the name escaped (``lake.name_parts``)."""
    return {
        "collection": namespace,
        "table": uri,
        "rows": rows,
        "new_events": new_events,
        "table_version": version,
        "committed": committed,
        "batches_behind": batches_behind,
        "oplog": {
            rs: {key: window.get(key) for key in OPLOG_FIGURES} for rs, window in sorted(oplog.items())
        },
    }


def emit_table_events(
    outlet_events: Any,
    config: SourceConfig,
    source_lake: SourceLake,
    batches: list[Batch],
    run_summary: Mapping[str, Any],
    committed_before: Mapping[str, int],
    pending: Iterable[str],
    backlogs: Mapping[str, Backlog],
    figures: TableFigures,
    zones: tuple[str, ...] = TABLE_ZONES,
) -> list[TableEvent]:
    """Add an asset event for each table (of ``zones``) of each collection the run touched, the
    transform had batches to apply for, or that is behind; the events added.

    ``batches``: the committed batches (the batch log); ``run_summary``: the summary task's result
    (``events`` per collection, ``oplog`` per replica set, ``verification`` per verified collection:
    a state table's event carries it); ``committed_before``: the last batch per replica set that
    ``discover`` saw; ``pending``: the collections that may have had a backlog when the transform
    started (``work.plan_work``); ``backlogs``: each collection's now (``backlog.source_backlogs``);
    ``figures``: the version and rows of the tables this run's transform left (``AppliedMark.figures``),
    which are not opened again.
    """
    committed = committed_positions(batches)
    alias = outlet_events[source_alias(config)]
    emitted = []
    touched = touched_namespaces(run_summary["events"], batches, committed_before)
    verified = run_summary.get("verification") or {}
    namespaces = sorted({*touched, *pending, *collections_behind(backlogs), *verified})
    unknown = [
        namespace for namespace in namespaces if any(zone not in figures.get(namespace, {}) for zone in zones)
    ]
    tables = source_lake.tables(unknown, zones)
    for namespace in namespaces:
        new_events = sum(run_summary["events"].get(namespace, {}).values())
        backlog = backlogs.get(namespace, Backlog())
        for zone in zones:
            uri = lake.table_uri(source_lake.location, zone, source_lake.prefix, *Namespace.parse(namespace))
            table = tables.get((namespace, zone))
            version, rows = figures.get(namespace, {}).get(zone) or (
                (None, 0) if table is None else (table.version(), row_count(table))
            )
            if version is None:  # the transform wrote nothing for it (nothing to write yet)
                log.info("%s: no %s table yet, so no asset event for it", namespace, zone)
                continue
            asset_uri = table_asset_uri(source_lake.location, zone, source_lake.prefix, namespace)
            extra = table_event_extra(
                namespace,
                uri,
                rows,
                new_events,
                version,
                committed,
                backlog.of_table(zone),
                run_summary["oplog"],
            )
            if zone == "state" and namespace in verified:
                extra["verification"] = verified[namespace]
            alias.add(Asset(name=asset_uri, uri=asset_uri), extra=extra)
            log.info("asset event %s: %s", asset_uri, extra)
            emitted.append(TableEvent(zone, namespace, asset_uri, extra["rows"]))
    return emitted
