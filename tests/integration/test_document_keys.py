"""Normalised ``_id`` keys (mongo_cdc.transform.keys): equal exactly when MongoDB's ``_id`` index
takes two values for one document. The real mongod is the ground truth."""

from __future__ import annotations

import pymongo.errors
import pytest
from bson import Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.datetime_ms import DatetimeMS

from mongo_cdc.transform.keys import document_key
from mongo_cdc_dev.testing import ReplicaSet

OID = ObjectId("65a1b2c3d4e5f60718293a4b")

SAME = [
    (1, Int64(1)),
    (1, 1.0),
    (1, Decimal128("1")),
    (Int64(1), Decimal128("1.000")),
    (10, Decimal128("1E+1")),
    (0, -0.0),
    (0, Decimal128("-0.00")),
    (0.5, Decimal128("0.50")),
    (-2.25, Decimal128("-2.250")),
    (float("nan"), Decimal128("NaN")),
    (float("nan"), Decimal128("-NaN")),
    (float("inf"), Decimal128("Infinity")),
    (float("-inf"), Decimal128("-Infinity")),
    (Int64(2**62), float(2**62)),
    (Int64(2**63 - 1), Decimal128("9223372036854775807")),
    ({"a": 1}, {"a": Int64(1)}),
    ({"a": {"b": [1, 2.0]}}, {"a": {"b": [Int64(1), Decimal128("2")]}}),
]

DIFFERENT = [
    (1, "1"),
    (1, True),
    (0, False),
    (0, None),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # field order matters
    (0.1, Decimal128("0.1")),  # the double is 0.1000000000000000055511151231257827...
    (Int64(2**53 + 1), float(2**53)),
    (Int64(2**63 - 1), float(2**63)),
    ("a", "A"),
    ("a", "a "),
    (b"x", Binary(b"x", 5)),  # same bytes, another subtype
    (b"x", "x"),
    (OID, str(OID)),
    (DatetimeMS(0), 0),
    (DatetimeMS(0), Timestamp(0, 0)),
    (Timestamp(1, 2), Timestamp(1, 3)),
    (MinKey(), MaxKey()),
    ({"a": None}, {}),
    ({"a": []}, {"a": None}),
    ({"a": [1]}, {"a": 1}),
    ({"a": {"b": 1}}, {"a.b": 1}),
]


@pytest.mark.parametrize(("left", "right"), SAME)
def test_values_mongodb_takes_for_one_id_have_one_key(left, right):
    assert document_key(left) == document_key(right)


@pytest.mark.parametrize(("left", "right"), DIFFERENT)
def test_values_mongodb_tells_apart_have_different_keys(left, right):
    assert document_key(left) != document_key(right)


def test_keys_are_tagged_compact_json():
    assert document_key(OID) == f'["oid","{OID}"]'
    assert document_key(Int64(-12)) == '["n","-12"]'
    assert document_key(Decimal128("1E+50")) == '["n","1E50"]'
    assert document_key(Decimal128("-0.0500")) == '["n","-5E-2"]'
    assert document_key(float("-inf")) == '["n","-Infinity"]'
    assert document_key("x") == '["s","x"]'
    assert document_key({"k": [True, None]}) == '["o",[["k",["a",[["b",true],["null"]]]]]]'
    assert document_key(Binary(b"\x00", 4)) == '["bin",4,"AA=="]'
    assert document_key(DatetimeMS(-1)) == '["date",-1]'
    # kinds an _id cannot be at the top level still have keys when nested in a document
    assert document_key(Regex("^a", "mi")) == '["re","^a","im"]'
    assert document_key(Code("f()", {"x": 1})) == '["code","f()",["o",[["x",["n","1"]]]]]'
    assert document_key(Timestamp(5, 6)) == '["ts",5,6]'


def test_a_string_that_looks_like_a_key_is_still_a_string():
    assert document_key('["n","1"]') != document_key(1)
    assert document_key({"$numberLong": "1"}) != document_key(Int64(1))


def test_mongodb_agrees_on_which_ids_are_one_document(replica_set: ReplicaSet, db_name):
    """Insert both values as _id into one collection: a duplicate key error means MongoDB takes
    them for one document, and then (only then) their keys must be equal."""
    collection = replica_set.client()[db_name]["ids"]
    for left, right in SAME + [pair for pair in DIFFERENT if not isinstance(pair[0], (MinKey, Timestamp))]:
        collection.delete_many({})
        collection.insert_one({"_id": left})
        try:
            collection.insert_one({"_id": right})
            duplicate = False
        except pymongo.errors.DuplicateKeyError:
            duplicate = True
        assert duplicate == (document_key(left) == document_key(right)), (left, right)
    for left, right in [(Timestamp(1, 2), Timestamp(1, 3)), (MinKey(), MaxKey())]:
        collection.delete_many({})
        collection.insert_many([{"_id": left}, {"_id": right}])  # distinct: both inserted
