"""How far each collection's tables are behind the lake: the committed batches with rows of the
collection that its ``state`` or ``changes`` table has not applied yet.

A derived table records per replica set the last batch it applied (``raw_events.applied_batches``),
in the very commit of its rows, so its backlog is read from the lake alone: the batches
``BatchWindow.of`` selects past that, which are those the transform's next run applies. A
collection whose transform fails stays behind while the pulls keep committing its batches; the
Spark job and the CDC DAG's ``summary`` report the count every run, and it goes back to 0 at the
first run that catches the collection up. A collection the source's applied mark covers
(``applied_mark``) is behind by nothing, and its tables are not read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.transform.applied_mark import read_mark
from mongo_cdc.transform.raw_events import applied_batches

# The tables the transform derives from a collection's raw rows.
DERIVED_TABLES = ("state", "changes")


@dataclass(frozen=True)
class Backlog:
    """The committed batches, as (replica set, batch number), with rows of one collection that each
    of its tables has not applied yet."""

    state: frozenset[tuple[str, int]] = frozenset()
    changes: frozenset[tuple[str, int]] = frozenset()

    @property
    def batches(self) -> int:
        """How many committed batches the collection is behind: those either table still has to apply."""
        return len(self.state | self.changes)

    def of_table(self, zone: str) -> int:
        """How many committed batches the ``zone`` table (``state``, ``changes``) is behind."""
        return len(getattr(self, zone))


def unapplied(
    batches: Sequence[Batch], namespace: str, applied: Mapping[str, int]
) -> frozenset[tuple[str, int]]:
    """The batches of ``batches`` with rows of ``namespace`` past ``applied`` (per replica set)."""
    window = BatchWindow.of(batches, namespace, applied)
    return frozenset((rs, seq) for rs, seqs in window.seqs.items() for seq in seqs)


def collection_backlog(source_lake: SourceLake, namespace: str, batches: Sequence[Batch]) -> Backlog:
    """What ``namespace``'s tables have not applied of the committed ``batches`` (the batch log's rows)."""
    return _read_backlogs(source_lake, batches, [namespace])[namespace]


def source_backlogs(source_lake: SourceLake, batches: Sequence[Batch]) -> dict[str, Backlog]:
    """The backlog of every collection the committed ``batches`` wrote raw rows to, by namespace.
    Reads the tables of those the applied mark does not cover."""
    namespaces = sorted({namespace for batch in batches for namespace in batch.namespaces})
    mark = read_mark(source_lake)
    unsettled = set(namespaces) if mark is None else mark.unsettled(batches)
    backlogs = _read_backlogs(
        source_lake, batches, [namespace for namespace in namespaces if namespace in unsettled]
    )
    return {namespace: backlogs.get(namespace, Backlog()) for namespace in namespaces}


def _read_backlogs(
    source_lake: SourceLake, batches: Sequence[Batch], namespaces: list[str]
) -> dict[str, Backlog]:
    tables = source_lake.tables(namespaces, DERIVED_TABLES)
    replica_sets = {batch.rs for batch in batches}
    return {
        namespace: Backlog(
            **{
                zone: unapplied(
                    batches, namespace, applied_batches(tables[namespace, zone], zone, replica_sets)
                )
                for zone in DERIVED_TABLES
            }
        )
        for namespace in namespaces
    }


def collections_behind(backlogs: Mapping[str, Backlog]) -> dict[str, int]:
    """The collections of ``backlogs`` that are behind, with how many batches."""
    return {namespace: backlog.batches for namespace, backlog in backlogs.items() if backlog.batches}


def behind_text(behind: Mapping[str, int]) -> str:
    """``shop.orders (3 batches behind), shop.users (1 batch behind)``: collections and their counts."""
    return ", ".join(
        f"{namespace} ({count} batch{'' if count == 1 else 'es'} behind)"
        for namespace, count in sorted(behind.items())
    )
