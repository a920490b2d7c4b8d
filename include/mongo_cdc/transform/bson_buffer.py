"""BSON documents end to end in one numpy buffer, read at many offsets at once.

The fast path (``bson_columns``) walks every document of a batch one element position at a time:
each step reads the numbers, bytes and C strings at the offsets of all the documents' elements in
one vectorised gather.
"""

from __future__ import annotations

import numpy as np

_SCAN_BYTES = 16  # bytes after a cstring's start searched for its end before a lookup of the rest
_LOW_BYTES, _HIGH_BITS = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080)


def _unaligned(data: np.ndarray, dtype: str) -> np.ndarray:
    """``data`` (bytes) read as ``dtype`` from every byte on: element ``i`` starts at byte ``i``."""
    width = np.dtype(dtype).itemsize
    return np.ndarray((max(len(data) - width + 1, 0),), dtype, data, 0, (1,))


class BsonBuffer:
    """The bytes holding the documents, with what every walk over them needs."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        # the little-endian number starting at each byte: one gather reads those at many offsets
        self._int32 = _unaligned(data, "<i4")
        self._int64 = _unaligned(data, "<i8")
        self._uint64 = _unaligned(data, "<u8")

    def int32(self, at: np.ndarray) -> np.ndarray:
        """The little-endian int32 at each offset ``at`` (each checked to be in the buffer)."""
        return self._int32[at].astype(np.int64)

    def int64(self, at: np.ndarray) -> np.ndarray:
        """The little-endian int64 at each offset ``at`` (each checked to be in the buffer)."""
        return self._int64[at]

    def windows(self, at: np.ndarray, width: int) -> np.ndarray:
        """The ``width`` bytes from each offset ``at``, a row each; bytes past the buffer's end are 0."""
        size = len(self.data)
        inside = at <= size - width
        if size >= width and inside.all():
            return np.lib.stride_tricks.sliding_window_view(self.data, width)[at]
        rows = np.zeros((len(at), width), np.uint8)
        if size >= width:
            rows[inside] = np.lib.stride_tricks.sliding_window_view(self.data, width)[at[inside]]
        positions = at[~inside, None] + np.arange(width)
        rows[~inside] = np.where(positions < size, self.data[np.minimum(positions, size - 1)], 0)
        return rows

    def words(self, at: np.ndarray, count: int) -> np.ndarray:
        """The ``count`` little-endian 8-byte words from each offset ``at``, a row each; bytes past the
        buffer's end are 0."""
        if (at <= len(self.data) - 8 * count).all():
            return np.stack([self._uint64[at + 8 * word] for word in range(count)], axis=1)
        return self.windows(at, 8 * count).view("<u8")

    def next_zero(self, at: np.ndarray) -> np.ndarray:
        """The offset of the first zero byte at or after each of ``at``; len(data) if none."""
        size = len(self.data)
        found = np.full(len(at), -1, np.int64)
        # names are short: the 8-byte words after each offset hold most of their ends; a zero byte
        # sets the high bit of its byte in (word - 0x0101...) & ~word & 0x8080..., the lowest set
        # bit being the first zero's
        near = at > size - _SCAN_BYTES
        rows = np.flatnonzero(~near)
        for step in range(0, _SCAN_BYTES, 8):
            words = self._uint64[at[rows] + step]
            marks = (words - _LOW_BYTES) & ~words & _HIGH_BITS
            hit = marks != 0
            lowest = marks[hit] & (~marks[hit] + np.uint64(1))
            found[rows[hit]] = at[rows[hit]] + step + (np.log2(lowest).astype(np.int64) >> 3)
            rows = rows[~hit]
        if near.any():  # the buffer's last bytes
            window = self.windows(at[near], _SCAN_BYTES) == 0
            found[near] = np.where(window.any(axis=1), at[near] + np.argmax(window, axis=1), -1)
        beyond = (found < 0) | (found >= size)
        if beyond.any():  # long names: look the rest up
            zeros = np.flatnonzero(self.data == 0)
            following = np.searchsorted(zeros, at[beyond])
            found[beyond] = np.where(
                following < len(zeros), zeros[np.minimum(following, len(zeros) - 1)], size
            )
        return found
