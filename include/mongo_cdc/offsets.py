"""Per-replica-set offsets: where streaming resumes, which raw batches are committed, what is in flight.

An offset is JSON held in one key (an Airflow Variable ``mongo_cdc.<source>.<replica set>``
in production; the store is pluggable so this module stays free of Airflow)::

    {
      "format": 1,
      "resume_token": {"_data": "8264..."},   # change stream resumes after this event (Extended JSON:
                                                # tokens may carry binary "_typeBits")
      "cluster_time": 7441212415188369409,      # (t << 32) | i of that position
      "batch_seq": 42,                          # raw files with seq <= this are committed
      "snapshot": {"status": "complete", "seq": 1, "cluster_time": ..., "completed_at": "..."},
      "pending": ["/lake/raw/.../rs0-000000000043-0000.parquet"],  # written, not yet committed
      "retired_at": "",                         # set once a removed shard's stream is drained
      "open_transaction": null,                 # a transaction the last batch ended inside of (its
                                                # counters, see transactions.OpenTransaction)
      "writer": {"dag_id": ..., "run_id": ..., "task_id": ..., "map_index": 0, "since": "..."},
      "updated_at": "2026-11-21T15:00:00+00:00"
    }

Exactly-once landing: before a batch is written its file paths go into ``pending``; the files are
written; then the new ``resume_token``/``batch_seq`` are committed with ``pending`` emptied in one
store write. A run that finds ``pending`` non-empty deletes those files first: they belong to a
batch that was written but never committed, and will be written again from the same position.

One writer per offset: a task claims the offset (``writer``) before it snapshots or pulls and
releases it when done. A second task finding the claim held by another task that is still
running is refused with a clear message; a claim left by a task that is no longer running (it
crashed) is taken over.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from bson import json_util

from mongo_cdc import extjson

FORMAT = 1


class OffsetStore(Protocol):
    """Key-value storage for offsets (Airflow Variables in production)."""

    def get(self, key: str) -> str | None: ...

    def set(self, key: str, value: str) -> None: ...


class OffsetError(ValueError):
    """A stored offset cannot be used; the message names the key and how to reset it."""


class WriterConflict(RuntimeError):
    """Another task, still running, is writing this offset."""


def offset_key(source: str, rs: str) -> str:
    return f"mongo_cdc.{source}.{rs}"


@dataclass(frozen=True)
class Offset:
    resume_token: dict | None = None
    cluster_time: int | None = None
    batch_seq: int = 0
    snapshot: dict = field(default_factory=dict)
    pending: tuple[str, ...] = ()
    retired_at: str = ""
    open_transaction: dict | None = None
    writer: dict | None = None
    updated_at: str = ""

    @property
    def snapshot_complete(self) -> bool:
        return self.snapshot.get("status") == "complete"

    def to_json(self) -> str:
        data = asdict(self)
        data["pending"] = list(self.pending)
        if self.resume_token is not None:
            data["resume_token"] = json.loads(extjson.encode(self.resume_token))
        data["format"] = FORMAT
        data["updated_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return json.dumps(data, sort_keys=True)


def _reset_hint(key: str) -> str:
    return (
        f"Fix or delete the Variable '{key}' (e.g. `airflow variables delete {key}`); "
        "without an offset the next run takes a new snapshot of that replica set."
    )


def parse_offset(key: str, text: str) -> Offset:
    """Validate stored JSON strictly: a hand-edited offset must never be half-trusted."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffsetError(f"offset '{key}' is not valid JSON ({exc}). {_reset_hint(key)}") from None
    problems = []
    if not isinstance(data, dict):
        raise OffsetError(f"offset '{key}' must be a JSON object. {_reset_hint(key)}")
    if data.get("format") != FORMAT:
        problems.append(f"'format' must be {FORMAT}")
    token = data.get("resume_token")
    if token is not None and not (isinstance(token, dict) and isinstance(token.get("_data"), str)):
        problems.append('\'resume_token\' must be null or {"_data": "<hex>"}')
    cluster_time = data.get("cluster_time")
    if cluster_time is not None and (isinstance(cluster_time, bool) or not isinstance(cluster_time, int)):
        problems.append("'cluster_time' must be null or an integer")
    if (token is None) != (cluster_time is None):
        problems.append("'resume_token' and 'cluster_time' must be set together")
    seq = data.get("batch_seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        problems.append("'batch_seq' must be a non-negative integer")
    if not isinstance(data.get("snapshot", {}), dict):
        problems.append("'snapshot' must be an object")
    pending = data.get("pending", [])
    if not isinstance(pending, list) or not all(isinstance(p, str) for p in pending):
        problems.append("'pending' must be a list of paths")
    if not isinstance(data.get("retired_at", ""), str):
        problems.append("'retired_at' must be a string")
    open_transaction = data.get("open_transaction")
    if open_transaction is not None and not _is_open_transaction(open_transaction):
        problems.append(
            "'open_transaction' must be null or an object with id (string), cluster_time, ts_ms and "
            "total_order (integers) and data_collections (an object of integers)"
        )
    writer = data.get("writer")
    if writer is not None and not (
        isinstance(writer, dict) and {"dag_id", "run_id", "task_id"} <= set(writer)
    ):
        problems.append("'writer' must be null or an object with dag_id, run_id and task_id")
    if problems:
        raise OffsetError(f"offset '{key}' is corrupted: {'; '.join(problems)}. {_reset_hint(key)}")
    return Offset(
        resume_token=json_util.loads(json.dumps(token)) if token is not None else None,
        cluster_time=cluster_time,
        batch_seq=seq,
        snapshot=data.get("snapshot", {}),
        pending=tuple(pending),
        retired_at=data.get("retired_at", ""),
        open_transaction=open_transaction,
        writer=writer,
        updated_at=data.get("updated_at", ""),
    )


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_open_transaction(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("id"), str)
        and all(_is_integer(value.get(name)) for name in ("cluster_time", "ts_ms", "total_order"))
        and isinstance(value.get("data_collections"), dict)
        and all(_is_integer(count) for count in value["data_collections"].values())
    )


