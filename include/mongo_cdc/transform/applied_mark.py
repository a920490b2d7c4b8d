"""The applied mark (``raw/<topic.prefix>/_applied``): how far every collection's derived tables are
known to be, so a run reads only the tables of the collections with newer batches.

Without it, every run reads two table logs per collection to learn that nothing changed: a source of
thousands of collections pays thousands of reads an hour for none of its data (issue 28). The
transform job writes the mark after its commits (``driver.transform_collections``): the collections
it failed (``lagging``) aside, every collection's tables have applied every batch the job read
(``through``: per replica set, its last batch, with the count of batches up to it, ``batches``).
It also carries, for the collections it transformed, each table's version and rows after its commits
(``tables``), and the run that started it (``run_id``, the Airflow run's): that run's ``summary``
takes them for its asset events rather than open every table the job just wrote
(``AppliedMark.figures``). A job with work withdraws them before its first commit
(``withdraw_figures``), so a job that dies between its commits and its mark (a retry of the same
run's transform, say) leaves no figures its commits made stale.

The mark only says which collections need no read (``unsettled`` names the others: a batch past the
mark names them, or they lag); a collection with newer batches is read as before, so what a table
applies never comes from the mark. It is a cache of what the tables record:

* written after the commits it describes: a mark behind the tables costs reads, never data;
* ignored for a replica set whose batches up to ``through`` are no longer ``batches`` of them (a
  batch log rewritten since), when the flattening options differ (``work.source_work``: every
  changes table is rebuilt), in a run that rewrites hours, and when it cannot be read (a warning;
  the next job writes a new one); the collections a run maintains are read as well;
* a table deleted by hand is therefore noticed at its collection's next change or its next
  maintenance (``lake.maintenance.maintained``: once per ``lake.optimize.interval.hours``), not by an
  idle run.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from mongo_cdc import lake
from mongo_cdc.lake.batch_log import Batch, last_batches
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import file_actions, table_if_exists
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_slices import lake_path

log = logging.getLogger(__name__)

APPLIED_MARK_SCHEMA = pa.schema(
    [
        pa.field("through", pa.string(), nullable=False),  # JSON {rs: the last batch the job read}
        pa.field("batches", pa.string(), nullable=False),  # JSON {rs: how many batches up to it}
        pa.field("flattening", pa.string(), nullable=False),  # the job's FlatteningOptions (flattening_text)
        pa.field("lagging", pa.list_(pa.string()), nullable=False),  # namespaces the job failed
        pa.field("written_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),  # the run the job was started by ("": none named)
        pa.field("tables", pa.string(), nullable=False),  # JSON {namespace: {zone: [version, rows]}}
    ]
)
# per namespace and zone (``state``, ``changes``): the table's version and rows
TableFigures = Mapping[str, Mapping[str, tuple[int, int]]]


@dataclass(frozen=True)
class AppliedMark:
    """Every collection but ``lagging`` has applied the batches up to ``through`` (per replica set),
    ``batches`` of them, with the changes tables written with ``flattening``."""

    through: Mapping[str, int]
    batches: Mapping[str, int]
    flattening: str
    lagging: frozenset[str] = frozenset()
    run_id: str = ""
    tables: TableFigures = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        batches: Sequence[Batch],
        flattening: FlatteningOptions,
        lagging: Iterable[str],
        run_id: str = "",
        tables: TableFigures | None = None,
    ) -> AppliedMark:
        """The mark of a job that read ``batches`` and failed the collections ``lagging``; ``run_id``
        started it, and left the collections' tables at ``tables``."""
        through = {rs: batch.seq for rs, batch in last_batches(batches).items()}
        counts = dict(Counter(batch.rs for batch in batches))
        return cls(through, counts, flattening_text(flattening), frozenset(lagging), run_id, tables or {})

    def figures(self, run_id: str) -> TableFigures:
        """The version and rows of the tables the job left, when run ``run_id`` started it (none
        otherwise: another run's job may have been followed by commits this mark does not know)."""
        return self.tables if run_id and run_id == self.run_id else {}

    def written_with(self, flattening: FlatteningOptions) -> bool:
        """Whether the job that wrote the mark had these flattening options."""
        return self.flattening == flattening_text(flattening)

    def unsettled(self, batches: Sequence[Batch]) -> set[str]:
        """The namespaces the mark does not cover: those ``lagging`` and those a batch past it names
        (rows, or a copy's manifest)."""
        within = Counter(batch.rs for batch in batches if batch.seq <= self.through.get(batch.rs, 0))
        # a replica set whose batches up to the mark are not the mark's: every batch of it is past
        trusted = {rs: seq for rs, seq in self.through.items() if within[rs] == self.batches.get(rs)}
        found = set(self.lagging)
        for batch in batches:
            if batch.seq > trusted.get(batch.rs, 0):
                found.update(batch.namespaces)
                found.update(batch.collections or ())
        return found


