"""A snapshot's chunks: each collection split into key ranges of about ``snapshot.chunk.size`` documents.

A collection's bounds are ``_id``s of a random sample (``$sample``, ``SAMPLES_PER_CHUNK`` per chunk,
sorted on the server in the index's order): a few random reads, where walking the index costs a
scan of every key (about as long as copying a tenth of the documents). So a chunk holds about
``size`` documents, give or take a fifth. Within each range a shard owns, a sharded collection's
bounds are its shard key's index keys: from one bound, ``skip(size)`` along the index (``returnKey``,
so only keys are read) gives the next. A chunk is read with
``hint(index).min(low).max(high)``. ``min``/``max`` bound the index scan in MongoDB's order across
BSON types (MinKey < null < numbers < strings < objects < arrays < binData < ObjectId < bool <
date < timestamp < regex < MaxKey), so consecutive ranges hold every document exactly once
whatever mix of ``_id`` types a collection has; a ``{_id: {$gte: a, $lt: b}}`` filter would only
match values of ``a``'s type. ``_id`` is immutable, so a document never moves between ranges.

Collections within one chunk are read whole in natural order, as are those with a default
collation or clustered on ``_id`` (``_id_index_ordered``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import bson
from bson import MaxKey
from pymongo.collection import Collection

from mongo_cdc.capture.topology import OwnedRanges
from mongo_cdc.lake.snapshot_log import Chunk

log = logging.getLogger(__name__)

# Sampled _ids per chunk: a chunk's share of the collection is then within about 1/sqrt(20) of its
# size; the sample stays a small fraction of any collection big enough to chunk, which keeps
# $sample on its random cursor (no collection scan).
SAMPLES_PER_CHUNK = 20

ID_INDEX: tuple[tuple[str, Any], ...] = (("_id", 1),)


def plan_chunks(
    collection: Collection, size: int, owned: OwnedRanges | None = None, options: dict | None = None
) -> list[Chunk]:
    """The chunks of one collection (``options``: its listCollections options); for a sharded
    collection ``owned`` are the ranges this shard owns (no range: no chunk)."""
    namespace = collection.full_name
    if owned is not None:
        bounds = [
            piece
            for low, high in _contiguous(owned.ranges)
            for piece in _split(collection, owned.key, low, high, size)
        ]
        return _chunks(namespace, owned.key, bounds, size)
    estimated = collection.estimated_document_count()
    if estimated <= size or not _id_index_ordered(options or {}):
        return [Chunk(namespace, 0, 1, expected=estimated)]
    bounds = _sampled_bounds(collection, -(-estimated // size))
    chunks = _chunks(namespace, ID_INDEX, bounds, size)
    last = chunks[-1]
    # the rest of the estimate: for progress only
    chunks[-1] = Chunk(last.namespace, last.index, last.count, last.key, last.low, last.high,
                       max(estimated - size * (len(chunks) - 1), 0))  # fmt: skip
    return chunks


def _id_index_ordered(options: dict) -> bool:
    """Whether index-key bounds on ``_id`` follow its index: not under a default collation (strings
    compare by their collation keys), nor in a clustered collection (no separate ``_id`` index), nor
    in a view (no index of its own: it is read whole)."""
    return (
        options.get("collation", {}).get("locale", "simple") == "simple"
        and "clusteredIndex" not in options
        and "viewOn" not in options
    )


def _contiguous(ranges: Sequence[tuple[dict, dict]]) -> Iterator[tuple[dict, dict]]:
    """Owned ranges with the adjacent ones joined: fewer, larger chunks."""
    merged: list[list[dict]] = []
    for low, high in ranges:
        if merged and merged[-1][1] == low:
            merged[-1][1] = high
        else:
            merged.append([low, high])
    return ((low, high) for low, high in merged)


def _sampled_bounds(collection: Collection, count: int) -> list[tuple[dict | None, dict | None]]:
    """About ``count`` consecutive ``_id`` ranges of even size, from MinKey to MaxKey."""
    pipeline = [
        {"$sample": {"size": count * SAMPLES_PER_CHUNK}},
        {"$project": {"_id": 1}},
        {"$sort": {"_id": 1}},
    ]
    sample = [document["_id"] for document in collection.aggregate(pipeline)]
    cuts: list[dict] = []
    for value in sample[SAMPLES_PER_CHUNK::SAMPLES_PER_CHUNK]:
        cut = {"_id": value}
        # $sample may return a document twice: a repeated cut would make an empty range
        if not cuts or bson.encode(cuts[-1]) != bson.encode(cut):
            cuts.append(cut)
    lows: list[dict | None] = [None, *cuts]
    highs: list[dict | None] = [*cuts, None]
    return list(zip(lows, highs, strict=True))


def _split(
    collection: Collection,
    key: tuple[tuple[str, Any], ...],
    low: dict | None,
    high: dict | None,
    size: int,
) -> Iterator[tuple[dict | None, dict | None]]:
    """[low, high) cut every ``size`` index keys."""
    start = low
    while True:
        cursor = collection.find({}, return_key=True).hint(list(key)).skip(size).limit(1)
        if start is not None:
            cursor = cursor.min(list(start.items()))
        if high is not None:
            cursor = cursor.max(list(high.items()))
        point = next(cursor, None)
        if point is None:
            break
        if point == start:  # a shard key value shared by more than ``size`` documents: no cut here
            log.warning("%s: more than %d documents share shard key %s; copied as one chunk",
                        collection.full_name, size, point)  # fmt: skip
            break
        yield start, point
        start = point
    yield start, high


def _chunks(
    namespace: str,
    key: tuple[tuple[str, Any], ...],
    bounds: list[tuple[dict | None, dict | None]],
    size: int,
) -> list[Chunk]:
    return [
        Chunk(namespace, index, len(bounds), key, _encoded(low), _encoded(high), size)
        for index, (low, high) in enumerate(bounds)
    ]


def _encoded(bound: dict | None) -> bytes | None:
    return bson.encode(bound) if bound is not None else None


def max_key_filter(chunk: Chunk) -> dict | None:
    """The last ``_id`` range's second read: ``max`` is exclusive even at its MaxKey default, so a
    document whose ``_id`` is MaxKey is read by this equality filter instead."""
    if chunk.key == ID_INDEX and chunk.low is not None and chunk.high is None:
        return {"_id": MaxKey()}
    return None
