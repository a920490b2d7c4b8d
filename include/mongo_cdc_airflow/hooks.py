"""``MongoCdcHook``: the MongoDB clients of a source, from its Airflow connection."""

from __future__ import annotations

from typing import Any

from airflow.providers.mongo.hooks.mongo import MongoHook
from pymongo import MongoClient

from mongo_cdc.capture.topology import Shard, make_client, shard_options, shard_uri


class MongoCdcHook(MongoHook):
    """The provider's ``MongoHook`` (connection lookup, URI, TLS options) with the CDC path's clients.

    The clients are made by ``topology.make_client``, not ``MongoHook.get_conn``: the CDC path needs
    exact-millisecond date decoding, and a sharded source needs a client per shard, reached directly
    at the shard's hosts with the source connection's credentials and options. Credentials never
    live in the source YAML, only in the connection.
    """

    def client_options(self) -> dict[str, Any]:
        """``MongoClient`` keyword options of the connection (its extras, TLS leniency applied)."""
        options = dict(self.extras)
        if self.allow_insecure:
            options["tlsAllowInvalidCertificates"] = True
        return options

    def get_conn(self) -> MongoClient:
        """The source client, kept for the hook's lifetime (closed when the hook is used as a context)."""
        if self.client is None:
            self.client = self.source_client()
        return self.client

    def source_client(self) -> MongoClient:
        """A new client on the source as configured (replica set, router or config server)."""
        return make_client(self.uri, self.client_options())

    def shard_client(self, shard: Shard) -> MongoClient:
        """A new client on one shard's replica set (the source connection itself for a plain replica set)."""
        return make_client(shard_uri(self.uri, shard), shard_options(self.client_options(), shard))
