"""One row of the ``changes`` table from one event, like Debezium's ExtractNewDocumentState.

The document's fields become the row's columns, after the metadata columns
(``FlatteningOptions.metadata_columns``: the ``add.fields`` columns, then ``__deleted``,
``__cluster_time`` and ``__event_order``).

* ``r``/``c``, and ``u`` with ``after``: the fields of ``after``; a field the update removed is
  absent, so its column is null in this row (Debezium's ``$unset`` handling, full-document mode).
* ``u`` without ``after``: ``_id``, each updatedFields path set as a nested value
  (``{"a.b": 1}`` gives ``a = {b: 1}``) and each removedFields path set to null (Debezium's
  ``$unset`` handling without full documents). A numeric path component (``"arr.2"``) cannot be
  told from a field name here, so it nests like one (``arr = {"2": ...}``); if ``arr`` is an
  array elsewhere the column falls back to EJSON text. truncatedArrays is not represented (the
  state applies it).
* ``d`` and tombstones, per ``delete.tombstone.handling.mode`` (Debezium's meaning):

  ===========================  ====================================  ==========================
  mode                         delete event                          tombstone (``op`` null)
  ===========================  ====================================  ==========================
  ``rewrite`` (default)        delete row, ``__deleted`` true        no row
  ``rewrite-with-tombstone``   delete row, ``__deleted`` true        tombstone row
  ``tombstone``                tombstone row                         no row (the delete is it)
  ``drop``                     no row                                no row
  ===========================  ====================================  ==========================

  A delete row holds the fields of ``before`` when the event has one (the ``*_with_pre_image``
  capture modes; Debezium's DBZ-6725), else ``_id`` only. A tombstone row is a key without a
  value, whatever its delete carried: ``_id``, ``__deleted`` true, the positions, and every
  added field null (so ``__op`` is null). ``__deleted`` is false in every other row and is kept
  in all modes (Debezium adds it in the rewrite modes only) so a reader can always tell.

Then the document is encoded per the options: ``array.encoding: document`` turns every array
into a document ``{"_0": ..., "_1": ...}`` (an empty array into null: Parquet has no empty
structs), so elements of different types no longer merge into a fallback column;
``flatten.struct`` lifts nested documents' fields to top-level ``a<delimiter>b`` columns (arrays
stay as they are; an empty document stays a column of its own). If two paths of one document
flatten to the same name, the later one gets a leading ``_`` until the name is free.

Documents are BSON-decoded values: every ``dict`` is an embedded document, whatever its field
names (``{"$numberLong": "5"}`` is a document with a field ``$numberLong``); BSON types such as
ObjectId, dates or DBRefs are values, never documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import bson
import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc.extjson import READ_OPTIONS
from mongo_cdc.lake import COLLECTION_OPERATIONS
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_events import ChangeEvent, RowDocuments, WholeDocument, as_dict, event_from_row


def change_document(event: ChangeEvent) -> dict[str, Any] | None:
    """The document part of the change row, before encoding; None for a tombstone. It may be
    ``event.after`` itself: callers do not modify it."""
    if event.op is None:
        return None
    if event.op == "d" and event.before_bson is not None:
        return event.before
    if event.op != "d" and event.after_bson is not None:
        return event.after
    document = {"_id": event.document_id}
    if event.op == "d" or event.update_description is None:
        return document
    updated_fields = event.update_description.get("updatedFields")
    if updated_fields:
        for path, value in bson.decode(updated_fields, READ_OPTIONS).items():
            _set_nested(document, path, value)
    for path in event.update_description.get("removedFields") or ():
        _set_nested(document, path, None)
    return document


def _set_nested(document: dict, path: str, value: Any) -> None:
    """Set a dotted ``path`` as nested documents (``document`` holds only what the event sets, so
    a parent is a document this event made or missing, and then made)."""
    *parents, last = path.split(".")
    container = document
    for part in parents:
        child = container.get(part)
        if not isinstance(child, dict):
            child = container[part] = {}
        container = child
    container[last] = value


# How an event becomes a change row (``row_shape``): none, a key without a value, or the event's row.
TOMBSTONE_ROW = "tombstone"
EVENT_ROW = "event"


def row_shape(op: str | None, options: FlatteningOptions) -> str | None:
    """The change row of an event of operation ``op``: None (no row), ``TOMBSTONE_ROW`` (``_id``
    only, every added field null) or ``EVENT_ROW`` (``change_document``, added fields set)."""
    if op in COLLECTION_OPERATIONS:  # a drop or rename has no document: the raw zone records it
        return None
    mode = options.delete_tombstone_handling_mode
    if op is None:
        return TOMBSTONE_ROW if mode == "rewrite-with-tombstone" else None
    if op == "d":
        return {"drop": None, "tombstone": TOMBSTONE_ROW}.get(mode, EVENT_ROW)
    return EVENT_ROW


def delete_rows_hold_before_images(options: FlatteningOptions) -> bool:
    """Whether a delete event's change row takes its ``before`` (when it has one): only then does
    the transform read the raw ``before`` column."""
    return row_shape("d", options) == EVENT_ROW


def change_row(event: ChangeEvent, options: FlatteningOptions) -> tuple[tuple, dict[str, Any]] | None:
    """(values of ``options.metadata_columns``, encoded document) of the event's row; None for no row."""
    shape = row_shape(event.op, options)
    if shape is None:
        return None
    if shape == TOMBSTONE_ROW:
        added = (None,) * len(options.added_fields)
        document = {"_id": event.document_id}
    else:
        added = tuple(_event_value(event, field.path) for field in options.added_fields)
        document = change_document(event)
    deleted = event.op is None or event.op == "d"
    return added + (deleted, event.cluster_time, event.event_order), encode_document(document, options)


