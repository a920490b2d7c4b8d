"""A change stream read one getMore ahead: the server prepares the next batch while the pull lands
this one. ``read_events`` is one read; ``ReadAhead`` runs it on a thread of its own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mongo_cdc.capture.change_cursor import event_fields, plain_token, token_cluster_time


def read_events(stream: Any, limit: int) -> tuple[list[dict], dict | None]:
    """The next events of ``stream`` (read raw: ``change_cursor.open_change_stream``) as
    ``change_cursor.event_fields``, up to ``limit`` (a getMore's worth: the stream's batch size),
    and, when the stream ran out of events, its resume token then (its post-batch token).

    The pull's per-read work (progress, the primary check) is done once per call, not per event.
    """
    events: list[dict] = []
    while len(events) < limit:
        change = stream.try_next()
        if change is None:
            return events, plain_token(stream.resume_token)
        events.append(event_fields(change))
        if not _has_buffered(stream):  # the getMore's events are all here: the next read asks again
            break
    return events, None


def _has_buffered(stream: Any) -> bool:
    """Whether events of the last getMore are still to be taken from the stream."""
    cursor = getattr(stream, "_cursor", None)
    return cursor is None or cursor._has_next()


class ReadAhead:
    """``read_events`` one call ahead on a thread of its own: the server prepares (and the socket
    receives) the next getMore while this one is landed, instead of one after the other.

    Only that thread touches the stream until ``close``, which waits for the read in flight (at
    most ``POLL_INTERVAL_MS`` on an idle stream). A read that found the stream idle at ``target``
    is not followed by another: a caught-up pull has nothing more to ask for, unless it asks.
    """

    def __init__(self, stream: Any, limit: int, target: int) -> None:
        self._stream, self._limit, self._target = stream, limit, target
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="change-stream-read")
        self._ahead = self._thread.submit(read_events, stream, limit)

    def next(self) -> tuple[list[dict], dict | None]:
        if self._ahead is None:
            self._ahead = self._thread.submit(read_events, self._stream, self._limit)
        events, idle_token = self._ahead.result()  # a read's error is raised here, in the pull
        caught_up = idle_token is not None and token_cluster_time(idle_token) >= self._target
        self._ahead = None if caught_up else self._thread.submit(read_events, self._stream, self._limit)
        return events, idle_token

    def close(self) -> None:
        self._thread.shutdown(wait=True)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
