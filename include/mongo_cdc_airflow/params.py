"""The CDC DAG's trigger params (docs/semantics.md, "Re-snapshots"; docs/offsets.md, "Moving a
stream") and their checks.

A wrong trigger fails its run at once (``failures.fail_at_once``: no retries, the one-line message
first in the log): the checks that need no server run before ``discover`` connects, the known
shards and collections right after.

Every param is optional: its schema's type accepts null (the trigger form marks a param whose
type does not as required), and null means the default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow.sdk import Param

from mongo_cdc.capture.collection_kinds import TIME_SERIES, VIEW
from mongo_cdc.capture.shard_lifecycle import ResnapshotRequest
from mongo_cdc.capture.snapshot_filters import filter_text, filters_of_param
from mongo_cdc.capture.stream_move import StreamMoveRequest
from mongo_cdc.config.values import OP_TIME_FORMATS, parse_op_time
from mongo_cdc.namespace import Namespace
from mongo_cdc_airflow.failures import fail_at_once


def resnapshot_params() -> dict[str, Param]:
    """The trigger form's on-call re-snapshot, stream move and verification. Scheduled runs use the
    defaults."""
    return {
        "resnapshot": Param(
            False,
            type=["boolean", "null"],
            title="Re-snapshot",
            description="Copy the collections below again, then stream. Their state tables are reconciled: "
            "documents that no longer exist disappear.",
        ),
        "collections": Param(
            [],
            type=["array", "null"],
            items={"type": "string"},
            title="Collections to re-snapshot",
            description="<db>.<collection> names, one per line. Empty: every captured collection. "
            "With names, streaming goes on from its stored position, so the other collections miss nothing.",
        ),
        "filters": Param(
            {},
            type=["object", "null"],
            title="Filters of a re-snapshot",
            description='{"<db>.<collection>": <MongoDB filter>}, in Extended JSON ({"$oid": ...}, '
            '{"$numberLong": ...}, {"$date": ...}): only the matching documents are copied again and '
            "upserted into the state; nothing else is deleted. An _id range, exactly "
            '{"_id": {"$gte": <low>, "$lt": <high>}} (either bound optional; $gt and $lte too), also '
            "deletes the state documents in that range the copy did not find. Needs Re-snapshot; without "
            "collections above, only these collections are copied, with them they must be among them.",
        ),
        "shards": Param(
            [],
            type=["array", "null"],
            items={"type": "string"},
            title="Shards to re-snapshot or move",
            description="Shard ids, one per line (a plain replica set is one shard named like the set). "
            "Empty: every shard.",
        ),
        "stream_from": Param(
            None,
            type=["string", "null"],
            title="Move the stream to an op-time",
            description="Read the change stream again from this cluster time, still in the oplog: "
            f"{OP_TIME_FORMATS.replace('`', '')}. Events the lake holds already do not land again. "
            "Only the shards above, if any.",
        ),
        "skip_unread": Param(
            False,
            type=["boolean", "null"],
            title="Skip unread events",
            description="Let stream_from move a stream forward, skipping the events between, which "
            "never land (the batch log records it). Without it a forward move is refused.",
        ),
        "verify": Param(
            False,
            type=["boolean", "null"],
            title="Verify",
            description="Compare the state tables with MongoDB by _id ranges and heal what drifted "
            "(verify.on.drift), as runs on the verify.interval.hours schedule do; the report is in "
            "raw/<topic.prefix>/_verifications.",
        ),
    }


PARAM_NAMES = tuple(resnapshot_params())


def resnapshot_request(
    conf: Mapping[str, Any], params: Mapping[str, Any], backfill: bool
) -> ResnapshotRequest | None:
    """The trigger's re-snapshot (None: none asked), after every check a server is not needed for.

    ``conf`` is the run's own conf (where a mistyped key shows: Airflow keeps keys that are not
    params), ``params`` the params with their defaults filled in.
    """
    problems = [
        f'unknown param "{key}"; the params are: {", ".join(PARAM_NAMES)}'
        for key in sorted(conf or {})
        if key not in PARAM_NAMES
    ]
    for name in ("resnapshot", "verify", "skip_unread"):
        flag = _or_default(params, name, False)
        if not isinstance(flag, bool):
            problems.append(f'param "{name}" must be true or false, got {flag!r}')
    resnapshot = _or_default(params, "resnapshot", False)
    for name, what in (("collections", "<db>.<collection> names"), ("shards", "shard ids")):
        value = _or_default(params, name, [])
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            problems.append(f'param "{name}" must be a list of {what}, got {value!r}')
    collections, shards = _or_default(params, "collections", []), _or_default(params, "shards", [])
    filters, filter_problems = filters_of_param(params.get("filters"))
    problems.extend(filter_problems)
    stream_from = params.get("stream_from")
    if stream_from is not None:
        try:
            parse_op_time(stream_from)
        except ValueError as exc:
            why = f" ({exc})" if str(exc) else ""
            problems.append(
                f'param "stream_from" is {stream_from!r}; allowed: {OP_TIME_FORMATS.replace("`", "")}{why}'
            )
    if not problems:
        bad = [name for name in collections if not _is_namespace(name)]
        if bad:
            problems.append(f'param "collections": {", ".join(bad)} is not a <db>.<collection> name')
        if resnapshot and backfill:
            problems.append(
                "a backfill only completes past intervals and cannot re-snapshot; trigger the DAG with "
                '{"resnapshot": true} as a normal run instead'
            )
        if not resnapshot and collections:
            problems.append('param "collections" chooses what to re-snapshot; set "resnapshot" to true too')
        if not resnapshot and filters:
            problems.append('param "filters" narrows a re-snapshot; set "resnapshot" to true too')
        outside = sorted(set(filters) - set(collections)) if collections else []
        if outside:
            problems.append(
                f'param "filters" names {", ".join(outside)}, which "collections" does not: add it there, '
                'or leave "collections" empty to re-snapshot just the filtered collections'
            )
        if not resnapshot and stream_from is None and shards:
            problems.append(
                'param "shards" chooses what to re-snapshot or move; set "resnapshot" to true or give '
                '"stream_from" too'
            )
        if stream_from is not None and resnapshot:
            problems.append(
                'params "resnapshot" and "stream_from" both say where streaming goes on; trigger one of them'
            )
        if stream_from is not None and backfill:
            problems.append(
                "a backfill only completes past intervals and cannot move a stream; trigger the DAG with "
                '"stream_from" as a normal run instead'
            )
        if _or_default(params, "skip_unread", False) and stream_from is None:
            problems.append('param "skip_unread" applies to a move; give "stream_from" too')
    _fail(problems)
    if not resnapshot:
        return None
    # filters alone re-snapshot just their collections, never every one
    return ResnapshotRequest(tuple(collections or sorted(filters)), tuple(shards))


def resnapshot_filters(params: Mapping[str, Any]) -> dict[str, str] | None:
    """The trigger's re-snapshot filters as the snapshot plan records them (``filter_text``), once
    ``resnapshot_request`` checked them; None when the trigger asks for no re-snapshot."""
    if _or_default(params, "resnapshot", False) is not True:
        return None
    filters, _ = filters_of_param(params.get("filters"))
    return {name: filter_text(query) for name, query in filters.items()}


def stream_move_request(params: Mapping[str, Any]) -> StreamMoveRequest | None:
    """The trigger's stream move (None: none asked), once ``resnapshot_request`` checked the params."""
    stream_from = params.get("stream_from")
    if stream_from is None:
        return None
    shards = tuple(_or_default(params, "shards", []))
    return StreamMoveRequest(parse_op_time(stream_from), _or_default(params, "skip_unread", False), shards)