def _event_value(event: ChangeEvent, path: tuple[str, ...]) -> Any:
    if path == ("op",):
        return event.op
    if path == ("ts_ms",):
        return event.ts_ms
    return (event.source or {}).get(path[1])


# The raw columns of a change row's metadata, besides its added fields'.
_ROW_COLUMNS = ["op", "cluster_time", "event_order"]


def changes_table_rows(
    events: pa.Table, decoded: Sequence[dict | WholeDocument | None], options: FlatteningOptions
) -> tuple[pa.Array, dict[str, pa.Array], RowDocuments]:
    """``change_row`` of each raw row of ``events``, column-wise: (indices of the rows that have a
    change row, values of each of ``options.metadata_columns``, encoded documents).

    ``decoded``: each row's ``change_document`` where it is a whole document (a row's ``after``, or a
    delete's ``before``; a dict or a ``WholeDocument``; ``RowDocuments`` column-wise), else None. A
    row of ``EVENT_ROW`` shape takes it as its document; the other rows (tombstones, updates without
    ``after``, deletes without ``before``) are read as ``ChangeEvent``s, one by one. An added field's
    column is the raw column at its path (``_event_value``'s values)."""
    decoded = decoded if isinstance(decoded, RowDocuments) else RowDocuments.of(decoded)
    op = events.column("op").combine_chunks()
    kept_rows = tombstone_rows = pc.fill_null(pa.nulls(len(op), pa.bool_()), False)
    for value in pc.unique(op).to_pylist():
        shape = row_shape(value, options)
        rows = pc.is_null(op) if value is None else pc.fill_null(pc.equal(op, value), False)
        if shape is not None:
            kept_rows = pc.or_(kept_rows, rows)
        if shape == TOMBSTONE_ROW:
            tombstone_rows = pc.or_(tombstone_rows, rows)
    indices = pc.indices_nonzero(kept_rows).cast(pa.int64())
    tombstone = tombstone_rows.take(indices)
    documents = decoded.take(indices)
    replaced = {}
    for position in pc.indices_nonzero(pc.or_(tombstone, documents.missing())).to_pylist():
        event = event_from_row(events.slice(indices[position].as_py(), 1).to_pylist()[0])
        replaced[position] = (
            {"_id": event.document_id} if tombstone[position].as_py() else change_document(event)
        )
    documents = encode_documents(documents.replaced(replaced), options)
    # the columns the metadata columns take, of the rows that have a change row
    needed = list(dict.fromkeys([field.path[0] for field in options.added_fields] + _ROW_COLUMNS))
    rows = events.select(needed)
    rows = rows if len(indices) == events.num_rows else rows.take(indices)
    metadata: dict[str, pa.Array] = {}
    for field in options.added_fields:
        column = rows.column(field.path[0]).combine_chunks()
        for name in field.path[1:]:
            column = pc.struct_field(column, name)
        metadata[field.column] = pc.if_else(tombstone, pa.nulls(len(column), column.type), column)
    op = rows.column("op").combine_chunks()
    metadata["__deleted"] = pc.fill_null(pc.equal(op, "d"), True)  # a tombstone's op is null
    metadata["__cluster_time"] = rows.column("cluster_time").combine_chunks()
    metadata["__event_order"] = rows.column("event_order").combine_chunks()
    return indices, metadata, documents


def encode_documents(documents: RowDocuments, options: FlatteningOptions) -> RowDocuments:
    """``encode_document`` of each of ``documents`` (themselves if the options encode nothing)."""
    if options.array_encoding != "document" and not options.flatten_struct:
        return documents
    return RowDocuments.of([encode_document(document, options) for document in documents])


def encode_document(
    document: dict[str, Any] | WholeDocument, options: FlatteningOptions
) -> dict[str, Any] | WholeDocument:
    """``document`` with ``array.encoding`` and ``flatten.struct`` applied (itself if neither)."""
    if options.array_encoding != "document" and not options.flatten_struct:
        return document
    document = as_dict(document)
    if options.array_encoding == "document":
        document = _arrays_as_documents(document)
    if options.flatten_struct:
        document = _flattened(document, options.flatten_struct_delimiter)
    return document


def _arrays_as_documents(value: Any) -> Any:
    if isinstance(value, list):
        return {f"_{index}": _arrays_as_documents(element) for index, element in enumerate(value)} or None
    if isinstance(value, dict):
        return {name: _arrays_as_documents(inner) for name, inner in value.items()}
    return value


def _flattened(document: dict[str, Any], delimiter: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def lift(prefix: str | None, embedded: dict[str, Any]) -> None:
        for name, value in embedded.items():
            column = name if prefix is None else f"{prefix}{delimiter}{name}"
            if isinstance(value, dict) and value:
                lift(column, value)
                continue
            while column in flat:
                column = "_" + column
            flat[column] = value

    lift(None, document)
    return flat
