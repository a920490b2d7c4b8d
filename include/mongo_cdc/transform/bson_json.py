"""``__doc`` of fast documents (``transform.bson_columns``) straight from their BSON bytes.

The text is what ``extjson.from_bson`` writes of the same bytes, byte for byte: every element is
a piece of text at its offset in the buffer (a key and its value; a document or array an opening
piece there and a closing one at its last byte), so the pieces in offset order, joined per
document, are the document's text. Pieces are made per kind with Arrow's string kernels, doubles by
orjson (which writes a numpy array as it writes floats), and the few values Arrow has no kernel
for one by one: binaries' base64, and strings holding a control character (orjson escapes them).
"""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc.bson_elements import (
    ARRAY,
    BINARY,
    BOOL,
    DATE,
    DOCUMENT,
    DOUBLE,
    INT32,
    INT64,
    NULL,
    OBJECT_ID,
    STRING,
)
from mongo_cdc.transform.bson_columns import HEX_DIGITS, FastDocuments, Values, kinds_in


def document_texts(fast: FastDocuments) -> pa.StringArray:
    """Each fast document's Extended JSON text, as ``extjson.from_bson`` writes it. Every element
    becomes a piece of text at its offset in the buffer (a document or array an opening piece there
    and a closing one at its last byte), so the pieces in offset order, joined per document, are
    the document's text."""
    documents = fast.documents
    ends = documents.at + fast.buffer.int32(documents.at) - 1
    offsets = [documents.at, ends]
    pieces = [_repeat("{", len(documents)), _repeat("}", len(documents))]
    for level in fast.levels.values():
        if not len(level.container):
            continue
        first = level.first
        if level.documents:
            keys = [orjson.dumps(name.decode()).decode() + ":" for name in level.names]
            prefixes = pa.array([f",{key}" for key in keys] + keys, pa.string())
            prefix_index = level.key + first * len(keys)
        else:
            prefixes = pa.array([",", ""], pa.string())
            prefix_index = first.view(np.int8)
        values = level.values
        # each kind's elements are pieces of their own: the pieces are put in order once, at the end
        for kind in kinds_in(values.kind):
            where = np.flatnonzero(values.kind == kind)
            parts = _value_texts(fast, kind, values, where)
            offsets.append(level.offset[where])
            prefix = prefixes.take(pa.array(prefix_index[where]))
            pieces.append(pc.binary_join_element_wise(prefix, *parts, ""))
        containers = (values.kind == DOCUMENT) | (values.kind == ARRAY)
        if containers.any():
            closing = np.where(values.kind[containers] == DOCUMENT, "}", "]")
            offsets.append(values.at[containers] + values.size[containers] - 1)
            pieces.append(pa.array(closing, pa.string()))
    at = np.concatenate(offsets)
    order = np.argsort(at, kind="stable")
    ordered = pa.concat_arrays(pieces).take(pa.array(order))
    bounds = np.searchsorted(at[order], documents.at)
    # the pieces in order are the documents' texts end to end: each text is a run of them
    piece_offsets = np.frombuffer(ordered.buffers()[1], np.int32)[ordered.offset :]
    text_offsets = piece_offsets[np.append(bounds, len(at))]
    return pa.StringArray.from_buffers(len(bounds), pa.py_buffer(text_offsets), ordered.buffers()[2])


def _value_texts(
    fast: FastDocuments, kind: int, values: Values, where: np.ndarray
) -> tuple[pa.Array | str, ...]:
    """The Extended JSON text of the values at ``where``, all of BSON type ``kind`` (a document's or
    array's opening bracket), as parts to join (texts and, the same for every value, strings)."""
    at = values.at[where]
    if kind == DOUBLE:
        return (_doubles(fast.gather(at, 8).view("<f8").reshape(-1)),)
    if kind == STRING:
        return ('"', _escaped(fast.ranges(at + 4, values.size[where] - 5, pa.string())), '"')
    if kind in (DOCUMENT, ARRAY):
        return ("{" if kind == DOCUMENT else "[",)
    if kind == OBJECT_ID:
        return (_fixed_width(b'{"$oid":"', HEX_DIGITS[fast.gather(at, 12)].reshape(len(at), 24), b'"}'),)
    if kind == BOOL:
        flags = pa.array(fast.buffer.data[at] != 0, pa.int8())
        return (pa.array(["false", "true"], pa.string()).take(flags),)
    if kind == DATE:
        millis = pa.array(fast.int64(at), pa.int64()).cast(pa.string())
        return ('{"$date":{"$numberLong":"', millis, '"}}')
    if kind == NULL:
        return ("null",)
    if kind == INT32:
        return (pa.array(fast.int32(at), pa.int64()).cast(pa.string()),)
    if kind == INT64:
        number = pa.array(fast.int64(at), pa.int64()).cast(pa.string())
        return ('{"$numberLong":"', number, '"}')
    if kind != BINARY:
        raise ValueError(f"BSON type 0x{kind:02x} never takes the fast path")
    # length, subtype, bytes (the old subtype 2, which nests a second length, is never fast)
    data = fast.ranges(at + 5, values.size[where] - 5, pa.binary()).to_pylist()
    encoded = pa.array([base64.b64encode(value).decode() for value in data], pa.string())
    subtypes = _SUBTYPES.take(pa.array(fast.buffer.data[at + 4]))
    return ('{"$binary":{"base64":"', encoded, '","subType":"', subtypes, '"}}')


