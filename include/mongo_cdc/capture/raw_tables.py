"""Raw rows and raw documents as Arrow: a batch's table of ``lake.RAW_SCHEMA``, built column by
column from its rows (``raw_rows``), and a server batch's documents cut into a binary array over
the same bytes, keyed without decoding them (``document_ids``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from bson.errors import InvalidBSON

from mongo_cdc import extjson
from mongo_cdc.capture.document_ids import ID_ELEMENT_NAME, document_id, document_keys, unpack_int32
from mongo_cdc.capture.field_filters import CollectionFieldRules
from mongo_cdc.capture.raw_rows import SOURCE_NAMES, RawRow, raw_row
from mongo_cdc.lake import RAW_SCHEMA, SOURCE_TYPE, TRANSACTION_TYPE, UPDATE_DESCRIPTION_TYPE, hour_partition


def rows_to_table(rows: list[dict[str, Any]], seq: int) -> pa.Table:
    """Raw rows given as dicts (``raw_row``) as a table of batch ``seq``."""
    return raw_rows_table([raw_row(row) for row in rows], seq)


def raw_rows_table(rows: list[RawRow], seq: int) -> pa.Table:
    """Raw rows as a table of batch ``seq`` (``lake.HISTORY_SEQ`` for backfilled history), built
    column by column from the rows' columns (``zip``), the ``source`` struct from its fields'."""
    count = len(rows)
    keys, ops, ts_ms, befores, afters, descriptions, sources, cluster_times, orders, transactions = (
        zip(*rows, strict=True) if rows else ((),) * len(RawRow._fields)
    )
    columns = [
        _key_column(keys),
        pa.array(ops, pa.string()),
        pa.array(ts_ms, pa.int64()),
        pa.array(befores, pa.binary()),
        pa.array(afters, pa.binary()),
        _struct_column(descriptions, UPDATE_DESCRIPTION_TYPE),
        _source_column(sources),
        pa.array(cluster_times, pa.int64()),
        pa.array(orders, pa.string()),
        _struct_column(transactions, TRANSACTION_TYPE),
        pa.repeat(pa.scalar(seq, pa.int64()), count),
        pa.array([hour_partition(cluster_time) for cluster_time in cluster_times], pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=RAW_SCHEMA)


def _key_column(keys: tuple[str | bytes, ...]) -> pa.Array:
    """The ``key`` column: key payloads as they are, documentKeys' BSON keyed (``document_keys``),
    in bulk when they all are."""
    if all(isinstance(key, bytes) for key in keys) and keys:
        return document_keys(pa.array(keys, pa.binary()))
    key = extjson.document_key
    return pa.array([raw if isinstance(raw, str) else key(document_id(raw)) for raw in keys], pa.string())


def _struct_column(values: tuple[dict[str, Any] | None, ...], arrow_type: pa.StructType) -> pa.Array:
    if all(value is None for value in values):
        return pa.nulls(len(values), arrow_type)
    return pa.array(values, arrow_type)


def _source_column(sources: tuple[tuple[Any, ...] | None, ...]) -> pa.Array:
    """The ``source`` struct from each field's values (converting it row by row dominated a pull's CPU)."""
    if any(source is None for source in sources):
        blocks = [dict(zip(SOURCE_NAMES, source, strict=True)) if source else None for source in sources]
        return pa.array(blocks, SOURCE_TYPE)
    fields = zip(*sources, strict=True) if sources else ((),) * len(SOURCE_NAMES)
    children = [pa.array(values, field.type) for values, field in zip(fields, SOURCE_TYPE, strict=True)]
    return pa.StructArray.from_arrays(children, fields=list(SOURCE_TYPE))


def raw_documents(batch: bytes) -> pa.BinaryArray:
    """The BSON documents concatenated in ``batch`` as a binary array over the same bytes (no copy)."""
    starts = _leading_id_starts(batch)
    offsets = pa.array(_walked_starts(batch) if starts is None else starts, pa.int32())
    return pa.BinaryArray.from_buffers(
        pa.binary(), len(offsets) - 1, [None, offsets.buffers()[1], pa.py_buffer(batch)]
    )


def _walked_starts(batch: bytes) -> list[int]:
    """The documents' offsets in ``batch`` and its end, one document's size after another."""
    offsets, pos, end = [0], 0, len(batch)
    add = offsets.append
    while pos + 4 <= end:
        size = unpack_int32(batch, pos)[0]
        if size < 5:
            break
        pos += size
        add(pos)
    if pos != end:
        raise InvalidBSON(f"bad document length at byte {offsets[-1]} of a batch of {end} bytes")
    return offsets


def _leading_id_starts(batch: bytes) -> np.ndarray | None:
    """``_walked_starts`` in bulk (a Python step per document cost 0.17 s per million) where every
    document starts with an ``_id`` element, as MongoDB stores them, and holds no other field named
    ``_id``: the positions 5 bytes before an ``_id`` name are then the starts, each the end of the one
    before. None (walked one by one) where not: most such batches are told by their first document."""
    end = len(batch)
    name = ID_ELEMENT_NAME
    if end < 9 or batch[5:9] != name or batch.find(name, 9, unpack_int32(batch, 0)[0]) != -1:
        return None
    data = np.frombuffer(batch, np.uint8)
    starts = np.flatnonzero(data[5 : end - 3] == name[0])  # a bytes' item is an int
    for at in range(1, len(name)):
        starts = starts[data[starts + 5 + at] == name[at]]
    sizes = data[starts[:, None] + np.arange(4)].view("<i4").ravel()
    ends = starts + sizes
    if (sizes < 5).any() or ends[-1] != end or (ends[:-1] != starts[1:]).any():
        return None
    return np.append(starts, end)


def keys_and_documents(
    documents: pa.BinaryArray, fields: CollectionFieldRules | None = None
) -> tuple[pa.Array, pa.Array]:
    """The raw ``key`` and ``after`` columns of documents read from a collection: their own bytes,
    or rewritten by the collection's field rules (``field.exclude.list``, ``field.renames``)."""
    keys = document_keys(documents)  # rules never change _id
    if fields is None:
        return keys, documents
    # per-document work only when the collection has rules
    return keys, pa.array([fields.document(document) for document in documents.to_pylist()], pa.binary())
