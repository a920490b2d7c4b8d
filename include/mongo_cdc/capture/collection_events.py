"""Collection-level change events: drop, rename, dropDatabase and invalidate.

* ``drop`` of a captured collection lands one raw row with op ``drop`` and no document (key
  ``{"id":null}``) in that collection's raw table, at the event's position. The transform
  deletes, at that position, every document of that replica set whose last event came before
  it; documents written after the drop (a re-created collection) stay.
* ``rename`` lands an op ``rename`` row in the old namespace (the same effect there as a drop;
  ``after`` holds the new namespace as a BSON document ``{db, coll}``) and, when the new
  namespace is captured, copies the renamed collection as snapshot reads at the rename's position
  (``land_renamed_copy``), then commits the rename with a snapshot manifest of the new namespace.
  The new namespace's state is then its documents as of the rename plus every later event, and
  documents of a collection the rename replaced (``dropTarget``) vanish by the manifest. A rename
  into a namespace that is not captured is a drop; one from a namespace that is not captured
  starts capturing the new one with its copy.

  The copy is read like a chunk of a snapshot (``chunk_reads``: the server's raw BSON replies of
  ``max.batch.size`` documents, never decoded) in ``_id`` order, and each reply lands as a batch of
  its own before the next is read, so a pull holds one reply whatever the collection's size. Those
  batches stay at the position before the rename and record the ``_id`` the copy reached
  (``Batch.renamed_copy``): a pull killed midway reads the rename again and goes on after it, so
  every document lands once. A collection whose ``_id`` index does not give the order (a default
  collation, clustered on ``_id``: ``chunking._id_index_ordered``) is copied whole in natural
  order, in the batch that commits the rename.
* ``dropDatabase`` follows the drops of each of its collections, which carry its effect.
* ``invalidate`` never reaches a deployment-wide stream (the only kind a pull opens), but if one
  does, the pull lands what it read before it and reopens with ``startAfter`` its token.
"""

from __future__ import annotations

import bson
import pyarrow as pa
from bson.codec_options import CodecOptions
from pymongo import MongoClient

from mongo_cdc.capture import chunk_reads
from mongo_cdc.capture.change_cursor import bson_bytes
from mongo_cdc.capture.chunk_reads import _elements, _int32
from mongo_cdc.capture.chunking import ID_INDEX, _id_index_ordered
from mongo_cdc.capture.field_filters import collection_field_rules
from mongo_cdc.capture.offsets import Offset, OffsetKeeper
from mongo_cdc.capture.raw_rows import RawRow, SourceInfo, event_position, now_ms, raw_row
from mongo_cdc.capture.raw_tables import raw_documents
from mongo_cdc.capture.snapshot_columns import SnapshotColumns
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake import COLLECTION_KEY, RAW_SCHEMA, RENAMED_COPY_ORDER
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.snapshot_log import Chunk


def collection_row(change: dict, source: SourceInfo) -> RawRow:
    """The raw row of a drop or rename, in the namespace the event names."""
    cluster_time, source_ts_ms = event_position(change)
    to = change.get("to")
    return RawRow(
        COLLECTION_KEY,
        change["operationType"],
        now_ms(),
        None,
        bson_bytes(to) if to is not None else None,
        None,
        source.values(change["ns"]["db"], change["ns"]["coll"], cluster_time, source_ts_ms, False),
        cluster_time,
        change["_id"]["_data"],
    )


def land_renamed_copy(
    client: MongoClient,
    config: SourceConfig,
    keeper: OffsetKeeper,
    source: SourceInfo,
    change: dict,
    offset: Offset,
) -> tuple[Offset, list[RawRow], int]:
    """Copy the collection ``change`` (a rename) names under its new name as snapshot reads at the
    rename's position: each server reply as a batch of its own, committed after ``offset`` (see the
    module's docstring), going on after the ``_id`` the last batch recorded if it copied this rename.

    Returns the offset after the batches landed, the rows left for the batch committing the rename
    (a collection copied whole in natural order) and the documents landed in batches of their own.
    """
    cluster_time, source_ts_ms = event_position(change)
    db, name = change["to"]["db"], change["to"]["coll"]
    found = next(client[db].list_collections(filter={"name": name}), None)
    ordered = _id_index_ordered((found or {}).get("options", {}))
    rename = change["_id"]["_data"]
    last = keeper.lake.last_batch(keeper.rs) if ordered else None
    progress = last.renamed_copy if last is not None and last.seq == offset.batch_seq else None
    reached = None
    if progress is not None and progress["rename"] == rename:
        reached = bytes.fromhex(progress["after"])  # a pull before this one copied up to here
    block = source.block(db, name, cluster_time, source_ts_ms, snapshot=True)
    fields = collection_field_rules(config, db, name)
    chunk = Chunk(f"{db}.{name}", 0, 1, ID_INDEX if ordered else None, reached)
    kept: list[pa.RecordBatch] = []
    landed = 0
    for reply in chunk_reads._raw_batches(client[db].get_collection(name), config.max_batch_size, chunk):
        if reached is not None and _id_bound(reply) == reached:
            reply = reply[_int32.unpack_from(reply)[0] :]  # cursor.min is inclusive: copied already
        reached = None
        if not reply:
            continue
        seq = offset.next_seq
        columns = SnapshotColumns(block, cluster_time, seq, fields, config.max_batch_size, RENAMED_COPY_ORDER)
        rows = list(columns.record_batches(reply))
        if not ordered:
            kept.extend(rows)
            continue
        landed += sum(batch.num_rows for batch in rows)
        keeper.lake.write_raw(keeper.rs, seq, chunk.namespace, pa.Table.from_batches(rows, RAW_SCHEMA))
        offset = keeper.commit_batch(
            offset,
            Batch(keeper.rs, seq, "stream", offset.resume_token, offset.cluster_time,
                  namespaces=(chunk.namespace,), open_transaction=offset.open_transaction,
                  renamed_copy={"rename": rename, "after": _id_bound(reply, last=True).hex()}),
        )  # fmt: skip
    copied = pa.Table.from_batches(kept, RAW_SCHEMA).to_pylist() if kept else []
    return offset, [raw_row(row) for row in copied], landed


def _id_bound(reply: bytes, last: bool = False) -> bytes:
    """The ``_id`` of the first (``last``: the last) document of a raw reply, as the BSON document
    ``{_id: <value>}`` (a ``cursor.min`` bound), cut from its bytes without decoding the document."""
    documents = raw_documents(reply)
    document = memoryview(documents[len(documents) - 1 if last else 0].as_py())
    for element_name, start, end in _elements(document, 0, len(document)):
        if element_name == b"_id":
            element = bytes(document[start - 5 : end])  # type byte, b"_id\0", value
            return _int32.pack(len(element) + 5) + element + b"\x00"
    # an _id of a type the walk does not know (or not first): decoded, the rest never looked at
    value = bson.decode(bytes(document), CodecOptions(unicode_decode_error_handler="surrogateescape"))["_id"]
    return bson.encode({"_id": value})


def rename_namespaces(change: dict, config: SourceConfig) -> tuple[str | None, str | None]:
    """The rename's old and new ``<db>.<collection>``, each None when it is not captured."""
    old, new = change["ns"], change["to"]
    return (
        f"{old['db']}.{old['coll']}" if config.captures_collection(old["db"], old["coll"]) else None,
        f"{new['db']}.{new['coll']}" if config.captures_collection(new["db"], new["coll"]) else None,
    )
