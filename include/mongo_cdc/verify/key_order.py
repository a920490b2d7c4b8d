"""MongoDB's order of ``_id`` values, from their normalised keys: which ``_id`` range a state row is in.

A verification reads the source by ``_id`` ranges (the snapshot's chunks: ``cursor.min``/``max`` on
the ``_id`` index) and must put each state row in the range the index puts its document in. The
state holds the normalised key (``transform.keys``), whose tagged values keep everything the order
needs, so a row is placed without decoding its document.

The order is the index's (the simple collation): MinKey < null < numbers (by value across int,
long, double and decimal; NaN first) < strings (UTF-8 bytes) < documents (field by field: the
value's type, the name, the value; a prefix first) < arrays < binary (length, subtype, bytes) <
ObjectId < bool < date < timestamp < regex < code < code with scope < MaxKey.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import bson
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc.capture.chunking import ID_INDEX
from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.id_order import TYPE_RANK, order_of_key, order_of_value
from mongo_cdc.lake.snapshot_log import Chunk

_OBJECT_ID_HEAD = '["oid","'
_OBJECT_ID_RANK = TYPE_RANK["oid"]
# below every value (an open low bound) and above every one (an open high bound)
_LOWEST: tuple = ((0,),)
_HIGHEST: tuple = ((1000,),)


def _bound_order(bound: bytes | None, open_end: tuple) -> tuple:
    if bound is None:
        return open_end
    return tuple(order_of_value(value) for value in bson.decode(bound, DECODE_OPTIONS).values())


def _field(document: dict, path: str) -> Any:
    """A (dotted) field of a decoded document; None where it is missing, as shard keys take it."""
    value: Any = document
    for name in path.split("."):
        value = value.get(name) if isinstance(value, dict) else None
    return value


def _object_id_digits(keys: pa.StringArray) -> np.ndarray:
    """The hex digits of ObjectId keys (``["oid","<24 digits>"]``) as an array of ``S24``, cut from
    the keys' bytes in bulk (no Python object per key)."""
    offsets = keys.buffers()[1]
    wide = pa.types.is_large_string(keys.type)
    starts = np.frombuffer(offsets, np.int64 if wide else np.int32)[keys.offset : keys.offset + len(keys)]
    data = np.frombuffer(keys.buffers()[2], np.uint8)
    digits = data[
        starts.astype(np.int64)[:, None] + np.arange(len(_OBJECT_ID_HEAD), len(_OBJECT_ID_HEAD) + 24)
    ]
    return digits.view("S24").ravel()


class RangeFinder:
    """Which of a collection's ranges (its chunks, in index order: consecutive ``_id`` ranges from
    MinKey to MaxKey, or the shard-key ranges one shard owns, with gaps) holds a state row.

    Rows are placed by their normalised key when the ranges are on ``_id`` (ObjectIds in bulk, by
    their hex digits), otherwise by their document's shard-key fields (decoded one by one)."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self._key = chunks[0].key if chunks else None
        self._lows = [_bound_order(chunk.low, _LOWEST) for chunk in chunks]
        self._highs = [_bound_order(chunk.high, _HIGHEST) for chunk in chunks]
        if any(low >= high for low, high in zip(self._lows, self._highs, strict=True)) or any(
            high > low for high, low in zip(self._highs, self._lows[1:], strict=False)
        ):
            raise ValueError("ranges must be consecutive, non-overlapping key ranges in index order")
        self._by_id = self._key in (None, ID_INDEX)

    def index(self, key: str, document: bytes | None = None) -> int | None:
        """The index of the range holding the row (lower bound inclusive, upper bound exclusive);
        None when no range does (another shard's)."""
        if not self._lows:
            return None
        if self._key is None:  # one range: the whole collection
            return 0
        if self._by_id:
            order: tuple = (order_of_key(key),)
        else:
            decoded = bson.decode(document, DECODE_OPTIONS)
            order = tuple(order_of_value(_field(decoded, name)) for name, _ in self._key)
        found = bisect.bisect_right(self._lows, order) - 1
        return found if found >= 0 and order < self._highs[found] else None

    def indexes(self, keys: pa.StringArray, documents: pa.BinaryArray) -> np.ndarray:
        """``index`` of each row, -1 for None: in bulk where every key is an ObjectId ``_id``."""
        if self._key is None or not self._lows:
            return np.full(len(keys), 0 if self._lows else -1, np.int64)
        if self._by_id and len(keys) and pc.all(pc.starts_with(keys, _OBJECT_ID_HEAD)).as_py():
            hex_ids = _object_id_digits(keys)
            found = self._count_up_to(self._lows, hex_ids) - 1
            below_high = self._count_up_to(self._highs, hex_ids) <= found
            return np.where((found >= 0) & below_high, found, -1)
        return np.array(
            [
                -1 if found is None else found
                for found in map(self.index, keys.to_pylist(), documents.to_pylist())
            ],
            np.int64,
        )

    @staticmethod
    def _count_up_to(bounds: list[tuple], hex_ids: np.ndarray) -> np.ndarray:
        """How many of the sorted ``bounds`` are at most each ObjectId (``bisect_right`` in bulk)."""
        below = bisect.bisect_left(bounds, ((_OBJECT_ID_RANK,),))
        object_ids = [bound[0][1] for bound in bounds if bound[0][0] == _OBJECT_ID_RANK]
        return below + np.searchsorted(np.array(object_ids, "S24"), hex_ids, side="right")
