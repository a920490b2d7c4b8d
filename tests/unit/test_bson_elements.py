"""mongo_cdc.bson_elements: documents read and rebuilt by elements, every byte kept.

Random documents of every BSON type: where pymongo's bson round-trips a type, its own encoding
is the reference; the deprecated types (Symbol, DBPointer, Undefined), NaN payloads,
non-canonical decimals and the like are built here byte by byte, since bson would change them.
"""

from __future__ import annotations

import struct

import bson
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from bson_by_hand import (
    DBPOINTER,
    NAMES,
    SYMBOL,
    VALUES,
    array,
    binary,
    code_with_scope,
    cstring,
    document,
    embedded,
    int32,
    round_trips,
    string,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mongo_cdc.bson_elements import (
    ARRAY,
    DOCUMENT,
    Container,
    DamagedBson,
    array_index,
    document_bytes,
    element_bytes,
)

EXAMPLES = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

names = st.one_of(
    st.sampled_from([name.encode() for name in NAMES] + [b"$banana", b"$", b"_id", b"0", b"00"]),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8).map(str.encode),
)


# -- random documents, built by hand ----------------------------------------------------------

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
keys = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
scalars = st.one_of(
    st.floats(allow_nan=True).map(lambda f: (0x01, struct.pack("<d", f))),
    # NaN with a payload (and either sign): bits a float may not keep through every encoder
    st.integers(1, 2**52 - 1).flatmap(
        lambda payload: st.sampled_from([0x7FF0 << 48, 0xFFF0 << 48]).map(
            lambda head: (0x01, struct.pack("<Q", head | payload))
        )
    ),
    texts.map(lambda t: (0x02, string(t.encode()))),
    st.tuples(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0xFF]), st.binary(max_size=20)).map(
        lambda args: binary(*args)
    ),
    st.just((0x06, b"")),  # undefined
    st.binary(min_size=12, max_size=12).map(lambda b: (0x07, b)),
    st.sampled_from([(0x08, b"\x00"), (0x08, b"\x01")]),
    st.integers(-(2**63), 2**63 - 1).map(lambda n: (0x09, struct.pack("<q", n))),
    st.just((0x0A, b"")),
    st.tuples(texts, st.sampled_from(["", "i", "imsx"])).map(lambda r: (0x0B, cstring(r[0]) + cstring(r[1]))),
    st.tuples(texts, st.binary(min_size=12, max_size=12)).map(
        lambda p: (0x0C, string(p[0].encode()) + p[1])  # DBPointer
    ),
    texts.map(lambda t: (0x0D, string(t.encode()))),  # code
    texts.map(lambda t: (0x0E, string(t.encode()))),  # symbol
    st.integers(-(2**31), 2**31 - 1).map(lambda n: (0x10, int32(n))),
    st.binary(min_size=8, max_size=8).map(lambda b: (0x11, b)),  # timestamp
    st.integers(-(2**63), 2**63 - 1).map(lambda n: (0x12, struct.pack("<q", n))),
    st.binary(min_size=16, max_size=16).map(lambda b: (0x13, b)),  # any bits: non-canonical too
    st.sampled_from([(0xFF, b""), (0x7F, b"")]),  # MinKey, MaxKey
)


values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(st.tuples(names, inner), max_size=5).map(lambda e: (DOCUMENT, document(e))),
        st.lists(inner, max_size=5).map(array),
        st.tuples(texts, st.lists(st.tuples(names, inner), max_size=3)).map(lambda c: code_with_scope(*c)),
    ),
    max_leaves=10,
)
documents = st.lists(st.tuples(names, values), max_size=8)


def opened_all(container: Container) -> None:
    """Open every document and array inside ``container``, as deep as they go."""
    for position in range(len(container)):
        inner = container.opened(position)
        if inner is not None:
            opened_all(inner)


def as_built(container: Container) -> list[tuple[bytes, tuple[int, bytes]]]:
    return [(container.names[i], (container.kinds[i], container.value(i))) for i in range(len(container))]


@EXAMPLES
@given(documents)
def test_every_element_is_read_as_built_and_rebuilt_byte_for_byte(elements):
    data = document(elements)
    assert as_built(Container(DOCUMENT, data)) == elements
    assert Container(DOCUMENT, data).to_bytes() == data
    deep = Container(DOCUMENT, data)
    opened_all(deep)
    assert deep.to_bytes() == data


# -- against pymongo's bson, for the types it round-trips ----------------------------------------

lossless_scalars = st.one_of(
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.tuples(st.binary(max_size=12), st.sampled_from([0, 1, 3, 4, 5, 6, 7, 8, 0x80, 0xFF])).map(
        lambda b: Binary(*b)
    ),
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1).map(DatetimeMS),
    st.none(),
    st.tuples(texts, st.sampled_from(["", "i", "imsx"])).map(lambda r: Regex(*r)),
    texts.map(Code),
    st.tuples(texts, st.dictionaries(keys, st.integers(0, 9), max_size=2)).map(lambda c: Code(*c)),
    st.integers(-(2**31), 2**31 - 1),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)).map(lambda t: Timestamp(*t)),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.binary(min_size=16, max_size=16).map(Decimal128.from_bid),
    st.sampled_from([MinKey(), MaxKey()]),
)
lossless_values = st.recursive(
    lossless_scalars,
    lambda inner: st.one_of(
        st.dictionaries(keys.filter(lambda n: not n.startswith("$")), inner, max_size=4),
        st.lists(inner, max_size=4),
    ),
    max_leaves=10,
)
CODEC = bson.CodecOptions(datetime_conversion=bson.DatetimeConversion.DATETIME_MS)


