"""Folding a document's change events, in order, into its latest version.

Events are ordered by ``ChangeEvent.position``. An event at or before the position already
reached is skipped, so a replayed (duplicate or older) event never overwrites newer state and
folding the same events twice gives the same result. A deletion is a version without a document.

An update without ``after`` is applied to the previous version like MongoDB would: removed
fields deleted (an array element unset to null), truncated arrays cut, then updated fields set
(a numeric path component indexes an array; setting past its end pads with nulls; a missing
parent becomes a document; an existing field is replaced where it stands, a new one appended).
With no previous version known, it applies to ``{"_id": ...}`` and the state holds only what the
updates set.

A complete snapshot of a collection at position P (a ``SnapshotManifest``) also says which
documents are gone: a live document whose latest event came from the snapshot's replica set
before P, and that the snapshot therefore did not read, was deleted while nobody streamed (an
oplog lost, a source reset). ``reconcile_with_snapshots`` turns it into a deletion at P. A drop
or rename of the collection deletes the documents written before it (``drop_with_collection``). Only
the snapshot's own replica set counts because a shard's snapshot sees that shard's documents only.
A filtered re-snapshot of an ``_id`` range proves only the documents of its range gone
(``SnapshotManifest.id_range``, ``id_ranges``).

Updates apply to BSON elements (``mongo_cdc.bson_elements``), never to decoded values: every
element an update does not touch keeps its bytes, and each value set is the element of the event's
``updatedFields`` (BSON whose field names are dotted paths) as it stands there, so the result is
what MongoDB stores, for every BSON type. Folding never modifies an event or the previous version.

Known limit: a field name containing a dot cannot be told apart from a nested path (the raw
events carry no ``disambiguatedPaths``), so such updates set the nested path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import bson
import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc import extjson
from mongo_cdc.bson_elements import (
    ARRAY,
    DOCUMENT,
    NULL,
    Container,
    DamagedBson,
    array_index,
    document_bytes,
    element_bytes,
)
from mongo_cdc.id_ranges import IdRange
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.transform.raw_events import ChangeEvent, WholeDocument, as_dict


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
    # The document opened while updates without `after` are applied; its bytes are stale then.
    opened: Container | None = None
    for event in sorted(events, key=lambda event: event.position):
        if event.op is None or (version is not None and event.position <= version.position):
            continue
        document_id_json = event.document_id_json
        if event.op == "d":
            data, opened = None, None
        elif event.after_bson is not None:
            data, opened = event.after_bson, None
            document_id_json = current_id_json(event.after, event.document_id_json)
        elif event.op == "u" and event.update_description is not None:
            try:
                if opened is None:
                    opened = Container(DOCUMENT, _document_to_update(event, version))
                _apply(opened, event.update_description)
            except DamagedBson as damage:
                raise DamagedBson(
                    f"the update of document {document_id_json} at {event.position} cannot be applied: "
                    f"{damage} (its stored version or the event's updatedFields is damaged)"
                ) from damage
            data = None
        else:
            continue  # no document data to apply (an update whose lookup found nothing)
        version = DocumentVersion(
            key, document_id_json, data, event.cluster_time, event.event_order, event.rs
        )
    if opened is not None and version is not None:
        version = version._replace(document=opened.to_bytes())
    return version


# An ObjectId or string _id is equal only to itself, so its text is the document's own (only
# numbers of other types, alone or inside a document or array, compare equal across types).
_SAME_TYPE_IDS = ('{"$oid":', '"')


def own_type_ids(event_id_jsons: pa.Array) -> pa.Array:
    """Whether each event's _id (``ChangeEvent.document_id_json``) is its document's own, whatever
    the document (``current_id_json``), column-wise."""
    own = [pc.starts_with(event_id_jsons, prefix) for prefix in _SAME_TYPE_IDS]
    return pc.fill_null(pc.or_(*own), False)


def current_id_json(document: dict | WholeDocument | None, event_id_json: str) -> str:
    """The Extended JSON of ``document``'s own _id (a replace may change its type, not its value),
    else the event's (``ChangeEvent.document_id_json``)."""
    if document is None or event_id_json.startswith(_SAME_TYPE_IDS):
        return event_id_json
    values = as_dict(document)
    return extjson.encode_str(values["_id"]) if "_id" in values else event_id_json


