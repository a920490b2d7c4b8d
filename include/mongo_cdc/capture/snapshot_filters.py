"""Filtered re-snapshots: the trigger's ``filters``, ``{"<db>.<collection>": <filter>}``, read,
checked, recorded and turned into what the snapshot's manifest says (docs/semantics.md, "Re-snapshots").

A filter is a MongoDB query in Extended JSON (``id_ranges.loads``: ``{"$numberLong": ...}``,
``{"$oid": ...}`` and dates keep their types). The copy ANDs it with each chunk's ``_id`` range
(``chunk_reads``), so chunking, resuming and parallel copies work as for a whole collection. The
snapshot plan records each filter as Extended JSON text (``filter_text``): a resumed copy reads
with the same filter, and a trigger with another filter starts a new copy.

A filtered copy reads only some documents, so it proves nothing about the others: its collection
is left out of the manifest of completely copied collections, and its documents are upserts. An
``_id`` range filter (``id_ranges.id_range_of``) is the exception: the copy read every document
of that range, so the manifest carries the range and the transform deletes the state documents in
it that the copy did not read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from bson.errors import BSONError
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongo_cdc import extjson
from mongo_cdc.id_ranges import id_range_of, loads
from mongo_cdc.namespace import Namespace


def parse_filter(value: Any) -> dict:
    """A filter as the trigger gives it (a JSON object, or its text) read as Extended JSON; raises
    ValueError naming what is wrong."""
    try:
        text = value if isinstance(value, str) else json.dumps(value)
        parsed = loads(text)
    except (TypeError, ValueError, BSONError) as exc:  # e.g. InvalidId for a wrong {"$oid": ...}
        raise ValueError(f"is not valid Extended JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"must be a JSON object (a MongoDB query), got {value!r}")
    if not parsed:
        raise ValueError(
            'is empty, which matches every document: name the collection in "collections" instead'
        )
    return parsed


def filters_of_param(value: Any) -> tuple[dict[str, dict], list[str]]:
    """The param ``filters`` (an object of ``<db>.<collection>`` to filter) read: the filters by
    namespace, and the problems found (each one a sentence naming the param and the fix)."""
    if value is None:
        return {}, []
    if not isinstance(value, Mapping):
        return {}, [f'param "filters" must be an object {{"<db>.<collection>": <filter>}}, got {value!r}']
    filters: dict[str, dict] = {}
    problems = []
    for name, query in value.items():
        namespace = Namespace.parse(name)
        if not (namespace.db and namespace.collection):
            problems.append(f'param "filters": {name} is not a <db>.<collection> name')
            continue
        try:
            filters[name] = parse_filter(query)
        except ValueError as exc:
            problems.append(f'param "filters": the filter of {name} {exc}')
    return filters, problems


def filter_text(query: Mapping[str, Any]) -> str:
    """A filter as the snapshot plan records it: Extended JSON that ``parse_filter`` reads back to
    the same values, so equal filters have equal text."""
    return extjson.encode_str(dict(query))


def refused_filters(client: MongoClient, filters: Mapping[str, str]) -> list[str]:
    """The filters (``filter_text`` by namespace) the server refuses (an unknown operator, a wrong
    operand), each as a problem naming the collection and the server's reason: a find of one
    ``_id`` runs each filter before anything is copied."""
    problems = []
    for name, text in sorted(filters.items()):
        db, collection = Namespace.parse(name)
        try:
            client[db][collection].find_one(loads(text), projection={"_id": 1})
        except OperationFailure as exc:
            reason = (exc.details or {}).get("errmsg") or str(exc)
            problems.append(f'param "filters": MongoDB refuses the filter of {name}: {reason}')
    return problems


def manifest_of(
    collections: Iterable[str], filters: Mapping[str, str]
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """What a snapshot's manifest says of its ``collections`` copied with ``filters`` (plan text by
    namespace): the collections whose state it reconciles, and the ``_id`` range (``IdRange.text``)
    of those it read only a range of. A collection copied with any other filter is not reconciled."""
    reconciled, ranges = [], []
    for name in collections:
        if name not in filters:
            reconciled.append(name)
            continue
        found = id_range_of(loads(filters[name]))
        if found is not None:
            reconciled.append(name)
            ranges.append((name, found.text))
    return tuple(reconciled), tuple(ranges)
