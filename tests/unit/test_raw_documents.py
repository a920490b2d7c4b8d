"""``raw_tables.raw_documents``: a raw batch cut into its documents exactly, in bulk where every document
starts with its ``_id`` and holds no other ``_id`` field, one by one otherwise."""

from __future__ import annotations

import bson
import pytest
from bson import ObjectId
from bson.errors import InvalidBSON
from hypothesis import given, settings
from hypothesis import strategies as st

from mongo_cdc.capture.raw_tables import _leading_id_starts, raw_documents

ids = st.one_of(st.integers(-(2**31), 2**31 - 1), st.text(max_size=5), st.builds(ObjectId))
values = st.one_of(st.integers(0, 9), st.sampled_from(["_id", "x"]), st.builds(dict, _id=ids))
documents = st.builds(
    lambda _id, fields: bson.encode({"_id": _id, **fields}),
    ids,
    st.dictionaries(st.sampled_from(["a", "b", "_idx"]), values, max_size=3),
)


def _without_leading_id() -> bytes:
    """A document whose ``_id`` is its second field (MongoDB moves it first; bson.encode does too)."""
    return bson.encode({"a": 1, "zid": 2}).replace(b"zid\x00", b"_id\x00")


@settings(max_examples=150)
@given(st.lists(documents, min_size=1, max_size=20), st.booleans())
def test_a_batch_is_cut_into_exactly_its_documents(batch, unusual_first):
    if unusual_first:
        batch = [_without_leading_id(), *batch]
    assert raw_documents(b"".join(batch)).to_pylist() == batch


def test_plain_documents_are_cut_in_bulk_and_nested_ids_one_by_one():
    plain = [bson.encode({"_id": ObjectId(), "n": n, "name": "_i"}) for n in range(50)]
    assert _leading_id_starts(b"".join(plain)) is not None
    nested = [*plain, bson.encode({"_id": 1, "sub": {"_id": 2}}), *plain]
    assert _leading_id_starts(b"".join(nested)) is None  # not first, so the whole batch is checked
    assert raw_documents(b"".join(nested)).to_pylist() == nested


def test_a_cut_short_batch_is_refused():
    batch = b"".join(bson.encode({"_id": n}) for n in range(10))
    with pytest.raises(InvalidBSON, match="bad document length"):
        raw_documents(batch[:-3])