def reconcile_with_snapshots(
    version: DocumentVersion, snapshots: Iterable[SnapshotManifest]
) -> DocumentVersion:
    """``version`` deleted at the latest snapshot of its replica set that did not read it, if any.

    ``snapshots`` are complete snapshots of the document's collection (or of an ``_id`` range of
    it) whose events are already folded into ``version``: a document one of them read sits at or
    after that snapshot's position.
    """
    missed_by = [
        snapshot.position
        for snapshot in snapshots
        if snapshot.rs == version.rs
        and version.position < snapshot.position
        and (snapshot.id_range is None or IdRange.of_text(snapshot.id_range).holds(version.key))
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


def _document_to_update(event: ChangeEvent, version: DocumentVersion | None) -> bytes:
    if version is not None and version.document is not None:
        return version.document
    return bson.encode({"_id": event.document_id})


def apply_update(document: bytes, update_description: dict[str, Any]) -> bytes:
    """``document`` (BSON) with a change event's updateDescription applied: ``updatedFields`` is
    BSON, ``removedFields`` and each of ``truncatedArrays``' ``field`` dotted paths."""
    opened = Container(DOCUMENT, document)
    _apply(opened, update_description)
    return opened.to_bytes()


def _apply(document: Container, update_description: dict[str, Any]) -> None:
    for path in update_description.get("removedFields") or ():
        _remove(document, path.encode().split(b"."))
    for truncation in update_description.get("truncatedArrays") or ():
        _truncate(document, truncation["field"].encode().split(b"."), truncation["newSize"])
    updated_fields = update_description.get("updatedFields")
    if updated_fields:
        updated = Container(DOCUMENT, updated_fields)
        for position, path in enumerate(updated.names):
            _set(document, path.split(b"."), updated.kinds[position], updated.value(position))


def _descend(document: Container, parents: list[bytes]) -> tuple[Container, int]:
    """The last document or array ``parents`` lead to, and how many of them were followed."""
    container = document
    for followed, part in enumerate(parents):
        position = container.position(part)
        inner = container.opened(position) if position is not None else None
        if inner is None:
            return container, followed
        container = inner
    return container, len(parents)


def _set(document: Container, parts: list[bytes], kind: int, value: bytes) -> None:
    """``$set`` of a dotted path: a missing parent (or one MongoDB would have refused to set into)
    becomes a document holding the rest of the path."""
    container, followed = _descend(document, parts[:-1])
    for part in reversed(parts[followed + 1 :]):
        kind, value = DOCUMENT, document_bytes([element_bytes(kind, part, value)])
    name = parts[followed]
    position = container.position(name)
    if position is not None:  # replaced where it stands
        container.replace(position, kind, value)
    elif container.kind == DOCUMENT:
        container.append(name, kind, value)
    elif (index := array_index(name)) is not None:  # past the array's end: padded with nulls
        while len(container) < index:
            container.append(b"%d" % len(container), NULL, b"")
        container.append(b"%d" % index, kind, value)
    # else a field name in an array: MongoDB refuses the update


def _remove(document: Container, parts: list[bytes]) -> None:
    container, followed = _descend(document, parts[:-1])
    position = container.position(parts[-1]) if followed == len(parts) - 1 else None
    if position is None:
        return
    if container.kind == DOCUMENT:
        container.remove(position)
    else:  # $unset of an array element leaves a null in its place
        container.replace(position, NULL, b"")


def _truncate(document: Container, parts: list[bytes], size: int) -> None:
    container, followed = _descend(document, parts)
    if followed == len(parts) and container.kind == ARRAY:
        container.truncate(size)
