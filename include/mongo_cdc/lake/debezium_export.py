"""Render raw events as Debezium change-event records (JSON Lines) for existing Debezium consumers.

Each line is ``{"key": {"id": "<EJSON of _id>"}, "value": <payload>}`` where the payload has
Debezium's shape: ``before`` (with a pre-image ``capture.mode``), ``after`` (EJSON strings
rendered from the raw zone's BSON),
``updateDescription``, ``source``, ``op``, ``ts_ms``/``ts_us``/``ts_ns``, ``transaction``; a
tombstone's value is ``null``, as on a Kafka topic. Drops and renames have no record (Debezium
emits none). ``--transactions`` exports the BEGIN/END records instead
(``provide.transaction.metadata``), each
``{"key": {"id": <transaction id>}, "value": {status, id, event_count, data_collections, ts_ms}}``.

    python -m mongo_cdc.lake.debezium_export --lake-root LAKE --topic-prefix P --collection db.coll \
        [--output F]
    python -m mongo_cdc.lake.debezium_export --lake-root LAKE --topic-prefix P --transactions [--output F]

``LAKE`` is a local path (a relative one is the working directory's) or an object-store URI. Asking
for a collection the lake has no raw table of exits with status 1, naming the collections it has.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

import pyarrow.compute as pc

from mongo_cdc import extjson
from mongo_cdc.lake import COLLECTION_OPERATIONS, TRANSACTION_DIR
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation, LakeRootError, resolve_root, table_if_exists
from mongo_cdc.lake.table_reads import Where, read_rows
from mongo_cdc.namespace import Namespace


def debezium_record(row: dict[str, Any]) -> dict[str, Any]:
    """One raw row (``lake.RAW_SCHEMA``) as a Debezium key/value record."""
    key = json.loads(row["key"])
    if row["op"] is None:
        return {"key": key, "value": None}
    description = row["updateDescription"]
    if description is not None:
        description = {**description, "updatedFields": extjson.from_bson(description["updatedFields"])}
    return {
        "key": key,
        "value": {
            "before": extjson.from_bson(row["before"]) if row["before"] is not None else None,
            "after": extjson.from_bson(row["after"]) if row["after"] is not None else None,
            "updateDescription": description,
            "source": row["source"],
            "op": row["op"],
            "ts_ms": row["ts_ms"],
            # processing time is kept in ms: the finer units Debezium 2 adds carry the same instant
            "ts_us": row["ts_ms"] * 1000,
            "ts_ns": row["ts_ms"] * 1_000_000,
            "transaction": row["transaction"],
        },
    }


def transaction_records(source_lake: SourceLake) -> list[dict[str, Any]]:
    """Every committed BEGIN/END record as a Debezium transaction-topic record, in oplog order
    (BEGIN first)."""
    table = table_if_exists(source_lake.source_uri(TRANSACTION_DIR), source_lake.options)
    if table is None:
        return []
    keep = pc.scalar(False)
    for rs, seq in source_lake.committed().items():
        keep = keep | ((pc.field("rs") == rs) & (pc.field("batch_seq") <= seq))
    rows = read_rows(table, where=Where(keep, ("rs", "batch_seq"))).to_pylist()
    rows.sort(key=lambda r: (r["cluster_time"], r["status"] != "BEGIN"))
    fields = ("status", "id", "event_count", "data_collections", "ts_ms")
    return [{"key": {"id": row["id"]}, "value": {name: row[name] for name in fields}} for row in rows]


def raw_rows(source_lake: SourceLake, namespace: str) -> list[dict]:
    """A collection's committed raw events in oplog order (a tombstone right after its delete)."""
    rows = source_lake.committed_raw(namespace).to_pylist()
    return sorted(rows, key=lambda r: (r["cluster_time"], r["event_order"], r["op"] is None))


def write_json_lines(records: Iterable[dict[str, Any]], out: TextIO) -> int:
    count = 0
    for record in records:
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
        count += 1
    return count


def records(source_lake: SourceLake, namespace: str) -> Iterator[dict[str, Any]]:
    """Debezium's records of a collection; drops and renames have none (Debezium emits no event)."""
    return (
        debezium_record(row)
        for row in raw_rows(source_lake, namespace)
        if row["op"] not in COLLECTION_OPERATIONS
    )


# the known collections an error lists, at most (a source may capture thousands)
_LISTED_COLLECTIONS = 20


def unknown_collection(source_lake: SourceLake, namespace: str) -> str | None:
    """Why ``namespace`` cannot be exported (the lake has no raw table of it), naming the collections
    it has; None when it can (its raw table exists, even if no committed batch has its rows yet)."""
    if table_if_exists(source_lake.raw_uri(namespace), source_lake.options) is not None:
        return None
    where = f"the lake at {source_lake.location.root} under topic prefix {source_lake.prefix!r}"
    known = source_lake.namespaces()
    if not known:
        return (
            f"no collection {namespace!r} in {where}, which has no committed batch: check --lake-root "
            "and --topic-prefix (the source's lake.root and topic.prefix)"
        )
    listed = ", ".join(known[:_LISTED_COLLECTIONS])
    if len(known) > _LISTED_COLLECTIONS:
        listed += f" and {len(known) - _LISTED_COLLECTIONS} more"
    return f"no collection {namespace!r} in {where}; its collections: {listed}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake-root", required=True)
    parser.add_argument("--topic-prefix", required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--collection", help="db.collection")
    what.add_argument("--transactions", action="store_true", help="the transaction BEGIN/END records")
    parser.add_argument("--output", help="file to write (default: standard output)")
    args = parser.parse_args(argv)
    try:  # a relative local path is the working directory's; a URI is as given
        root = resolve_root(args.lake_root, os.getcwd())
    except LakeRootError as error:
        parser.error(str(error))
    # object-store credentials come from the environment (see storage.LakeLocation.from_env)
    source_lake = SourceLake(LakeLocation.from_env(root), args.topic_prefix)
    if args.transactions:
        lines: Iterable[dict[str, Any]] = transaction_records(source_lake)
    else:
        if not Namespace.parse(args.collection).collection:
            parser.error(f"--collection must be db.collection, got {args.collection!r}")
        problem = unknown_collection(source_lake, args.collection)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        lines = records(source_lake, args.collection)
    if args.output:
        try:
            out = open(args.output, "w", encoding="utf-8")
        except OSError as error:
            print(f"error: cannot write --output {args.output}: {error.strerror}", file=sys.stderr)
            return 1
        with out:
            count = write_json_lines(lines, out)
    else:
        count = write_json_lines(lines, sys.stdout)
    print(f"{count} records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
