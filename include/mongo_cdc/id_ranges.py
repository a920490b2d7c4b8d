"""An ``_id`` range filter of a re-snapshot, ``{"_id": {"$gte": a, "$lt": b}}``: recognising one,
and which state rows (by their normalised key) it holds, in MongoDB's order.

A filtered re-snapshot only deletes state documents it can prove gone: those of the range it read
whole. The range is held as MongoDB's query holds it: a bound compares only with ``_id`` values of
its own canonical type (type bracketing: ``{"$gte": 5}`` holds numbers of every BSON numeric type
and never a string), and in the ``_id`` index's order (``verify.key_order``). Where that order is
unsure (a NaN key or bound), a row is left outside the range: a row kept by mistake is healed by a
verification, a row deleted by mistake would be lost.
"""

from __future__ import annotations

import functools
import operator as op
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from bson import MaxKey, MinKey, Regex, json_util
from bson.codec_options import DatetimeConversion

from mongo_cdc import extjson
from mongo_cdc.id_order import order_of_key, order_of_value

LOWER = ("$gt", "$gte")
UPPER = ("$lt", "$lte")
# Extended JSON read as BSON decodes: int64 and dates keep their types, dates of any year
JSON_OPTIONS = json_util.JSONOptions(
    json_mode=json_util.JSONMode.CANONICAL, datetime_conversion=DatetimeConversion.DATETIME_MS
)
_COMPARISONS = {"$gt": op.gt, "$gte": op.ge, "$lt": op.lt, "$lte": op.le}
# a number's order is (3, 0, _) for NaN, which MongoDB's comparisons of NaN do not follow
_NUMBER_RANK, _NAN_FLAG = 3, 0


def loads(text: str) -> Any:
    """Extended JSON text (canonical or relaxed) as BSON decodes it (``extjson.DECODE_OPTIONS`` types)."""
    return json_util.loads(text, json_options=JSON_OPTIONS)


@dataclass(frozen=True)
class IdRange:
    """The ``_id`` values between an optional lower and an optional upper bound, each inclusive or
    not (``operators``: the filter's, e.g. ``{"$gte": 5, "$lt": 10}``)."""

    operators: Mapping[str, Any]

    @property
    def text(self) -> str:
        """The filter, ``{"_id": {...}}``, as Extended JSON that ``of_text`` reads back exactly."""
        return extjson.encode_str({"_id": dict(self.operators)})

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of_text(text: str) -> IdRange:
        """The range whose ``text`` this is (cached: a transform asks for every stored row)."""
        found = id_range_of(loads(text))
        if found is None:
            raise ValueError(f"not an _id range filter: {text}")
        return found

    @functools.cached_property
    def _bounds(self) -> tuple[tuple[str, tuple], ...]:
        return tuple((operator, order_of_value(value)) for operator, value in self.operators.items())

    def holds(self, key: str) -> bool:
        """Whether the document of normalised ``_id`` key ``key`` (``transform.keys``) is in the range."""
        order = order_of_key(key)
        if order[0] == _NUMBER_RANK and order[1] == _NAN_FLAG:
            return False
        for operator, bound in self._bounds:
            if order[0] != bound[0]:  # type bracketing
                return False
            if not _COMPARISONS[operator](order, bound):
                return False
        return True

    def holds_keys(self, keys: pa.Array | pa.ChunkedArray) -> pa.Array:
        """``holds`` of each key, as a boolean column."""
        return pa.array([self.holds(key) for key in keys.to_pylist()], pa.bool_())


def id_range_of(query: Mapping[str, Any]) -> IdRange | None:
    """The range of a filter that is exactly ``{"_id": {<$gt|$gte>: a, <$lt|$lte>: b}}`` (either
    bound optional), None for any other filter. A bound MongoDB does not order like the ``_id``
    index (MinKey, MaxKey, null, a regex, an array, NaN) makes a filter no range."""
    if list(query) != ["_id"] or not isinstance(query["_id"], Mapping) or not query["_id"]:
        return None
    operators = dict(query["_id"])
    if not set(operators) <= set(LOWER + UPPER):
        return None
    if sum(name in LOWER for name in operators) > 1 or sum(name in UPPER for name in operators) > 1:
        return None
    for value in operators.values():
        if value is None or isinstance(value, (MinKey, MaxKey, Regex, list)):
            return None
        if isinstance(value, Mapping) and any(str(name).startswith("$") for name in value):
            return None  # an operator, or Extended JSON that did not parse as a value
        order = order_of_value(value)
        if order[0] == _NUMBER_RANK and order[1] == _NAN_FLAG:
            return None
    return IdRange(operators)
