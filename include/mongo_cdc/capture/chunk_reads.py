"""Reading a snapshot chunk's documents as the raw BSON batches the server sent, one batch ahead.

A chunk is read with ``cursor.min``/``max`` on its index (or in natural order when whole), and
each server reply is handed on as it came (``_raw_batches``: no per-document cursor objects, no
decode), so ``snapshot_columns.SnapshotColumns`` slices the documents' bytes straight into Arrow. While one
batch is encoded, the next is read on a thread (``ChunkReads``), across chunks too, and the server
sends the batches one after the other, unasked (an exhaust cursor).
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bson import _array_of_documents_to_buffer
from bson.codec_options import CodecOptions
from bson.raw_bson import _RAW_ARRAY_BSON_OPTIONS, RawBSONDocument
from pymongo import CursorType, MongoClient
from pymongo.collection import Collection
from pymongo.cursor import RawBatchCursor

from mongo_cdc.capture.chunking import max_key_filter
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.snapshot_log import Chunk
from mongo_cdc.namespace import Namespace

# Without ``snapshot.fetch.size``, a range chunk is read in about this many batches (of at least
# MIN_CHUNK_FETCH_SIZE documents): ``_fetch_size``.
READS_PER_CHUNK = 8
MIN_CHUNK_FETCH_SIZE = 100


# Sizes of the BSON values a cursor reply's top level and cursor document hold (by type byte):
# fixed sizes, or -1 for an int32 length prefix counting itself (documents, arrays) and -4 for one
# that does not (strings: + terminator; binaries: + subtype byte).
_VALUE_SIZES = {0x01: 8, 0x02: -4, 0x03: -1, 0x04: -1, 0x05: -5, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0,
                0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}  # fmt: skip


_EMPTY_ARRAY = b"\x05\x00\x00\x00\x00"


_int32 = struct.Struct("<i")


def _elements(data: memoryview, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(name, value start, value end) of the elements of the BSON document at ``data[start:end]``;
    stops early (the caller falls back) at a type this walk does not know."""
    pos = start + 4
    while pos < end - 1:
        kind = data[pos]
        name_end = data[pos + 1 : min(end, pos + 1025)].tobytes().index(b"\x00") + pos + 1
        value = name_end + 1
        size = _VALUE_SIZES.get(kind)
        if size is None:
            return
        if size == -1:
            size = _int32.unpack_from(data, value)[0]
        elif size < -1:
            size = _int32.unpack_from(data, value)[0] + 4 + (size == -5)
        yield bytes(data[pos + 1 : name_end]), value, value + size
        pos = value + size


def _without_batch(payload: memoryview) -> tuple[bytes, memoryview, str] | None:
    """The reply with its cursor's batch array emptied, the array's bytes and the batch's name."""
    for name, start, end in _elements(payload, 0, len(payload)):
        if name != b"cursor":
            continue
        for key, array_start, array_end in _elements(payload, start, end):
            if key in (b"firstBatch", b"nextBatch"):
                removed = (array_end - array_start) - len(_EMPTY_ARRAY)
                small = bytearray(payload[:array_start])
                small += _EMPTY_ARRAY
                small += payload[array_end:]
                _int32.pack_into(small, 0, len(payload) - removed)
                _int32.pack_into(small, start, end - start - removed)
                return bytes(small), payload[array_start:array_end], key.decode()
    return None


class _RawBatchCursor(RawBatchCursor):
    """``find_raw_batches`` without pymongo's per-document cost; the batches are the same bytes.

    pymongo 4 unpacks every reply by decoding the batch array into one ``RawBSONDocument`` per
    document and joining their bytes again: ~1.7 µs of GIL-holding work per document, a quarter of
    a snapshot's budget. Here the reply is decoded with its batch array cut out (walking its few
    top-level elements), and the array's bytes are turned into the document stream in C: one copy
    of the batch, where inflating the reply with raw arrays made three.
    """

    def _unpack_response(  # type: ignore[override]
        self,
        response: Any,
        cursor_id: int | None,
        codec_options: CodecOptions,
        user_fields: Mapping[str, Any] | None = None,
        legacy_response: bool = False,
    ) -> list[Any]:
        payload = getattr(response, "payload_document", None)
        cut = None if legacy_response or payload is None else _without_batch(memoryview(payload))
        if cut is None:  # not an OP_MSG cursor reply this walk reads: pymongo's own way
            return super()._unpack_response(response, cursor_id, codec_options, user_fields, legacy_response)
        small, array, key = cut
        reply = dict(RawBSONDocument(small, _RAW_ARRAY_BSON_OPTIONS).items())
        cursor = reply["cursor"] = dict(reply["cursor"].items())
        stream = _array_of_documents_to_buffer(array)
        cursor[key] = [stream] if stream else []
        return [reply]


