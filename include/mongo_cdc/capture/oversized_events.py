"""Change events over MongoDB's 16 MB limit: Debezium's ``cursor.oversize.handling.mode``.

The server builds an event (an update's looked-up ``fullDocument`` next to its
``updateDescription``, say) before it checks its size, and fails the whole change stream with
BSONObjectTooLarge when it is too big to send, so every event after it is stuck as well.

* ``fail`` (the default): the pull fails saying so; the offset stays at the last landed batch.
* ``skip``: a stage added to the stream's pipeline measures each event's large parts with
  ``$bsonSize`` (each of them fits in 16 MB on its own) and replaces an event over the limit (or
  over ``cursor.oversize.skip.threshold``) by a small marker with its resume token, namespace,
  key and size. The pull logs and counts the marker and lands nothing for it; every other event
  goes on as usual.
* ``split``: ``$changeStreamSplitLargeEvent`` (MongoDB 7.0, and 6.0.9 on) cuts an event into
  fragments, which ``FragmentJoiner`` puts back together; older servers are refused when the
  pull starts.
"""

from __future__ import annotations

from typing import Any

from pymongo import MongoClient

from mongo_cdc.config.oversize_mode_table import OVERSIZE_MODES

BSON_OBJECT_TOO_LARGE = 10334
MAX_EVENT_BYTES = 16 * 1024 * 1024
# room for what an event holds besides its documents: token, namespace, key, times, lsid...
_EVENT_OVERHEAD_BYTES = 64 * 1024
OVERSIZED_MARKER = "mongoCdcOversizedBytes"
_LARGE_PARTS = ("$fullDocument", "$fullDocumentBeforeChange", "$updateDescription")
# lsid/txnNumber too: a skipped event inside a transaction must not look like its end
_KEPT_FIELDS = ("_id", "operationType", "ns", "documentKey", "clusterTime", "wallTime", "lsid", "txnNumber")


class OversizedEventError(RuntimeError):
    """A change event is too large to be read in the configured mode."""


def skip_limit(threshold: int) -> int:
    """Largest event size kept in ``skip`` mode: the threshold, or what the server can still send."""
    return threshold if threshold > 0 else MAX_EVENT_BYTES - _EVENT_OVERHEAD_BYTES


def pipeline(mode: str, threshold: int) -> list[dict[str, Any]]:
    """Change-stream pipeline stages for a mode (the resume token ``_id`` is never touched)."""
    handling = OVERSIZE_MODES[mode]
    if handling.splits:
        return [{"$changeStreamSplitLargeEvent": {}}]
    if not handling.skips:
        return []
    size = {"$add": [{"$ifNull": [{"$bsonSize": part}, 0]} for part in _LARGE_PARTS]}
    marker = {name: f"${name}" for name in _KEPT_FIELDS}
    marker[OVERSIZED_MARKER] = size
    return [
        {
            "$replaceWith": {
                "$cond": {"if": {"$gt": [size, skip_limit(threshold)]}, "then": marker, "else": "$$ROOT"}
            }
        }
    ]


def supports_split(client: MongoClient) -> bool:
    """Whether the server knows ``$changeStreamSplitLargeEvent`` (7.0 on, and 6.0.9 on in 6.0)."""
    major, minor, patch = client.admin.command("buildInfo")["versionArray"][:3]
    return (major, minor) >= (7, 0) or (major, minor, patch) >= (6, 0, 9)


def check_split_supported(client: MongoClient, rs: str) -> None:
    if not supports_split(client):
        version = client.admin.command("buildInfo")["version"]
        raise OversizedEventError(
            f"replica set {rs} runs MongoDB {version}, which cannot split large change events "
            "($changeStreamSplitLargeEvent needs 7.0, or 6.0.9 and later): set "
            "cursor.oversize.handling.mode to skip (oversized events are counted, not landed) or "
            "fail (the default), or upgrade the server"
        )


def too_large_error(rs: str, offset_key: str, batch_seq: int) -> OversizedEventError:
    return OversizedEventError(
        f"replica set {rs}: a change event after batch {batch_seq} is larger than MongoDB's 16 MB "
        f"limit (BSONObjectTooLarge), so the change stream cannot go past it. Offset '{offset_key}' is "
        "unchanged. Set cursor.oversize.handling.mode: skip to leave such events out (each is logged "
        "and counted), or split on MongoDB 7.0 / 6.0.9 and later; with capture.mode "
        "change_streams_update_full, change_streams (no looked-up document) also keeps updates small."
    )


def is_oversized_marker(change: dict) -> bool:
    return OVERSIZED_MARKER in change


class FragmentJoiner:
    """Puts the fragments of a split event (``splitEvent: {fragment, of}``) back into one event.

    Each fragment carries some of the event's top-level fields and its own resume token; the
    joined event takes the last fragment's token, so a batch is only ever landed (and its token
    committed) after a whole event.
    """

    def __init__(self) -> None:
        self._fragments: list[dict[str, Any]] = []

    @property
    def pending(self) -> bool:
        """Fragments of an event are waiting: its position is not one to land or commit at."""
        return bool(self._fragments)

    def add(self, change: dict) -> dict | None:
        """The whole event once its last fragment arrives; None while fragments are missing."""
        split = change.get("splitEvent")
        if split is None:
            if self._fragments:
                raise OversizedEventError("a split change event ended before its last fragment arrived")
            return change
        if split["fragment"] != len(self._fragments) + 1:
            raise OversizedEventError(
                f"split change event: fragment {split['fragment']} of {split['of']} arrived after "
                f"{len(self._fragments)} fragments"
            )
        self._fragments.append({name: value for name, value in change.items() if name != "splitEvent"})
        if split["fragment"] < split["of"]:
            return None
        joined: dict[str, Any] = {}
        for fragment in self._fragments:
            joined.update(fragment)
        self._fragments = []
        return joined
