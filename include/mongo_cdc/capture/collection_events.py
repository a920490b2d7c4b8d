"""Collection-level change events: drop, rename, dropDatabase and invalidate.

* ``drop`` of a captured collection lands one raw row with op ``drop`` and no document (key
  ``{"id":null}``) in that collection's raw table, at the event's position. The transform
  deletes, at that position, every document of that replica set whose last event came before
  it; documents written after the drop (a re-created collection) stay.
* ``rename`` lands an op ``rename`` row in the old namespace (the same effect there as a drop;
  ``after`` holds the new namespace as a BSON document ``{db, coll}``) and, when the new
  namespace is captured, copies the renamed
  collection as snapshot reads at the rename's position, with a snapshot manifest, all in the
  batch that commits the rename. The new namespace's state is then its documents as of the rename
  plus every later event, and documents of a collection the rename replaced (``dropTarget``)
  vanish by the manifest. A rename into a namespace that is not captured is a drop; one from a
  namespace that is not captured starts capturing the new one with its copy.
* ``dropDatabase`` follows the drops of each of its collections, which carry its effect.
* ``invalidate`` never reaches a deployment-wide stream (the only kind a pull opens), but if one
  does, the pull lands what it read before it and reopens with ``startAfter`` its token.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from bson.raw_bson import DEFAULT_RAW_BSON_OPTIONS
from pymongo import MongoClient

from mongo_cdc.capture.events import SourceInfo, bson_bytes, document_keys, event_position, now_ms
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake import COLLECTION_KEY, RENAMED_COPY_ORDER


def collection_row(change: dict, source: SourceInfo) -> dict[str, Any]:
    """The raw row of a drop or rename, in the namespace the event names."""
    cluster_time, source_ts_ms = event_position(change)
    to = change.get("to")
    return {
        "key": COLLECTION_KEY,
        "op": change["operationType"],
        "ts_ms": now_ms(),
        "before": None,
        "after": bson_bytes(to) if to is not None else None,
        "updateDescription": None,
        "source": source.block(change["ns"]["db"], change["ns"]["coll"], cluster_time, source_ts_ms, False),
        "cluster_time": cluster_time,
        "event_order": change["_id"]["_data"],
    }


def renamed_collection_reads(
    client: MongoClient, change: dict, config: SourceConfig, source: SourceInfo
) -> list[dict[str, Any]]:
    """Snapshot reads of a renamed collection under its new name, positioned at the rename.

    Read after the rename, so a document may already show later writes; those writes' events
    come after the rename in the stream and fold over these reads, as after any snapshot.
    """
    cluster_time, source_ts_ms = event_position(change)
    db, collection = change["to"]["db"], change["to"]["coll"]
    block = source.block(db, collection, cluster_time, source_ts_ms, snapshot=True)
    processed = now_ms()
    found = client[db].get_collection(collection, codec_options=DEFAULT_RAW_BSON_OPTIONS).find()
    documents = [document.raw for document in found]  # the server's bytes
    keys = document_keys(pa.array(documents, pa.binary())).to_pylist()
    fields = config.field_filters.for_collection(db, collection)
    if fields is not None:
        documents = [fields.document(document) for document in documents]
    return [
        {
            "key": key,
            "op": "r",
            "ts_ms": processed,
            "before": None,
            "after": document,
            "updateDescription": None,
            "source": block,
            "cluster_time": cluster_time,
            "event_order": RENAMED_COPY_ORDER,
        }
        for key, document in zip(keys, documents, strict=True)
    ]


def rename_namespaces(change: dict, config: SourceConfig) -> tuple[str | None, str | None]:
    """The rename's old and new ``<db>.<collection>``, each None when it is not captured."""
    old, new = change["ns"], change["to"]
    return (
        f"{old['db']}.{old['coll']}" if config.captures_collection(old["db"], old["coll"]) else None,
        f"{new['db']}.{new['coll']}" if config.captures_collection(new["db"], new["coll"]) else None,
    )