def _raw_batches(
    collection: Collection, fetch_size: int, chunk: Chunk, query: Mapping[str, Any] | None = None
) -> Generator[bytes, None, None]:
    """A chunk's documents as raw batches (concatenated BSON): the index range between its bounds
    (``chunking``), or the whole collection in natural order; of those, the ones ``query`` (a
    filtered re-snapshot's filter, ``snapshot_filters``; None: all) matches.

    The cursor is an exhaust cursor: the server sends every batch without waiting for a getMore,
    reading the next one while the client takes this one (a snapshot reads a replica set member,
    ``topology.shard_uri``, never a router).
    """

    def exhaust_cursor(query: Mapping[str, Any]) -> _RawBatchCursor:
        return _RawBatchCursor(collection, query, batch_size=fetch_size, cursor_type=CursorType.EXHAUST)

    query = query or {}
    cursor = exhaust_cursor(query)
    if chunk.key is not None:
        cursor = cursor.hint(list(chunk.key))
        low, high = chunk.bounds()
        if low is not None:
            cursor = cursor.min(list(low.items()))
        if high is not None:
            cursor = cursor.max(list(high.items()))
    with cursor:
        yield from cursor
    extra = max_key_filter(chunk)
    if extra is not None:
        with exhaust_cursor({"$and": [extra, query]} if query else extra) as cursor:
            yield from cursor


def _fetch_size(config: SourceConfig, chunk: Chunk) -> int:
    """``snapshot.fetch.size``; unset, a range chunk is read in about ``READS_PER_CHUNK`` batches.

    The server's default batch (16 MiB) holds ~100 k small documents: a chunk of that size would be
    one batch, read while nothing else happens, then encoded while the server waits. Batches a
    fraction of a chunk let the server read the next one while this one is encoded.
    """
    if config.snapshot_fetch_size or chunk.key is None:
        return config.snapshot_fetch_size
    return max(chunk.expected // READS_PER_CHUNK, MIN_CHUNK_FETCH_SIZE)


@dataclass
class _Read:
    """A chunk's cursor and its next batch, being read on the fetcher thread."""

    chunk: Chunk
    batches: Generator[bytes, None, None]
    ahead: Future

    def close(self) -> None:
        self.ahead.exception()  # waits for the read under way, whatever it ends with
        self.batches.close()


class ChunkReads:
    """The raw batches of the chunks one copier copies in turn, read one batch ahead on a thread
    (socket I/O, no GIL) while the batch before is encoded; across chunks too: once a chunk's cursor
    is done, the next chunk's first batch is read while this chunk's file is written and committed.
    ``filters``: the query of each namespace read through one (a filtered re-snapshot's).
    """

    def __init__(
        self,
        client: MongoClient,
        config: SourceConfig,
        filters: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.filters = filters or {}
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-read")
        self._reading: _Read | None = None

    def _start(self, chunk: Chunk) -> _Read:
        db, name = Namespace.parse(chunk.namespace)
        collection = self.client[db].get_collection(name)
        query = self.filters.get(chunk.namespace)
        batches = _raw_batches(collection, _fetch_size(self.config, chunk), chunk, query)
        return _Read(chunk, batches, self._fetcher.submit(next, batches, None))

    def batches(self, chunk: Chunk, following: Chunk | None) -> Generator[bytes, None, None]:
        """``chunk``'s batches; once they are all read, ``following``'s first one is read ahead."""
        read = self._reading
        if read is None or read.chunk != chunk:
            self.close()
            read = self._reading = self._start(chunk)
        while (batch := read.ahead.result()) is not None:
            read.ahead = self._fetcher.submit(next, read.batches, None)
            yield batch
        read.batches.close()
        self._reading = self._start(following) if following is not None else None

    def close(self) -> None:
        """Wait for the read under way and close its cursor."""
        if self._reading is not None:
            self._reading.close()
            self._reading = None

    def __enter__(self) -> ChunkReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._fetcher.shutdown()
