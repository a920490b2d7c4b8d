"""Which replica sets make up a source, and how to reach each one.

A plain replica set is one shard named by its set name, reached through the source connection
itself. A sharded cluster is read from the config server (``config.shards``) or a router
(``listShards``); each shard is then reached directly at the hosts the cluster lists for it, with
the source connection's credentials and options.

The topology kept between runs (Variable ``mongo_cdc.<source>.topology``) is a JSON list of
``{"id", "rs", "hosts", "via_source", "retiring"}``. A shard that has left the cluster but still
has an offset stays in it with ``retiring: true`` until its stream has been drained.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import quote_plus

from pymongo import MongoClient, uri_parser

from mongo_cdc.extjson import DECODE_OPTIONS


class TopologyError(RuntimeError):
    """The connected server cannot be captured (e.g. a standalone without an oplog)."""


@dataclass(frozen=True)
class Shard:
    id: str
    rs: str
    hosts: tuple[str, ...]
    # reached through the source connection as configured (a plain replica set), not its hosts
    via_source: bool = False
    # gone from the cluster: drain its oplog, then retire its offset
    retiring: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hosts"] = list(self.hosts)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Shard:
        return cls(
            id=data["id"],
            rs=data["rs"],
            hosts=tuple(data["hosts"]),
            via_source=data.get("via_source", False),
            retiring=data.get("retiring", False),
        )


def make_client(uri: str, options: dict | None = None) -> MongoClient:
    """A client whose documents decode the way ``extjson.encode`` expects (exact dates)."""
    settings = {"serverSelectionTimeoutMS": 10_000, **(options or {})}
    return MongoClient(uri, datetime_conversion=DECODE_OPTIONS.datetime_conversion, **settings)


def discover_shards(client: MongoClient) -> list[Shard]:
    """The replica sets to stream from, sorted by shard id (draining shards included: they hold data)."""
    hello = client.admin.command("hello")
    if hello.get("msg") == "isdbgrid":
        listed = client.admin.command("listShards")["shards"]
        return sorted((_shard_from_config(s) for s in listed), key=lambda s: s.id)
    if hello.get("configsvr"):
        return sorted((_shard_from_config(s) for s in client["config"]["shards"].find()), key=lambda s: s.id)
    if "setName" in hello:
        name = hello["setName"]
        return [Shard(id=name, rs=name, hosts=tuple(hello.get("hosts", ())), via_source=True)]
    raise TopologyError(
        "the MongoDB server is a standalone (no replica set, so no oplog to stream from); "
        "convert it to a one-member replica set (mongod --replSet rs0 + rs.initiate())"
    )


def _shard_from_config(entry: dict) -> Shard:
    # config.shards host looks like "rs1/h1:27018,h2:27018"
    rs, _, hosts = entry["host"].partition("/")
    return Shard(id=entry["_id"], rs=rs, hosts=tuple(hosts.split(",")))


def reconcile(
    previous: Iterable[Shard], live: Iterable[Shard], has_offset: Callable[[Shard], bool]
) -> list[Shard]:
    """Live shards plus those that left the cluster but still hold an offset (to be drained)."""
    live = list(live)
    live_ids = {shard.id for shard in live}
    gone = [replace(s, retiring=True) for s in previous if s.id not in live_ids and has_offset(s)]
    return sorted(live + gone, key=lambda s: s.id)


def topology_changed(stored: Iterable[Shard], live: Iterable[Shard]) -> bool:
    """Whether shards were added or removed since the topology was stored (host changes don't count)."""
    return {s.id for s in stored if not s.retiring} != {s.id for s in live}


def shard_uri(source_uri: str, shard: Shard) -> str:
    """The URI of one shard: its own hosts and set name, the source connection's credentials and options."""
    if shard.via_source:
        return source_uri
    parsed = uri_parser.parse_uri(source_uri)
    credentials = ""
    if parsed["username"]:
        credentials = f"{quote_plus(parsed['username'])}:{quote_plus(parsed['password'] or '')}@"
    options = {
        k: v for k, v in parsed["options"].items() if k.lower() not in ("replicaset", "directconnection")
    }
    query = "&".join(
        [f"replicaSet={quote_plus(shard.rs)}"] + [f"{k}={_uri_value(v)}" for k, v in options.items()]
    )
    return f"mongodb://{credentials}{','.join(shard.hosts)}/?{query}"


def _uri_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return quote_plus(str(value))


def shard_options(source_options: dict[str, Any], shard: Shard) -> dict[str, Any]:
    """Client keyword options for a shard: the source's, minus those naming the source's own set."""
    if shard.via_source:
        return dict(source_options)
    return {k: v for k, v in source_options.items() if k.lower() not in ("replicaset", "directconnection")}


@dataclass(frozen=True)
class OwnedRanges:
    """The shard-key ranges of one sharded collection that one shard owns (from config.chunks)."""

    key: tuple[tuple[str, Any], ...]
    ranges: tuple[tuple[dict, dict], ...]


def owned_ranges(cluster: MongoClient, shard_id: str, db: str, collection: str) -> OwnedRanges | None:
    """None for an unsharded collection; otherwise the chunks ``shard_id`` owns, in key order.

    A shard can hold orphaned documents (left behind by a migration, or not yet cleaned up) whose
    key range belongs to another shard: a per-shard snapshot reads only the owned ranges.
    """
    entry = cluster["config"]["collections"].find_one({"_id": f"{db}.{collection}", "dropped": {"$ne": True}})
    if entry is None:
        return None
    # config.chunks is keyed by collection uuid since MongoDB 5.0, by namespace before
    chunk_filter = {"uuid": entry["uuid"]} if "uuid" in entry else {"ns": f"{db}.{collection}"}
    chunks = cluster["config"]["chunks"].find({**chunk_filter, "shard": shard_id}).sort("min", 1)
    return OwnedRanges(key=tuple(entry["key"].items()), ranges=tuple((c["min"], c["max"]) for c in chunks))