def read_mark(source_lake: SourceLake) -> AppliedMark | None:
    """The source's applied mark; None when there is none or it cannot be read (a warning)."""
    uri = source_lake.source_uri(lake.APPLIED_MARK)
    try:
        table = table_if_exists(uri, source_lake.options)
        rows = [] if table is None else _rows(source_lake, table)
        if not rows:
            return None
        (row,) = rows
        return AppliedMark(
            through=_counts(json.loads(row["through"])),
            batches=_counts(json.loads(row["batches"])),
            flattening=row["flattening"],
            lagging=frozenset(row["lagging"]),
            run_id=row.get("run_id") or "",  # a mark written before they were: none
            tables=_figures(json.loads(row.get("tables") or "{}")),
        )
    except (DeltaError, OSError, ValueError, TypeError, KeyError) as error:
        log.warning(
            "the applied mark %s cannot be read (%s: %s): every collection's tables are read instead, "
            "and the transform's next run writes a new mark",
            uri, type(error).__name__, error,
        )  # fmt: skip
        return None


def write_mark(source_lake: SourceLake, mark: AppliedMark) -> None:
    """Replace the source's applied mark with ``mark``. A lost race with another job's mark is left
    at that (either mark was true when written), and so is a failed write (a warning): the tables
    are committed, and a missing or older mark only costs the next runs reads."""
    row = {
        "through": json.dumps(dict(mark.through), sort_keys=True),
        "batches": json.dumps(dict(mark.batches), sort_keys=True),
        "flattening": mark.flattening,
        "lagging": sorted(mark.lagging),
        "written_at": dt.datetime.now(dt.timezone.utc),
        "run_id": mark.run_id,
        "tables": json.dumps(mark.tables, sort_keys=True),
    }
    uri = source_lake.source_uri(lake.APPLIED_MARK)
    try:
        write_deltalake(
            uri,
            pa.Table.from_pylist([row], schema=APPLIED_MARK_SCHEMA),
            mode="overwrite",
            schema_mode="overwrite",  # a mark of an older schema is replaced whole
            storage_options=source_lake.options,
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    except CommitFailedError as error:
        log.info("the applied mark %s was not replaced (%s): another job wrote one", uri, error)
    except (DeltaError, OSError) as error:
        log.warning(
            "the applied mark %s could not be written (%s: %s): the next runs read every collection's "
            "tables until a transform writes it", uri, type(error).__name__, error,
        )  # fmt: skip


def withdraw_figures(source_lake: SourceLake) -> None:
    """The source's mark without its tables' figures, before a job commits (see the module's
    docstring); nothing to do when it has none."""
    mark = read_mark(source_lake)
    if mark is not None and mark.run_id:
        write_mark(source_lake, replace(mark, run_id="", tables={}))


def flattening_text(flattening: FlatteningOptions) -> str:
    return json.dumps(flattening.to_json(), sort_keys=True)


def _rows(source_lake: SourceLake, table: DeltaTable) -> list[dict]:
    """The mark table's rows, its files read with the lake's own pyarrow filesystem: a pyarrow dataset
    over delta-rs' storage handler left a thread that, in a job that exits right after (one with
    no work), aborted the process at exit in about one run in seven."""
    filesystem, base = source_lake.location.filesystem()
    directory = lake.source_table_path(source_lake.prefix, lake.APPLIED_MARK)
    paths = file_actions(table).column("path").to_pylist()
    return [
        row
        for path in paths
        for row in pq.ParquetFile(lake_path(base, f"{directory}/{path}"), filesystem=filesystem)
        .read()
        .to_pylist()
    ]


def _figures(value: object) -> dict[str, dict[str, tuple[int, int]]]:
    if not isinstance(value, dict) or not all(isinstance(zones, dict) for zones in value.values()):
        raise ValueError(f"expected an object of namespaces to table figures, got {value!r}")
    return {
        namespace: {zone: (int(version), int(rows)) for zone, (version, rows) in zones.items()}
        for namespace, zones in value.items()
    }


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(rs, str) and type(seq) is int for rs, seq in value.items()
    ):
        raise ValueError(f"expected an object of replica set names to batch numbers, got {value!r}")
    return value
