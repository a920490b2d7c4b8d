"""One row of the ``changes`` table from one event, like Debezium's ExtractNewDocumentState.

Rewrite mode: the document's fields become the row's columns, plus metadata columns.

* ``r``/``c``, and ``u`` with ``after``: the fields of ``after``.
* ``u`` without ``after``: ``_id``, each updatedFields path set as a nested value
  (``{"a.b": 1}`` gives ``a = {b: 1}``) and each removedFields path set to null (Debezium's
  ``$unset`` handling). A numeric path component (``"arr.2"``) cannot be told from a field
  name here, so it nests like one (``arr = {"2": ...}``); if ``arr`` is an array elsewhere the
  column falls back to EJSON text. truncatedArrays is not represented (the state applies it).
* ``d``: only ``_id``, and ``__deleted`` true.
* tombstones (no op) give no row.
"""

from __future__ import annotations

from typing import Any

import orjson

from mongo_cdc.transform import ejson_types as types
from mongo_cdc.transform.document_state import set_path
from mongo_cdc.transform.raw_events import ChangeEvent

METADATA_COLUMNS: tuple[tuple[str, types.ColumnType], ...] = (
    ("__op", types.STRING),
    ("__source_ts_ms", types.LONG),
    ("__deleted", types.BOOL),
    ("__cluster_time", types.LONG),
    ("__event_order", types.STRING),
)


def change_document(event: ChangeEvent) -> dict[str, Any] | None:
    """The document part of the change row (parsed EJSON); None for a tombstone."""
    if event.op is None:
        return None
    if event.op != "d" and event.after is not None:
        return orjson.loads(event.after)
    document = {"_id": orjson.loads(event.document_id)}
    if event.op == "d" or event.update_description is None:
        return document
    updated_fields = event.update_description.get("updatedFields")
    if updated_fields:
        for path, value in orjson.loads(updated_fields).items():
            set_path(document, path, value)
    for path in event.update_description.get("removedFields") or ():
        set_path(document, path, None)
    return document


def change_metadata(event: ChangeEvent) -> tuple:
    """Values of ``METADATA_COLUMNS`` for the event's row."""
    return event.op, event.source_ts_ms, event.op == "d", event.cluster_time, event.event_order
