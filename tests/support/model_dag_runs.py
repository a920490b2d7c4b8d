"""Model-based sequences whose runs are real DAG runs (``DagSequence``): ``model_support``'s steps and
checks, each ``Run`` a run of the CDC DAG (dag.test, the transform by spark-submit), a re-snapshot
asked through the next run's trigger params."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from model_support import FilteredResnapshot, Sequence, SnapshotRead

from mongo_cdc.lake import RENAMED_COPY_ORDER


@dataclass
class DagSequence(Sequence):
    """A sequence whose runs are real DAG runs (``CdcSource.run``: dag.test, the transform by
    spark-submit); a re-snapshot is the next run's, through its trigger params."""

    source: Any = None  # tests/support/cdc_support.py's CdcSource
    requested: dict[str, FilteredResnapshot | None] = field(default_factory=dict)
    batches_seen: int = 0

    def _resnapshot(self, name: str, filtered: FilteredResnapshot | None) -> None:
        self.requested[name] = filtered  # the last one asked for a collection before a run

    def _pipeline_run(self) -> None:
        # (a collection dropped or renamed since it was asked for is not there to copy)
        requested = {name: filtered for name, filtered in self.requested.items() if name in self.model}
        ids = {name: self._matching(name, requested.get(name)) for name in self.model}
        self.requested = {}
        conf = None
        if requested:
            filters = {f"{self.database}.{n}": f.query() for n, f in requested.items() if f is not None}
            collections = sorted(f"{self.database}.{name}" for name in requested)
            conf = {"resnapshot": True, "collections": collections, "filters": filters}
        self.run_id = self.source.run(conf=conf).run_id
        # the snapshots this run took (not a rename's copy: the checks leave those out); a filtered
        # copy is in no manifest unless of an _id range, yet its reads are there
        batches = self.source.lake.batches()
        for batch in batches[self.batches_seen :]:
            if batch.kind != "snapshot" or batch.snapshot_cluster_time is None:
                continue
            manifest = batch.manifest
            if manifest is not None and manifest.event_order == RENAMED_COPY_ORDER:
                continue
            copied = set(manifest.collections if manifest is not None else ())
            if self.snapshotted_at is not None:
                copied |= {f"{self.database}.{name}" for name, f in requested.items() if f is not None}
            for namespace in sorted(copied):
                name = namespace.partition(".")[2]
                self.snapshot_reads.append(SnapshotRead(name, batch.snapshot_cluster_time, ids.get(name, [])))
            if self.snapshotted_at is None:
                self.snapshotted_at = batch.snapshot_cluster_time
        self.batches_seen = len(batches)
