"""MongoDB clients from Airflow connections, and offsets stored as Airflow Variables."""

from __future__ import annotations

from airflow.providers.mongo.hooks.mongo import MongoHook
from airflow.sdk import Variable
from pymongo import MongoClient

from mongo_cdc.topology import make_client


def mongo_client(conn_id: str) -> MongoClient:
    """A client built from the Airflow connection (credentials never live in the source YAML).

    ``MongoHook`` resolves the connection and its options; the client itself is ours because
    the CDC path needs exact-millisecond date decoding.
    """
    hook = MongoHook(mongo_conn_id=conn_id)
    options = dict(hook.extras)
    if hook.allow_insecure:
        options["tlsAllowInvalidCertificates"] = True
    return make_client(hook.uri, options)


class VariableOffsetStore:
    """``offsets.OffsetStore`` backed by Airflow Variables (JSON text)."""

    def get(self, key: str) -> str | None:
        return Variable.get(key, default=None)

    def set(self, key: str, value: str) -> None:
        Variable.set(key, value)
