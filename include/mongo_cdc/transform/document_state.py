"""Folding a document's change events, in order, into its latest version.

Events are ordered by ``ChangeEvent.position``. An event at or before the position already
reached is skipped, so a replayed (duplicate or older) event never overwrites newer state and
folding the same events twice gives the same result. A deletion is a version without a document.

An update without ``after`` is applied to the previous version like MongoDB would: removed
fields deleted, truncated arrays cut, then updated fields set (a numeric path component indexes
an array; setting past its end pads with nulls). With no previous version known, it applies to
``{"_id": ...}`` and the state holds only what the updates set.

A complete snapshot of a collection at position P (a ``SnapshotManifest``) also says which
documents are gone: a live document whose latest event came from the snapshot's replica set
before P, and that the snapshot therefore did not read, was deleted while nobody streamed (an
oplog lost, a source reset). ``reconcile_with_snapshots`` turns it into a deletion at P. A drop
or rename of the collection deletes the documents written before it (``drop_with_collection``). Only
the snapshot's own replica set counts because a shard's snapshot sees that shard's documents only.

Documents are BSON-decoded values (``bson.decode(data, extjson.DECODE_OPTIONS)``); an
update's ``updatedFields`` is a decoded document whose field names are dotted paths. Folding
never modifies an event's or the previous version's document: updates apply to a copy.

Known limit: a field name containing a dot cannot be told apart from a nested path (the raw
events carry no ``disambiguatedPaths``), so such updates set the nested path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import bson

from mongo_cdc import extjson
from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.transform.raw_events import ChangeEvent


class DocumentVersion(NamedTuple):
    """A document's latest version: what the state table holds of it (or a deletion, document None)."""

    key: str  # the normalised _id (transform.keys): equal _ids in MongoDB's eyes have one key
    document_id_json: str  # Extended JSON of _id as the document holds it now
    document: bytes | None  # BSON; None once deleted
    cluster_time: int
    event_order: str
    rs: str | None  # the replica set of the last event applied

    @property
    def position(self) -> tuple[int, str]:
        return self.cluster_time, self.event_order


def fold_events(
    key: str, previous: DocumentVersion | None, events: Iterable[ChangeEvent]
) -> DocumentVersion | None:
    """The version after applying ``events`` (any order) to ``previous``; None if nothing is known."""
    version = previous
    # The decoded document while updates without `after` are applied; its bytes are stale then.
    parsed: dict | None = None
    for event in sorted(events, key=lambda event: event.position):
        if event.op is None or (version is not None and event.position <= version.position):
            continue
        document_id_json = event.document_id_json
        if event.op == "d":
            data, parsed = None, None
        elif event.after_bson is not None:
            data, parsed = event.after_bson, None
            document_id_json = current_id_json(event.after, event.document_id_json)
        elif event.op == "u" and event.update_description is not None:
            if parsed is None:
                parsed = _document_to_update(event, version)
            apply_update(parsed, event.update_description)
            data = None
        else:
            continue  # no document data to apply (an update whose lookup found nothing)
        version = DocumentVersion(
            key, document_id_json, data, event.cluster_time, event.event_order, event.rs
        )
    if parsed is not None and version is not None:
        version = version._replace(document=bson.encode(parsed))
    return version


# An ObjectId or string _id is equal only to itself, so its text is the document's own (only
# numbers of other types, alone or inside a document or array, compare equal across types).
_SAME_TYPE_IDS = ('{"$oid":', '"')


def current_id_json(document: dict | None, event_id_json: str) -> str:
    """The Extended JSON of ``document``'s own _id (a replace may change its type, not its value),
    else the event's (``ChangeEvent.document_id_json``)."""
    if document is None or "_id" not in document or event_id_json.startswith(_SAME_TYPE_IDS):
        return event_id_json
    return extjson.encode_str(document["_id"])


