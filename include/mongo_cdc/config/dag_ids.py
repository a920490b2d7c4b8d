"""A source's DAG ids, built from its name (``SourceConfig.name``, the YAML file's stem): the one
place that spells them, for the DAG factory, the sensors, the runbooks and the messages that
name them."""

from __future__ import annotations


def cdc_dag_id(source_name: str) -> str:
    """The id of the source's CDC DAG (also its Spark application's name and its Asset alias)."""
    return f"mongo_cdc__{source_name}"


def topology_dag_id(source_name: str) -> str:
    """The id of the source's shard watch, the DAG that triggers the CDC DAG when shards change."""
    return f"mongo_cdc_topology__{source_name}"