@EXAMPLES
@given(st.dictionaries(keys, lossless_values, max_size=8))
def test_elements_split_a_document_exactly_where_bson_encodes_each_field(document):
    data = bson.encode(document)
    assert bson.encode(bson.decode(data, CODEC)) == data  # a case bson round-trips
    container = Container(DOCUMENT, data)
    assert [name.decode() for name in container.names] == list(document)
    for position, (name, value) in enumerate(document.items()):
        alone = document_bytes(
            [element_bytes(container.kinds[position], name.encode(), container.value(position))]
        )
        assert alone == bson.encode({name: value})
    opened_all(container)
    assert container.to_bytes() == data


def test_edits_change_only_the_elements_they_touch():
    data = bson.encode({"a": 1, "b": {"c": [1, 2, 3], "d": "x"}, "e": Int64(5)})
    container = Container(DOCUMENT, data)
    b = container.opened(container.position(b"b"))
    c = b.opened(b.position(b"c"))
    c.truncate(1)
    c.append(b"1", 0x02, bson.encode({"s": "y"})[4 + 3 : -1])  # a string's value, cut from bson's bytes
    b.rename(b.position(b"d"), b"$d")
    container.replace(container.position(b"a"), 0x0A, b"")
    container.remove(container.position(b"e"))
    container.append(b"f", 0x08, b"\x01")
    assert container.to_bytes() == bson.encode({"a": None, "b": {"c": [1, "y"], "$d": "x"}, "f": True})
    assert container.position(b"f") == 2 and container.position(b"e") is None


def test_positions_find_a_documents_first_name_and_anarrays_index():
    data = document([(b"x", (0x10, int32(1))), (b"x", (0x10, int32(2))), (b"$ref", (0x0A, b""))])
    container = Container(DOCUMENT, data)
    assert (container.position(b"x"), container.position(b"$ref"), container.position(b"y")) == (0, 2, None)
    nulls = Container(ARRAY, array([(0x0A, b""), (0x0A, b"")])[1])
    assert [nulls.position(key) for key in (b"0", b"1", b"2", b"x", b"-1")] == [0, 1, None, None, None]
    assert [array_index(key) for key in (b"12", b"", b"1a", "١".encode())] == [12, None, None, None]


def test_the_corpus_keeps_every_byte_through_reads_and_edits():
    """Every type and edge case of the corpus, including what a decode and encode would change
    (deprecated types, NaN payloads, non-canonical decimals, the old binary subtype, DBRef-like
    key sets), under names that look like something else."""
    elements = [(name.encode(), value) for name, value in VALUES.items()]
    elements += [(name.encode(), SYMBOL) for name in NAMES]
    changed_by_bson = [name for name, value in VALUES.items() if not round_trips(value)]
    assert {"symbol", "dbpointer", "undefined", "document", "array"} <= set(changed_by_bson)
    data = document(elements)
    container = Container(DOCUMENT, data)
    assert as_built(container) == elements
    opened_all(container)
    assert container.to_bytes() == data

    edited = Container(DOCUMENT, data)
    edited.rename(edited.position(b"$id"), b"$banana")
    edited.remove(edited.position(b"minkey"))
    inner = edited.opened(edited.position(b"document"))
    inner.replace(inner.position(b""), *DBPOINTER)
    renamed = [
        (b"$banana" if name == b"$id" else name, value) for name, value in elements if name != b"minkey"
    ]
    inner_elements = [("a", (0x10, int32(1))), ("$dollar", (0x0A, b"")), ("dot.ted", SYMBOL), ("", DBPOINTER)]
    expected = [(name, embedded(inner_elements) if name == b"document" else value) for name, value in renamed]
    assert edited.to_bytes() == document(expected)


# -- damaged documents --------------------------------------------------------------------------


@EXAMPLES
@given(documents.filter(bool), st.data())
@example([(b"a", (0x02, string(b"x")))], None)
def test_a_cut_short_or_altered_document_is_refused_or_read_exactly(elements, data):
    """Never a silent cut: a damaged document raises DamagedBson, or it reads as the bytes it is."""
    built = document(elements)
    for cut in range(len(built)):
        with pytest.raises(DamagedBson):
            opened_all(Container(DOCUMENT, built[:cut]))
    with pytest.raises(DamagedBson, match="before its data"):
        Container(DOCUMENT, built + b"\x00")
    if data is None:
        return
    at = data.draw(st.integers(0, len(built) - 1))
    altered = bytearray(built)
    altered[at] = data.draw(st.integers(0, 255))
    try:
        container = Container(DOCUMENT, bytes(altered))
        opened_all(container)
    except DamagedBson:
        return
    assert container.to_bytes() == altered


@pytest.mark.parametrize(
    ("damaged", "message"),
    [
        (document([(b"s", (0x02, int32(50) + b"ab\x00"))]), "a string at byte 7"),
        (document([(b"s", (0x02, int32(3) + b"ab!"))]), "lacks its closing NUL"),
        (document([(b"b", (0x05, int32(-1) + b"\x00"))]), "negative length"),
        (document([(b"x", (0x42, b""))]), "unknown BSON type 0x42 at byte 4"),
        (document([(b"d", (DOCUMENT, int32(9) + b"\x00"))]), "says it has 9 bytes"),
        (document([(b"c", (0x0F, int32(30) + string(b"x") + document([])))]), "code with scope"),
        (int32(9) + b"\x10abc", "at byte 0 says it has 9 bytes, but 8 are there"),
        (int32(8) + b"\x10ab!", "does not end with a NUL"),
        (int32(10) + b"\x10ab\x00\x00\x00", "runs past its document's end"),
        (b"\x05\x00", "cut short"),
    ],
)
def test_damage_is_named_where_it_is(damaged, message):
    with pytest.raises(DamagedBson, match=message):
        opened_all(Container(DOCUMENT, damaged))
