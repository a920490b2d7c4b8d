"""The pull reads the next getMore while it lands the current one (``read_ahead.ReadAhead``).

A scripted stream (a real one cannot be paused between getMores to look at what was asked of it).
"""

from __future__ import annotations

import threading

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from pymongo.errors import ConnectionFailure

from mongo_cdc.capture.read_ahead import ReadAhead
from mongo_cdc.lake import pack_cluster_time


def _token(seconds: int) -> dict:
    return {"_data": f"82{pack_cluster_time(seconds, 1):016X}01"}


class _ScriptedStream:
    """Raw events in getMores of ``limit``, then empty reads whose post-batch token is at ``idle_at``."""

    def __init__(self, events: int, idle_at: int, fail_after: int | None = None) -> None:
        self.left = events
        self.idle_at = idle_at
        self.fail_after = fail_after
        self.calls = 0
        self.reader_threads: set[str] = set()
        self.resume_token: dict | None = None

    def try_next(self) -> RawBSONDocument | None:
        self.calls += 1
        self.reader_threads.add(threading.current_thread().name)
        if self.fail_after is not None and self.calls > self.fail_after:
            raise ConnectionFailure("connection reset")
        if self.left:
            self.left -= 1
            self.resume_token = _token(100)
            return RawBSONDocument(bson.encode({"_id": self.resume_token}))  # as a pull's stream reads it
        self.resume_token = _token(self.idle_at)
        return None


def test_the_next_read_is_under_way_while_this_one_is_landed_and_none_after_catching_up():
    stream = _ScriptedStream(events=5, idle_at=200)
    reads = ReadAhead(stream, limit=2, target=pack_cluster_time(150, 1))
    try:
        first, idle = reads.next()
        assert len(first) == 2 and idle is None
        # before the caller asks again, the next read has already taken its events
        reads._ahead.result()  # type: ignore[union-attr]
        assert stream.left == 1
        assert [len(reads.next()[0]), len(reads.next()[0])] == [2, 1]
        events, idle = reads.next()
        assert events == [] and idle == _token(200)
        calls = stream.calls
    finally:
        reads.close()
    # idle at the target: no read was started after it
    assert stream.calls == calls
    assert all(name.startswith("change-stream-read") for name in stream.reader_threads)


def test_an_idle_read_before_the_target_is_followed_and_a_read_error_reaches_the_caller():
    stream = _ScriptedStream(events=0, idle_at=120, fail_after=2)
    reads = ReadAhead(stream, limit=2, target=pack_cluster_time(150, 1))
    try:
        assert reads.next() == ([], _token(120))  # not caught up yet: the next read goes on
        assert reads.next() == ([], _token(120))
        with pytest.raises(ConnectionFailure, match="connection reset"):
            reads.next()
    finally:
        reads.close()
