"""``field.hash.list``'s secret: the key, and the keyed HMAC-SHA-256 it makes of a BSON value.

A hashed value is the HMAC of the element's exact BSON bytes: its type byte, then its value bytes
as MongoDB sent them. So ``1`` (int32), ``NumberLong(1)``, ``1.0`` and ``"1"`` hash differently,
and equal values hash equally in every collection and run under one key, which keeps a hashed
column joinable. The result lands as a BSON string of 64 lowercase hex digits.

The key is the password of an Airflow connection (``field.hash.connection.id``), which the Airflow
layer reads at task time and hands over as bytes; the core never reads it from a file. ``HashKey``
holds it so that no ``repr``, log line or exception shows it, and ``check`` is what the lake may
keep: an HMAC of a fixed label, which tells two keys apart without revealing either.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

# What ``check`` hashes: a label of its own, so a check never equals the hash of a document value.
_CHECK_LABEL = b"mongo-cdc field.hash.list key check"
_int32 = struct.Struct("<i")


class HashKey:
    """The secret of ``field.hash.list``; shown as ``HashKey(<secret>)`` wherever it is printed."""

    __slots__ = ("_secret", "_keyed")

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise ValueError("the field.hash.list key is empty")
        self._secret = secret
        # the HMAC with the key already absorbed: each value copies it rather than keying anew
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)

    def __repr__(self) -> str:
        return "HashKey(<secret>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashKey) and hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(self.check)

    @property
    def check(self) -> str:
        """16 hex digits that differ between two keys (an HMAC of a fixed label): safe to store."""
        return hmac.new(self._secret, _CHECK_LABEL, hashlib.sha256).hexdigest()[:16]

    def hashed_string(self, kind: int, value: bytes) -> bytes:
        """The value bytes of a BSON string holding the hex HMAC of the element ``kind`` + ``value``."""
        keyed = self._keyed.copy()
        keyed.update(bytes((kind,)))
        keyed.update(value)
        digest = keyed.hexdigest().encode()
        return _int32.pack(len(digest) + 1) + digest + b"\x00"