def verify_requested(params: Mapping[str, Any]) -> bool:
    """Whether the trigger asked for a verification (checked by ``resnapshot_request`` in ``discover``)."""
    return _or_default(params, "verify", False) is True


# why a re-snapshot does not copy a collection captured in batches, and what to do instead
BATCHED = {
    TIME_SERIES: "is a time-series collection, read in batches: a re-snapshot does not copy it; trigger with "
    '{"verify": true} to reconcile its state with MongoDB now',
    VIEW: "is a view, read whole at each of its reads (view.read.interval.runs): its next read lands what "
    "differs from its state; there is nothing to re-snapshot",
}


def check_known(
    source: str,
    shards: Iterable[str],
    collections: Iterable[str],
    shard_ids: Iterable[str],
    captured: Iterable[str] | None,
    batch_captured: Mapping[str, str] | None = None,
) -> None:
    """Every shard and collection the trigger names exists (``captured`` None: no collections named)
    and can be re-snapshotted: ``batch_captured`` (discovery's kinds, namespace to kind) names the
    views and time-series collections, which are read in batches and never copied by a snapshot."""
    known_shards = sorted(shard_ids)
    problems = []
    unknown = sorted(set(shards) - set(known_shards))
    if unknown:
        problems.append(
            f'param "shards": unknown shard {", ".join(unknown)}; '
            f"the shards of source '{source}' are: {', '.join(known_shards)}"
        )
    if captured is not None:
        known = sorted(set(captured))
        kinds = batch_captured or {}
        batched = sorted(
            set(collections) & {namespace for namespace, kind in kinds.items() if kind in BATCHED}
        )
        problems += [f'param "collections": {namespace} {BATCHED[kinds[namespace]]}' for namespace in batched]
        unknown = sorted(set(collections) - set(known) - set(batched))
        if unknown:
            problems.append(
                f'param "collections": unknown collection {", ".join(unknown)}; '
                f"the captured collections of source '{source}' are: {', '.join(known) or 'none'}"
            )
    _fail(problems)


def _or_default(params: Mapping[str, Any], name: str, default: Any) -> Any:
    """The param's value; its default when absent or null (a field the trigger form left empty)."""
    value = params.get(name)
    return default if value is None else value


def _is_namespace(name: str) -> bool:
    namespace = Namespace.parse(name)
    return bool(namespace.db and namespace.collection)


def _fail(problems: list[str]) -> None:
    # a wrong trigger does not get better with retries
    if problems:
        fail_at_once("; ".join(problems))
