"""Order-independent digests of BSON documents, computed in bulk on Arrow binary arrays.

A verification hashes every document of a collection twice (MongoDB's bytes, the state's
``__doc_bson``), so the hash is the hot path: a Python call per document (``hashlib``) costs about
1 µs, more than reading the document. ``document_hashes`` hashes a whole array at once with numpy:
the documents' bytes, padded with zero bytes to whole 64-bit words, are read as a matrix of words,
column by column, and taken into two 64-bit lanes seeded with the length (a multiply and an
xorshift per word and lane, ``_step``), each finalised by splitmix64's finaliser. Not
cryptographic: it tells apart what a pipeline and storage can get wrong, not what an adversary
crafts. Documents longer than ``_LONG_DOCUMENT`` bytes are hashed one by one with blake2b, so one
large document does not widen every column of its batch.

A range's digest (``Digests``) is the count and the sums (modulo 2**64, per lane) of its documents' hashes:
any order, any batching gives the same value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from hashlib import blake2b

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc.capture.document_ids import id_elements

_LONG_DOCUMENT = 512
# documents hashed at once: a block's columns of words and lanes stay in the CPU's caches (a batch of
# 130 k small documents hashed whole took 2 to 3 times as long)
_BLOCK_ROWS = 16_384
# A differing cell's documents are compared one by one on both sides, so cells hold few documents: a
# range of 100 k documents in 4,096 cells put 24 in each, and 1,000 drifted documents brought 50 k
# to the one-by-one comparison (half the time of a 1 M-document verification)
_CELLS_PER_RANGE = 1 << 16
_MAX_CELLS = 1 << 21
_U64 = np.uint64
_SEED = _U64(0x9E3779B97F4A7C15)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    x ^= x >> _U64(31)
    x *= _MIX1
    x ^= x >> _U64(27)
    x *= _MIX2
    x ^= x >> _U64(33)
    return x


def _step(first: np.ndarray, second: np.ndarray, word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Take one word of each document into its lanes: per lane a multiply and an xorshift, each a
    bijection of the lane (two documents that differ in one word always hash apart); the lanes are
    finalised once, at the end (``_mix``). A full mix per word took twice the time."""
    second += word
    second *= _MIX2
    second ^= second >> _U64(29)
    return _first_lane_step(first, word), second


def _first_lane_step(first: np.ndarray, word: np.ndarray) -> np.ndarray:
    first ^= word
    first *= _MIX1
    first ^= first >> _U64(32)
    return first


def document_hashes(documents: pa.BinaryArray) -> np.ndarray:
    """A 128-bit hash of each document's bytes: an (n, 2) array of uint64 (null: the empty document)."""
    count = len(documents)
    if count <= _BLOCK_ROWS:
        return _block_hashes(documents)
    blocks = range(0, count, _BLOCK_ROWS)
    return np.concatenate([_block_hashes(documents.slice(start, _BLOCK_ROWS)) for start in blocks])


def _block_hashes(documents: pa.BinaryArray) -> np.ndarray:
    count = len(documents)
    hashes = np.zeros((count, 2), _U64)
    if count == 0:
        return hashes
    if documents.null_count:
        documents = documents.fill_null(b"")
    lengths = np.diff(_offsets(documents))
    short = lengths <= _LONG_DOCUMENT
    shorts = documents if short.all() else documents.filter(pa.array(short))
    hashes[short, 0], hashes[short, 1] = _lanes(shorts, lengths[short])
    for index in np.flatnonzero(~short):
        hashes[index] = np.frombuffer(blake2b(documents[index].as_py(), digest_size=16).digest(), _U64)
    return hashes


def _offsets(values: pa.BinaryArray) -> np.ndarray:
    return np.frombuffer(values.buffers()[1], np.int32)[values.offset : values.offset + len(values) + 1]