def reconcile_with_snapshots(
    version: DocumentVersion, snapshots: Iterable[SnapshotManifest]
) -> DocumentVersion:
    """``version`` deleted at the latest snapshot of its replica set that did not read it, if any.

    ``snapshots`` are complete snapshots of the document's collection whose events are already
    folded into ``version``: a document one of them read sits at or after that snapshot's position.
    """
    missed_by = [
        snapshot.position
        for snapshot in snapshots
        if snapshot.rs == version.rs and version.position < snapshot.position
    ]
    if version.document is None or not missed_by:
        return version
    cluster_time, event_order = max(missed_by)
    return version._replace(document=None, cluster_time=cluster_time, event_order=event_order)


def drop_with_collection(
    version: DocumentVersion, drops: Iterable[tuple[tuple[int, str], str]]
) -> DocumentVersion:
    """``version`` deleted at the latest drop (or rename away) of its collection that came after it.

    ``drops``: (position, replica set) of the collection's drop and rename events. Only drops on
    the document's own replica set count: each shard drops its own part of a collection.
    """
    after = [position for position, rs in drops if rs == version.rs and version.position < position]
    if version.document is None or not after:
        return version
    cluster_time, event_order = max(after)
    return version._replace(document=None, cluster_time=cluster_time, event_order=event_order)


def _document_to_update(event: ChangeEvent, version: DocumentVersion | None) -> dict:
    if version is not None and version.document is not None:
        return bson.decode(version.document, DECODE_OPTIONS)  # a new dict: the version stays as it is
    return {"_id": event.document_id}


def _copied(value: Any) -> Any:
    """A copy of a decoded document whose documents and arrays are new (BSON scalars are immutable)."""
    if isinstance(value, dict):
        return {name: _copied(inner) for name, inner in value.items()}
    if isinstance(value, list):
        return [_copied(element) for element in value]
    return value


def apply_update(document: dict, update_description: dict[str, Any]) -> dict:
    """Apply a change event's updateDescription to ``document`` in place (and return it)."""
    for path in update_description.get("removedFields") or ():
        _remove_path(document, path.split("."))
    for truncation in update_description.get("truncatedArrays") or ():
        array = _get_path(document, truncation["field"].split("."))
        if isinstance(array, list):
            del array[truncation["newSize"] :]
    updated_fields = update_description.get("updatedFields")
    if updated_fields:
        for path, value in updated_fields.items():
            set_path(document, path, _copied(value))
    return document


def set_path(document: dict, path: str, value: Any) -> None:
    """Set a dotted ``path`` like MongoDB's ``$set``: missing parents become documents."""
    *parents, last = path.split(".")
    container: Any = document
    for part in parents:
        child = _child(container, part)
        if not isinstance(child, (dict, list)):
            child = {}
            if not _assign(container, part, child):
                return
        container = child
    _assign(container, last, value)


def _array_index(part: str) -> int | None:
    return int(part) if part.isascii() and part.isdigit() else None


def _child(container: Any, part: str) -> Any:
    if isinstance(container, dict):
        return container.get(part)
    index = _array_index(part)
    if isinstance(container, list) and index is not None and index < len(container):
        return container[index]
    return None


def _assign(container: Any, part: str, value: Any) -> bool:
    """Set one path component; False where MongoDB would have refused the path."""
    if isinstance(container, dict):
        container[part] = value
        return True
    index = _array_index(part)
    if not isinstance(container, list) or index is None:
        return False
    container.extend([None] * (index + 1 - len(container)))
    container[index] = value
    return True


def _get_path(document: dict, parts: list[str]) -> Any:
    container: Any = document
    for part in parts:
        container = _child(container, part)
    return container


def _remove_path(document: dict, parts: list[str]) -> None:
    parent = _get_path(document, parts[:-1])
    if isinstance(parent, dict):
        parent.pop(parts[-1], None)
    elif _child(parent, parts[-1]) is not None:
        parent[int(parts[-1])] = None  # $unset of an array element leaves a null in its place
