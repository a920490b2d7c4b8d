"""The snapshot's fan-out: the bodies of ``snapshot_chunks`` and the mapped ``snapshot_copy``.

``snapshot_chunks`` collects the chunks every shard's ``snapshot_start`` left to copy and cuts them,
in order, into at most ``snapshot.max.tasks`` slices of about equal size. Each slice is one mapped
``snapshot_copy`` instance, labelled by its shards, collections and chunk numbers, which several
Airflow workers can run at once; inside one, ``snapshot.max.threads`` chunks are copied at a time.
Every chunk commits on its own (``landing``), so a retried or cleared instance copies only what is
still missing. ``shard_sync.snapshot`` commits a shard's snapshot once all its chunks are there.
"""

from __future__ import annotations

import itertools
import logging

from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowSkipException
from pymongo.errors import ConnectionFailure

from mongo_cdc.capture.topology import Shard
from mongo_cdc.config import SourceConfig
from mongo_cdc_airflow import task_ids
from mongo_cdc_airflow.hash_key import with_hash_key
from mongo_cdc_airflow.hooks import MongoCdcHook
from mongo_cdc_airflow.lake_storage import source_lake
from mongo_cdc_airflow.shard_sync import unreachable

log = logging.getLogger(__name__)


def chunk_slices(config: SourceConfig, shards: list[dict] | None) -> list[dict]:
    """The ``snapshot_copy`` instances' work: ``{"label", "parts": [{"shard", "seq", "chunks"}]}``.

    Runs even when some ``snapshot_start`` failed: the other shards' chunks are copied all the same.
    """
    if shards is None:
        raise AirflowSkipException("discover failed: no snapshot to copy")
    ti = get_current_context()["ti"]
    work: list[tuple[dict, int, str, int, int]] = []
    for index, shard in enumerate(shards):
        started = ti.xcom_pull(task_ids=task_ids.SNAPSHOT_START, map_indexes=index)
        snapshot = (started or {}).get("snapshot")
        if snapshot:
            work.extend((shard, snapshot["seq"], *chunk) for chunk in snapshot["missing"])
    slices = split_evenly(work, config.snapshot_max_tasks)
    log.info("%d chunks to copy in %d snapshot_copy tasks (snapshot.max.tasks %d)",
             len(work), len(slices), config.snapshot_max_tasks)  # fmt: skip
    return [_slice(items) for items in slices]


def split_evenly(items: list, parts: int) -> list[list]:
    """``items`` cut in order into at most ``parts`` runs whose lengths differ by at most one."""
    count = min(parts, len(items))
    bounds = [len(items) * i // count for i in range(count + 1)] if count else []
    return [items[start:end] for start, end in itertools.pairwise(bounds)]


def _slice(items: list[tuple[dict, int, str, int, int]]) -> dict:
    parts = []
    for (shard, seq), chunks in itertools.groupby(items, key=lambda item: (item[0], item[1])):
        parts.append(
            {"shard": shard, "seq": seq, "chunks": [[ns, index, count] for _, _, ns, index, count in chunks]}
        )
    return {"label": "; ".join(_label(part) for part in parts), "parts": parts}


def _label(part: dict) -> str:
    """``shard01: shop.orders 3–7/20, shop.users 1/1``: chunk numbers per collection (1-based)."""
    runs = []
    for namespace, chunks in itertools.groupby(part["chunks"], key=lambda chunk: chunk[0]):
        numbers = [index + 1 for _, index, _ in chunks]
        numbered = f"{numbers[0]}–{numbers[-1]}" if len(numbers) > 1 else f"{numbers[0]}"
        count = next(chunk[2] for chunk in part["chunks"] if chunk[0] == namespace)
        runs.append(f"{namespace} {numbered}/{count}")
    return f"{part['shard']['id']}: {', '.join(runs)}"


def copy_slice(config: SourceConfig, work: dict) -> dict:
    """Copy one slice's chunks not copied yet; how many chunks and documents this attempt copied."""
    from mongo_cdc.capture.snapshot import copy_chunks

    get_current_context()["chunk_label"] = work["label"]  # the UI's label (map_index_template)
    config = with_hash_key(config)
    lake = source_lake(config)
    hook = MongoCdcHook(mongo_conn_id=config.mongo_conn_id)
    copied: dict[str, int] = {}
    chunks_copied = 0
    for part in work["parts"]:
        shard = Shard.from_dict(part["shard"])
        plan = lake.snapshot_plan(shard.rs, part["seq"])
        if plan is None:
            raise RuntimeError(
                f"shard {shard.id}: snapshot {part['seq']} has no plan in the lake's snapshot log: the "
                "lake was moved or edited since snapshot_start; run again"
            )
        wanted = {(namespace, index) for namespace, index, _ in part["chunks"]}
        chunks = [chunk for chunk in plan.chunks if (chunk.namespace, chunk.index) in wanted]
        try:
            with hook.shard_client(shard) as client:
                documents = copy_chunks(client, config, lake, plan, chunks)
        except ConnectionFailure as exc:
            raise unreachable(shard, exc) from None
        chunks_copied += len(documents)
        for chunk, count in documents.items():
            copied[chunk.namespace] = copied.get(chunk.namespace, 0) + (count or 0)
    return {"chunks": chunks_copied, "documents": copied}
