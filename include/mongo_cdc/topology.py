"""Which replica sets make up a source: a replica set is one shard named by its set name."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pymongo import MongoClient

from mongo_cdc.extjson import DECODE_OPTIONS


class TopologyError(RuntimeError):
    """The connected server cannot be captured (e.g. a standalone without an oplog)."""


@dataclass(frozen=True)
class Shard:
    id: str
    rs: str
    hosts: tuple[str, ...]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["hosts"] = list(self.hosts)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Shard:
        return cls(id=data["id"], rs=data["rs"], hosts=tuple(data["hosts"]))


def make_client(uri: str, options: dict | None = None) -> MongoClient:
    """A client whose documents decode the way ``extjson.encode`` expects (exact dates)."""
    return MongoClient(
        uri,
        datetime_conversion=DECODE_OPTIONS.datetime_conversion,
        serverSelectionTimeoutMS=10_000,
        **(options or {}),
    )


def discover_shards(client: MongoClient) -> list[Shard]:
    """The replica sets to stream from, sorted by shard id."""
    hello = client.admin.command("hello")
    if hello.get("msg") == "isdbgrid":
        listed = client.admin.command("listShards")["shards"]
        return sorted((_shard_from_config(s) for s in listed), key=lambda s: s.id)
    if hello.get("configsvr"):
        listed = client["config"]["shards"].find({"draining": {"$ne": True}})
        return sorted((_shard_from_config(s) for s in listed), key=lambda s: s.id)
    if "setName" in hello:
        return [Shard(id=hello["setName"], rs=hello["setName"], hosts=tuple(hello.get("hosts", ())))]
    raise TopologyError(
        "the MongoDB server is a standalone (no replica set, so no oplog to stream from); "
        "convert it to a one-member replica set (mongod --replSet rs0 + rs.initiate())"
    )


def _shard_from_config(entry: dict) -> Shard:
    # config.shards host looks like "rs1/h1:27018,h2:27018"
    rs, _, hosts = entry["host"].partition("/")
    return Shard(id=entry["_id"], rs=rs, hosts=tuple(hosts.split(",")))