def _same_task(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("dag_id", "run_id", "task_id", "map_index"))


class OffsetKeeper:
    """Reads and commits one replica set's offset, enforcing the pending-files protocol."""

    def __init__(self, store: OffsetStore, source: str, rs: str) -> None:
        self.store = store
        self.key = offset_key(source, rs)

    def claim(self, writer: dict, still_running: Callable[[dict], bool]) -> None:
        """Become the offset's only writer, unless another task that is still running holds it."""
        offset = self.load()
        holder = offset.writer if offset else None
        if holder and not _same_task(holder, writer) and still_running(holder):
            raise WriterConflict(
                f"offset '{self.key}' is being written by task {holder['task_id']} "
                f"(map index {holder.get('map_index')}) of run {holder['run_id']} "
                f"since {holder.get('since')}; "
                "a second writer is refused so no batch is committed twice. Let that run finish; "
                "if it is gone, mark that task failed and run again."
            )
        since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        if offset is not None:
            self.save(replace(offset, writer={**writer, "since": since}))
        # with no offset yet the snapshot creates it; the claim is made once it exists

    def release(self, writer: dict) -> None:
        offset = self.load()
        if offset is not None and offset.writer and _same_task(offset.writer, writer):
            self.save(replace(offset, writer=None))

    def load(self) -> Offset | None:
        text = self.store.get(self.key)
        return None if text is None else parse_offset(self.key, text)

    def save(self, offset: Offset) -> None:
        self.store.set(self.key, offset.to_json())

    def discard_uncommitted(self, offset: Offset) -> Offset:
        """Delete files of a batch that was written but never committed; return the cleaned offset."""
        if not offset.pending:
            return offset
        for pattern in offset.pending:
            for path in glob.glob(pattern):
                os.remove(path)
        cleaned = replace(offset, pending=())
        self.save(cleaned)
        return cleaned

    def begin_batch(self, offset: Offset, paths: list[str]) -> Offset:
        staged = replace(offset, pending=tuple(paths))
        self.save(staged)
        return staged

    def commit(self, offset: Offset, **changes: Any) -> Offset:
        committed = replace(offset, pending=(), **changes)
        self.save(committed)
        return committed


class MemoryOffsetStore:
    """A dict-backed store for core-level tests and the benchmark."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value
