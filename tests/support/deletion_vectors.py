"""Deletion vectors written by hand, as the Delta protocol (PROTOCOL.md, "Deletion Vectors" and the
appendix "Deletion Vector Format") lays them out, on a table delta-rs wrote.

delta-rs reads deletion vectors but does not write them, so this is how the tests get a table with
one: ``add_deletion_vector`` upgrades the protocol to reader 3 / writer 7 with the
``deletionVectors`` feature and commits the removal of one data file and its re-adding with a
``deletionVector`` that marks some of its rows deleted, stored in a ``deletion_vector_<uuid>.bin``
file (``storageType`` 'u') or inline in the log ('i'). The bitmap is the portable 64-bit
RoaringBitmap with Delta's magic number; only array containers are written (at most 4096 rows per
65536), which is all a small test table needs.
"""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
import zlib
from collections.abc import Iterable
from typing import Any

# PROTOCOL.md appendix "Deletion Vector Format": the portable RoaringBitmapArray's magic number
PORTABLE_MAGIC = 1681511377
# RoaringFormatSpec: the cookie of a 32-bit bitmap without run containers (offsets always follow)
SERIAL_COOKIE_NO_RUNCONTAINER = 12346
ARRAY_CONTAINER_LIMIT = 4096
DV_FILE_FORMAT_VERSION = 1
Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
DV_PROTOCOL = {
    "minReaderVersion": 3,
    "minWriterVersion": 7,
    "readerFeatures": ["deletionVectors"],
    # writer 7 lists every feature: delta-rs' default writer 2 implies appendOnly and invariants
    "writerFeatures": ["appendOnly", "invariants", "deletionVectors"],
}


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ RFC 32) of ``data``, zero-padded to a multiple of 4 bytes as Delta does (the
    descriptor's ``sizeInBytes`` says how many bytes are real)."""
    padded = data + b"\0" * (-len(data) % 4)
    chars = []
    for start in range(0, len(padded), 4):
        value = int.from_bytes(padded[start : start + 4], "big")
        block = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            block.append(Z85_ALPHABET[digit])
        chars.extend(reversed(block))
    return "".join(chars)


def _bitmap32(values: list[int]) -> bytes:
    """A 32-bit RoaringBitmap in the portable format, array containers only."""
    containers: dict[int, list[int]] = {}
    for value in values:
        containers.setdefault(value >> 16, []).append(value & 0xFFFF)
    header = struct.pack("<II", SERIAL_COOKIE_NO_RUNCONTAINER, len(containers))
    offset = len(header) + 8 * len(containers)  # key/cardinality pairs, then the offsets
    keys, offsets, bodies = b"", b"", b""
    for key, lows in sorted(containers.items()):
        if len(lows) > ARRAY_CONTAINER_LIMIT:
            raise ValueError(f"more than {ARRAY_CONTAINER_LIMIT} rows in one 65536: needs a bitmap container")
        keys += struct.pack("<HH", key, len(lows) - 1)
        offsets += struct.pack("<I", offset + len(bodies))
        bodies += struct.pack(f"<{len(lows)}H", *lows)
    return header + keys + offsets + bodies


def serialize_rows(rows: Iterable[int]) -> bytes:
    """The row indexes as Delta's portable RoaringBitmapArray: magic number, bucket count, and per
    bucket (the indexes' high 32 bits) its key and a 32-bit bitmap of the low 32 bits."""
    buckets: dict[int, list[int]] = {}
    for row in sorted(set(rows)):
        buckets.setdefault(row >> 32, []).append(row & 0xFFFFFFFF)
    body = struct.pack("<iQ", PORTABLE_MAGIC, len(buckets))
    for key, lows in sorted(buckets.items()):
        body += struct.pack("<I", key) + _bitmap32(lows)
    return body


def _dv_file(table_uri: str, bitmap: bytes) -> dict[str, Any]:
    """Write ``bitmap`` as the only DV of a new DV file in the table's root; its descriptor."""
    file_id = uuid.uuid4()
    checksum = zlib.crc32(bitmap)
    with open(os.path.join(table_uri, f"deletion_vector_{file_id}.bin"), "xb") as out:
        out.write(bytes([DV_FILE_FORMAT_VERSION]))
        out.write(struct.pack(">I", len(bitmap)) + bitmap + struct.pack(">I", checksum))
    # offset: where the DV's size prefix starts, right after the file's version byte
    return {"storageType": "u", "pathOrInlineDv": z85_encode(file_id.bytes), "offset": 1}


def _log_actions(table_uri: str) -> tuple[int, list[dict[str, Any]]]:
    """The table's latest version and every action of its JSON commits (no checkpoints here)."""
    log = os.path.join(table_uri, "_delta_log")
    commits = sorted(name for name in os.listdir(log) if name.endswith(".json"))
    actions = []
    for name in commits:
        with open(os.path.join(log, name), encoding="utf-8") as commit:
            actions += [json.loads(line) for line in commit if line.strip()]
    return int(commits[-1].removesuffix(".json")), actions


def live_adds(table_uri: str) -> dict[str, dict[str, Any]]:
    """The add action of each live file of the latest version, by path (its ``deletionVector``
    says whether the file has rows deleted by one)."""
    adds: dict[str, dict[str, Any]] = {}
    for action in _log_actions(table_uri)[1]:
        if "add" in action:
            adds[action["add"]["path"]] = action["add"]
        elif "remove" in action:
            adds.pop(action["remove"]["path"], None)
    return adds


def add_deletion_vector(table_uri: str, path: str, rows: Iterable[int], storage: str = "u") -> int:
    """Commit a DV deleting ``rows`` (indexes in the file, from 0) of the live data file ``path``
    (relative, as the log names it), stored in a file ('u') or inline ('i'); the new version."""
    version, _ = _log_actions(table_uri)
    # delta-rs writes absent fields as nulls: left out, the add is as a Delta writer would write it
    add = {key: value for key, value in live_adds(table_uri)[path].items() if value is not None}
    if "deletionVector" in add:
        raise ValueError(f"{path} already has a deletion vector: this helper does not merge them")
    bitmap = serialize_rows(rows)
    if storage == "u":
        descriptor = _dv_file(table_uri, bitmap)
    elif storage == "i":
        descriptor = {"storageType": "i", "pathOrInlineDv": z85_encode(bitmap)}
    else:
        raise ValueError(f"storage {storage!r}: 'u' (a DV file) or 'i' (inline) only")
    descriptor |= {"sizeInBytes": len(bitmap), "cardinality": len(set(rows))}
    if "numRecords" not in json.loads(add.get("stats") or "{}"):
        raise ValueError(f"{path} has no numRecords statistic: the protocol requires it with a DV")
    now = int(time.time() * 1000)
    remove = {
        "path": path,
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": add.get("partitionValues", {}),
        "size": add["size"],
    }
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "DELETE", "operationParameters": {}}},
        {"protocol": DV_PROTOCOL},
        {"remove": remove},
        {"add": add | {"dataChange": True, "modificationTime": now, "deletionVector": descriptor}},
    ]
    commit = os.path.join(table_uri, "_delta_log", f"{version + 1:020d}.json")
    with open(commit, "x", encoding="utf-8") as out:  # "x": a racing commit fails, as in Delta
        out.write("".join(json.dumps(action) + "\n" for action in actions))
    return version + 1
