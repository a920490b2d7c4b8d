"""What a source does with each collection its filters match, by the kind ``listCollections`` gives.

A change stream shows the writes to ordinary collections only: a view has no oplog entries of its
own, a time-series collection's writes go to its ``system.buckets.*`` collection, and ``system.*``
collections are MongoDB's internals. So every namespace the filters match gets one of

* ``STREAMED``: an ordinary collection, snapshotted and streamed;
* ``VIEW``: a view, read whole each run and landed as the differences from its state
  (``mongo_cdc.verify.view_capture``);
* ``TIME_SERIES``: a time-series collection, read in batches by its ``timeField``
  (``mongo_cdc.capture.time_series``);
* ``NOT_CAPTURED``, with the reason: a ``system.*`` collection, a view without a unique ``_id``, a
  view or a time-series collection of a sharded cluster.

``discover`` logs every one not captured, and the run's summary names them, so a collection the
filters match is never left out silently.

**A view's unique ``_id``, checked cheaply.** The view's state is keyed by ``_id``, so two documents
of one ``_id`` (an ``$unwind``) or none (``$project: {_id: 0}``) cannot be captured. The check reads
the view's pipeline first (``listCollections`` already returned it): a view over a collection whose
stages keep each document's own ``_id`` (``$match``, ``$sort``, ``$limit``, ``$skip``, ``$lookup``,
and ``$project``/``$addFields``/``$set``/``$unset`` that leave ``_id`` alone) or make a new unique one
(``$group``) has a unique ``_id`` by construction: no read at all. Any other pipeline (or a view
over a time-series collection, whose ``_id`` has no unique index) is checked by one aggregation over
the view that stops at the first ``_id`` seen twice or missing: a full pass over the view's
documents on the server, returning at most one document, at each discovery.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient

from mongo_cdc.namespace import Namespace

if TYPE_CHECKING:
    from mongo_cdc.config import SourceConfig

STREAMED = "streamed"
VIEW = "batch-captured (view)"
TIME_SERIES = "batch-captured (time-series)"
NOT_CAPTURED = "not captured"
# the batch kind of a view's read: the views' rows, which verification leaves to the view reads
VIEW_BATCH = "view"

SYSTEM_COLLECTION = "a MongoDB internal collection (system.*): never captured"
SHARDED_TIME_SERIES = (
    "a time-series collection of a sharded cluster: time-series collections are captured from "
    "replica-set sources only"
)
SHARDED_VIEW = (
    "a view of a sharded cluster: views are captured from replica-set sources only (a shard's view "
    "holds that shard's documents alone)"
)
NO_ID = "a view whose documents have no _id: its state is keyed by _id; give it an _id in the view's pipeline"
DUPLICATE_ID = (
    "a view whose _id is not unique (e.g. {value} appears more than once): its state is keyed by _id; "
    "make _id unique in the view's pipeline (an $unwind repeats it)"
)

# stages after which each document keeps the _id it came with, or none is repeated
_ID_KEEPING = frozenset({"$match", "$sort", "$limit", "$skip", "$lookup", "$graphLookup", "$redact"})
_ID_SETTING = frozenset({"$project", "$addFields", "$set"})


@dataclass(frozen=True)
class CollectionKind:
    """One namespace the source's filters match: its kind (``STREAMED``, ``VIEW``, ``TIME_SERIES``,
    ``NOT_CAPTURED``) and, when not captured, why."""

    namespace: str
    kind: str
    reason: str | None = None

    def describe(self) -> str:
        return f"{self.namespace}: {self.kind}" + (f": {self.reason}" if self.reason else "")


def classify_collections(client: MongoClient, config: SourceConfig, *, sharded: bool) -> list[CollectionKind]:
    """Every namespace of the source's captured databases whose name the filters match, by name, with
    what the source does with it. ``sharded``: the source is a sharded cluster (its views are not
    captured). Reads ``listCollections`` of each database, and a view's documents only when its
    pipeline does not show its ``_id`` unique (the module doc)."""
    kinds: list[CollectionKind] = []
    for db, names, infos in matched_collections(client, config):
        for name in names:
            info, namespace = infos[name], str(Namespace(db, name))
            if name.startswith("system."):
                kinds.append(CollectionKind(namespace, NOT_CAPTURED, SYSTEM_COLLECTION))
            elif info.get("type") == "timeseries":
                kinds.append(
                    CollectionKind(namespace, NOT_CAPTURED, SHARDED_TIME_SERIES)
                    if sharded
                    else CollectionKind(namespace, TIME_SERIES)
                )
            elif info.get("type") == "view":
                kinds.append(_view_kind(client, namespace, infos, sharded))
            else:
                kinds.append(CollectionKind(namespace, STREAMED))
    return kinds


def matched_collections(
    client: MongoClient, config: SourceConfig
) -> Iterator[tuple[str, list[str], dict[str, dict]]]:
    """Each captured database, the names in it the filters match (sorted, ``system.*`` included),
    and all its ``listCollections`` entries by name (a view's pipeline may read a collection the
    filters leave out): one ``listCollections`` per database."""
    for db in client.list_database_names():
        if config.captures_database(db):
            infos = {info["name"]: info for info in client[db].list_collections()}
            yield db, sorted(name for name in infos if config.filters_match(db, name)), infos


def dropped_since(
    client: MongoClient, config: SourceConfig, landed: Iterable[str], current: Iterable[str]
) -> list[str]:
    """The namespaces of ``landed`` (captured in batches by earlier runs) that are not ``current``
    (found by this run), that the filters still capture and that MongoDB has under no kind now:
    dropped since. Their batch reads have no drop event to empty their states (a stream has)."""
    dropped = []
    for namespace in sorted(set(landed) - set(current)):
        db, name = Namespace.parse(namespace)
        if config.captures_collection(db, name) and not client[db].list_collection_names(
            filter={"name": name}
        ):
            dropped.append(namespace)
    return dropped


def _view_kind(client: MongoClient, namespace: str, infos: dict[str, dict], sharded: bool) -> CollectionKind:
    if sharded:
        return CollectionKind(namespace, NOT_CAPTURED, SHARDED_VIEW)
    db, name = Namespace.parse(namespace)
    if _unique_by_pipeline(name, infos):
        return CollectionKind(namespace, VIEW)
    problem = _id_problem(client, db, name)
    return (
        CollectionKind(namespace, VIEW)
        if problem is None
        else CollectionKind(namespace, NOT_CAPTURED, problem)
    )


def _unique_by_pipeline(name: str, infos: dict[str, dict]) -> bool:
    """Whether view ``name``'s pipeline, and those of the views it is defined on, keep a unique
    ``_id`` from an ordinary collection (no read: ``infos`` are the database's listCollections)."""
    seen: set[str] = set()
    while name not in seen:
        seen.add(name)
        info = infos.get(name)
        if info is None or info.get("type") == "timeseries":
            return False  # gone meanwhile, or measurements whose _id nothing keeps unique
        if info.get("type", "collection") == "collection":
            return True
        options = info.get("options", {})
        stages = options.get("pipeline", [])
        if any(_makes_id_unique(stage) for stage in stages):
            # from its last $group on, each document has a new unique _id
            last = max(i for i, stage in enumerate(stages) if _makes_id_unique(stage))
            return all(_keeps_id(stage) for stage in stages[last + 1 :])
        if not all(_keeps_id(stage) for stage in stages):
            return False
        name = options.get("viewOn", "")
    return False


def _makes_id_unique(stage: dict) -> bool:
    return next(iter(stage)) == "$group"


def _keeps_id(stage: dict[str, Any]) -> bool:
    """Whether each document leaves ``stage`` with the ``_id`` it came in with (or is dropped)."""
    operator, spec = next(iter(stage.items()))
    if operator in _ID_KEEPING:
        return True
    if operator in _ID_SETTING and isinstance(spec, dict):
        # $project: {_id: 1} or {_id: true} keeps it; any other value for _id removes or replaces it
        return "_id" not in spec or (operator == "$project" and spec["_id"] in (1, True))
    if operator == "$unset":
        return "_id" not in ([spec] if isinstance(spec, str) else spec)
    return False


def _id_problem(client: MongoClient, db: str, name: str) -> str | None:
    """Why view ``db.name``'s documents cannot be keyed by ``_id`` (None: they can): one aggregation
    that stops at the first ``_id`` seen twice, or at the first document without one."""
    pipeline = [
        {
            "$group": {
                "_id": "$_id",
                "count": {"$sum": 1},
                "missing": {"$max": {"$eq": [{"$type": "$_id"}, "missing"]}},
            }
        },
        {"$match": {"$or": [{"count": {"$gt": 1}}, {"missing": True}]}},
        {"$limit": 1},
    ]
    found = next(client[db][name].aggregate(pipeline, allowDiskUse=True), None)
    if found is None:
        return None
    return NO_ID if found["missing"] else DUPLICATE_ID.format(value=found["_id"])


def not_captured(kinds: Iterable[CollectionKind]) -> dict[str, str]:
    """The namespaces the filters match that the source does not capture, with why."""
    return {kind.namespace: kind.reason or "" for kind in kinds if kind.kind == NOT_CAPTURED}