def _lanes(documents: pa.BinaryArray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two finalised lanes of each document: the documents padded with zero bytes to the widest
    one's whole words (Arrow's ``ascii_rpad`` on the bytes viewed as a string: a copy in C, the bytes
    not checked), read as a matrix of words; a document's lanes take its own words only. Reading the
    words at each document's unaligned offset instead took twice the time."""
    count, columns = len(documents), -(-int(lengths.max(initial=0)) // 8)
    with np.errstate(over="ignore"):
        first = lengths.astype(_U64) * _SEED
        second = first ^ _MIX2
        if columns:
            padded = pc.ascii_rpad(documents.view(pa.string()), 8 * columns, padding="\x00")
            offsets = _offsets(padded)
            if int(offsets[-1] - offsets[0]) != 8 * columns * count:
                raise RuntimeError("ascii_rpad did not pad every document to one width")
            data = padded.buffers()[2]
            words = np.frombuffer(data, _U64, count=columns * count, offset=int(offsets[0])).reshape(
                count, columns
            )
            # the columns every document fills whole (most of them, where a batch's documents are of
            # similar sizes), then those only some reach
            filled = int(lengths.min()) // 8
            for column in range(filled):
                first, second = _step(first, second, words[:, column])
            for column in range(filled, columns):
                rows = np.flatnonzero(lengths > 8 * column)
                first[rows], second[rows] = _step(first[rows], second[rows], words[rows, column])
    return _mix(first), _mix(second)


def cells_per_range(ranges: int) -> int:
    """How many cells each of ``ranges`` ranges is cut into: up to ``_CELLS_PER_RANGE``, fewer when
    the ranges are many (the digests of all cells stay under ``_MAX_CELLS``: 48 MiB)."""
    return max(1, min(_CELLS_PER_RANGE, _MAX_CELLS // max(ranges, 1)))


def id_cells(documents: pa.BinaryArray, cells: int) -> np.ndarray:
    """Which of ``cells`` cells each document falls in, by a hash of its ``_id`` element's bytes:
    MongoDB's copy and the state's of one document fall in the same cell whatever else they hold
    (the same ``_id`` stored as another type, ``1`` and ``1.0``, may fall in another: both cells
    then differ, and the documents are paired by their normalised key)."""
    if cells == 1:
        return np.zeros(len(documents), np.int64)
    elements = id_elements(documents)
    offsets = np.frombuffer(elements.buffers()[1], np.int32)[
        elements.offset : elements.offset + len(elements) + 1
    ]
    width = int(offsets[1] - offsets[0]) if len(elements) else 0
    if not 0 < width <= _LONG_DOCUMENT or (np.diff(offsets) != width).any():
        return (document_hashes(elements)[:, 0] % _U64(cells)).astype(np.int64)
    # one width (ObjectIds: 17 bytes): the first lane alone, the words cut from a zero-padded matrix
    # (no gather, no masks), as ``document_hashes`` computes it
    count, words = len(elements), -(-width // 8)
    padded = np.zeros((count, words * 8), np.uint8)
    data = np.frombuffer(elements.buffers()[2], np.uint8, count=count * width, offset=int(offsets[0]))
    padded[:, :width] = data.reshape(count, width)
    columns = padded.view(_U64)
    with np.errstate(over="ignore"):
        first = np.full(count, _U64(width) * _SEED, _U64)
        for column in range(words):
            first = _first_lane_step(first, columns[:, column])
    return (_mix(first) % _U64(cells)).astype(np.int64)


@dataclass
class Digests:
    """The digests of a collection's ranges, added to by range index in bulk."""

    ranges: int
    counts: np.ndarray = field(init=False)
    sums: np.ndarray = field(init=False)  # (2, ranges): a lane's sums contiguous, added to on their own

    def __post_init__(self) -> None:
        self.counts = np.zeros(self.ranges, np.int64)
        self.sums = np.zeros((2, self.ranges), _U64)

    def add(self, index: int | np.ndarray, hashes: np.ndarray) -> None:
        """Add documents' ``hashes`` to the range ``index`` (one for all, or one per document)."""
        with np.errstate(over="ignore"):
            if isinstance(index, np.ndarray):
                # one-dimensional ``add.at``s, several times faster than one over (n, 2) rows
                np.add.at(self.counts, index, 1)  # a bincount's length is every cell's
                for lane in range(2):
                    np.add.at(self.sums[lane], index, np.ascontiguousarray(hashes[:, lane]))
            else:
                self.counts[index] += len(hashes)
                self.sums[:, index] += hashes.sum(axis=0, dtype=_U64)

    def part(self, start: int, ranges: int) -> Digests:
        """The digests of ``ranges`` consecutive ranges from ``start`` (a view: no copy)."""
        part = Digests(0)
        part.ranges = ranges
        part.counts = self.counts[start : start + ranges]
        part.sums = self.sums[:, start : start + ranges]
        return part

    def differing(self, other: Digests) -> set[int]:
        """The ranges whose count or sums differ from ``other``'s."""
        unequal = (self.counts != other.counts) | (self.sums != other.sums).any(axis=0)
        return set(np.flatnonzero(unequal).tolist())
