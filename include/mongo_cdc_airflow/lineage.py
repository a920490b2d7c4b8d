"""What each task read and wrote, for OpenLineage (Marquez, DataHub, ...).

With ``apache-airflow-providers-openlineage`` installed and configured, its listener sends one
event per task with the task's inputs and outputs; without it nothing here has any effect (Airflow's
hook lineage collector keeps nothing when no lineage reader is registered, and the transform's
lineage method is only called by the provider). Nothing to configure in mongo-cdc.

* The pull and the snapshot report through Airflow's hook lineage collector: each collection they
  landed is an input ``mongodb://<host>:<port>/<db>/<collection>`` (the mongo provider turns it into
  namespace ``mongodb://<host>:<port>``, name ``<db>.<collection>``, OpenLineage's naming for
  MongoDB) and its raw Delta table an output.
* The transform (``CdcTransformOperator``) reports the raw tables it applied as inputs and the
  changes and state tables as outputs, each state table with its columns as the schema facet.

Delta tables are named by their location (``file:///...``, ``s3://bucket/...``), as the common.io
and amazon providers convert those URIs. The MongoDB host is the first of the replica set's seed
list; a name is percent-encoded in the URI where MongoDB allows what a URI path cannot hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import pyarrow as pa
from airflow.sdk import Asset
from airflow.sdk.lineage import get_hook_lineage_collector

from mongo_cdc import lake as layout
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc.namespace import Namespace
from mongo_cdc_airflow.assets import table_asset_uri


def collection_uri(host: str, namespace: str) -> str:
    """The Asset URI of a MongoDB collection (the mongo provider's form, port always given)."""
    db, collection = Namespace.parse(namespace)
    address = host if ":" in host.rsplit("]", 1)[-1] else f"{host}:27017"
    return f"mongodb://{address}/{quote(db, safe='')}/{quote(collection, safe='')}"


def report_landed(
    reporter: object, hosts: Iterable[str], lake: SourceLake, namespaces: Iterable[str]
) -> None:
    """Hook lineage of a pull or snapshot: each of ``namespaces`` read from the replica set at
    ``hosts`` and written to its raw table. ``reporter``: the object that did it (Airflow keys the
    collected lineage by it)."""
    collector = get_hook_lineage_collector()
    host = next(iter(hosts))
    for namespace in sorted(namespaces):
        raw_table = table_asset_uri(lake.location, "raw", lake.prefix, namespace)
        collector.add_input_asset(reporter, uri=collection_uri(host, namespace))
        collector.add_output_asset(reporter, uri=raw_table)


def openlineage_enabled() -> bool:
    """The OpenLineage provider is installed and configured (its own test: a transport is set)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    return not is_disabled()


def transform_lineage(lake: SourceLake, namespaces: Iterable[str]) -> Any:
    """The transform's ``OperatorLineage``: the raw tables of ``namespaces`` in, their changes and
    state tables out, a state table with its columns. Only when ``openlineage_enabled``: its
    imports are the provider's."""
    from airflow.providers.common.compat.openlineage.facet import (
        Dataset,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
    )
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.providers.openlineage.utils.utils import translate_airflow_asset

    def dataset(zone: str, namespace: str) -> Any:
        location, prefix = lake.location, lake.prefix
        translated = translate_airflow_asset(Asset(table_asset_uri(location, zone, prefix, namespace)), None)
        if zone != "state":
            return translated
        table_uri = layout.table_uri(location, zone, prefix, *Namespace.parse(namespace))
        table = table_if_exists(table_uri, lake.options)
        if table is None:
            return translated
        columns = pa.schema(table.schema().to_arrow())
        fields = [SchemaDatasetFacetFields(name=column.name, type=str(column.type)) for column in columns]
        schema = SchemaDatasetFacet(fields=fields)
        return Dataset(translated.namespace, translated.name, facets={"schema": schema})

    ordered = sorted(namespaces)
    return OperatorLineage(
        inputs=[dataset("raw", namespace) for namespace in ordered],
        outputs=[dataset(zone, namespace) for namespace in ordered for zone in ("changes", "state")],
    )
