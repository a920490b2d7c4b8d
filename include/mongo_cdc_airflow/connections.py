"""MongoDB clients from Airflow connections, and offsets stored as Airflow Variables."""

from __future__ import annotations

from typing import Any

from airflow.providers.mongo.hooks.mongo import MongoHook
from airflow.sdk import Variable
from pymongo import MongoClient

from mongo_cdc.topology import Shard, make_client, shard_options, shard_uri


def source_connection(conn_id: str) -> tuple[str, dict[str, Any]]:
    """URI and client options of the Airflow connection (credentials never live in the source YAML).

    ``MongoHook`` resolves the connection and its options; the clients are ours because the CDC
    path needs exact-millisecond date decoding and direct connections to each shard.
    """
    hook = MongoHook(mongo_conn_id=conn_id)
    options = dict(hook.extras)
    if hook.allow_insecure:
        options["tlsAllowInvalidCertificates"] = True
    return hook.uri, options


def mongo_client(conn_id: str) -> MongoClient:
    uri, options = source_connection(conn_id)
    return make_client(uri, options)


def shard_client(conn_id: str, shard: Shard) -> MongoClient:
    """A client on one shard's replica set (the source connection itself for a plain replica set)."""
    uri, options = source_connection(conn_id)
    return make_client(shard_uri(uri, shard), shard_options(options, shard))


class VariableOffsetStore:
    """``offsets.OffsetStore`` backed by Airflow Variables (JSON text)."""

    def get(self, key: str) -> str | None:
        return Variable.get(key, default=None)

    def set(self, key: str, value: str) -> None:
        Variable.set(key, value)

    def keys(self, prefix: str) -> list[str]:
        return list(Variable.keys(prefix=prefix))