_SUBTYPES = pa.array([f"{subtype:02x}" for subtype in range(256)], pa.string())


def _escaped(raw: pa.StringArray) -> pa.Array:
    """Strings as the inside of JSON strings: a quote and a backslash escaped, and the few strings
    holding a control character escaped by orjson. Their bytes are looked at once: most strings hold
    no quote nor backslash to escape."""
    offsets = np.frombuffer(raw.buffers()[1], np.int32)[raw.offset : raw.offset + len(raw) + 1]
    buffer = raw.buffers()[2]
    data = (
        np.frombuffer(buffer, np.uint8)[offsets[0] : offsets[-1]]
        if buffer is not None
        else np.zeros(0, np.uint8)
    )
    escaped = raw
    if ((data == ord("\\")) | (data == ord('"'))).any():
        escaped = pc.replace_substring(pc.replace_substring(raw, "\\", "\\\\"), '"', '\\"')
    control = np.flatnonzero(data < 0x20)
    if not len(control):
        return escaped
    holding = np.unique(np.searchsorted(offsets, control + offsets[0], side="right") - 1)
    inner = [orjson.dumps(text).decode()[1:-1] for text in raw.take(pa.array(holding)).to_pylist()]
    mask = np.zeros(len(raw), bool)
    mask[holding] = True
    return pc.replace_with_mask(escaped, pa.array(mask), pa.array(inner, pa.string()))


_NON_FINITE = {"NaN": '{"$numberDouble":"NaN"}', "Infinity": '{"$numberDouble":"Infinity"}',
               "-Infinity": '{"$numberDouble":"-Infinity"}'}  # fmt: skip


def _doubles(numbers: np.ndarray) -> pa.Array:
    """Doubles as orjson writes them (it writes a numpy array as it writes floats), non-finite ones
    as Extended JSON's ``$numberDouble``."""
    finite = np.isfinite(numbers)
    listed = orjson.dumps(np.where(finite, numbers, 0.0), option=orjson.OPT_SERIALIZE_NUMPY)
    text = pc.split_pattern(pa.array([listed[1:-1].decode()]), ",").flatten()
    if finite.all():
        return text
    spelled = np.where(np.isnan(numbers), "NaN", np.where(numbers > 0, "Infinity", "-Infinity"))
    named = pa.array(spelled.tolist(), pa.string())  # only the non-finite ones are read
    replaced = pa.array([_NON_FINITE[name] for name in named.filter(pa.array(~finite)).to_pylist()])
    positions = np.cumsum(~finite) - 1
    return pc.if_else(pa.array(finite), text, replaced.take(pa.array(np.maximum(positions, 0))))


def _fixed_width(prefix: bytes, middle: np.ndarray, suffix: bytes) -> pa.Array:
    """Strings of ``prefix``, a row of ``middle`` (uint8) and ``suffix`` each."""
    count = len(middle)
    rows = np.concatenate(
        [
            np.tile(np.frombuffer(prefix, np.uint8), (count, 1)),
            middle,
            np.tile(np.frombuffer(suffix, np.uint8), (count, 1)),
        ],
        axis=1,
    )
    width = rows.shape[1]
    offsets = np.arange(count + 1, dtype=np.int32) * width
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(rows.tobytes()))


def _repeat(text: str, count: int) -> pa.Array:
    return pa.array([text], pa.string()).take(pa.array(np.zeros(count, np.int64)))
