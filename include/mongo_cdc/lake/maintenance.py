"""Table maintenance: compact small files, delete the files of versions past the retention.

Both are ordinary Delta commits, so readers never wait: a reader keeps reading the version it
started with, whose files vacuum leaves alone for ``lake.retention.hours``. A reader (or time
travel) that needs a version older than that may find its files gone.

The table's own retention properties are kept equal to ``lake.retention.hours`` so that other
Delta writers (delta-spark's VACUUM, say) honour the same setting, and so that the checkpoint
written after a vacuum drops the tombstones it has dealt with (delta-rs lists the tombstones
still in the log on every vacuum, and would commit an empty VACUUM pair on every run).

Crash leftovers. A writer killed before its commit leaves data files no log names: in an existing
table (vacuum's "full" mode deletes them; its default "lite" mode only deletes files the log
removed), or in the directory of a table whose first commit never happened (delta-rs writes a new
table's data files before ``_delta_log/00000000000000000000.json``). Such a directory is no table to
any reader or writer (delta-rs opens it as "not found" and creates the table there without reading
the files); ``remove_uncommitted_leftovers`` deletes its files once they are as old as vacuum's.
Files no log names are kept at least ``UNCOMMITTED_MIN_AGE_HOURS`` whatever the retention: a writer
between its data files and its commit (a pull landing raw rows beside this transform, a first build)
has written exactly such files, and deleting them would make its commit name missing files.

Spread over runs. A scheduled run maintains one share of the collections (``maintained``: its
settings' ``slot`` of ``optimize_interval_hours``, by a stable hash of the namespace), so each
collection's tables are maintained once per interval and no run visits every table of a source of
thousands; the source-wide work (the leftovers' listing) is the slot-0 run's (``maintains_source``).
Settings without a slot (a run by hand) maintain everything.
"""

from __future__ import annotations

import datetime as dt
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyarrow.fs import FileInfo, FileSelector, FileSystem, FileType

from mongo_cdc.lake.file_rewrites import COMPACTION, OPERATION_METADATA, compact, heal
from mongo_cdc.lake.layout import STAGING_DIR, ZONES
from mongo_cdc.lake.storage import LakeLocation, open_table

# Delta's default: the log keeps 30 days of commits. Time travel needs the commit and the files,
# so a longer file retention lengthens the log's too.
_DEFAULT_LOG_RETENTION_HOURS = 30 * 24

# no mongo-cdc writer takes this long between its first data file and its commit
UNCOMMITTED_MIN_AGE_HOURS = 24


_SETTINGS_FORM = (
    '{"optimize_interval_hours": <hours>, "retention_hours": <hours>} and optionally '
    '"slot": <the share of the collections this run maintains, below optimize_interval_hours>'
)


@dataclass(frozen=True)
class MaintenanceSettings:
    """What a transform run maintains (the job's ``--maintain`` argument): ``lake.optimize.interval.hours``,
    ``lake.retention.hours``, and the ``slot`` of a scheduled run's share (None: every collection)."""

    optimize_interval_hours: int
    retention_hours: int
    slot: int | None = None

    def to_text(self) -> str:
        """The ``--maintain`` argument: a JSON object, ``slot`` left out when there is none."""
        settings = {
            "optimize_interval_hours": self.optimize_interval_hours,
            "retention_hours": self.retention_hours,
        }
        if self.slot is not None:
            settings["slot"] = self.slot
        return json.dumps(settings, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> MaintenanceSettings:
        """The settings a ``to_text`` wrote; ValueError saying what is expected for anything else."""
        try:
            settings = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not JSON ({error})") from None
        keys = {"optimize_interval_hours", "retention_hours"}
        if (
            not isinstance(settings, dict)
            or set(settings) - {"slot"} != keys
            or not all(
                isinstance(value, int) and not isinstance(value, bool) and value >= 0
                for value in settings.values()
            )
            or settings.get("slot", 0) >= max(settings["optimize_interval_hours"], 1)
        ):
            raise ValueError(f"expected {_SETTINGS_FORM}")
        return cls(**settings)


def maintained(settings: MaintenanceSettings, namespace: str) -> bool:
    """Whether a run with these ``--maintain`` settings maintains the collection's tables: every
    collection without a ``slot``; with one, those whose namespace's CRC-32 falls in it (stable across
    processes and runs, where Python's ``hash`` is not)."""
    shares, slot = settings.optimize_interval_hours, settings.slot
    return slot is None or not shares or zlib.crc32(namespace.encode()) % shares == slot


def maintains_source(settings: MaintenanceSettings) -> bool:
    """Whether the run does the source-wide maintenance too (``remove_uncommitted_leftovers``)."""
    return settings.slot in (None, 0)


def maintain_table(
    table_uri: str,
    location: LakeLocation,
    optimize_interval_hours: int,
    retention_hours: int,
    now: dt.datetime,
    cluster_by: str | None = None,
) -> dict[str, Any]:
    """Heal the files that need it (``file_rewrites.heal``), compact when the last compaction is
    ``optimize_interval_hours`` old (0: never; files sorted by ``cluster_by``), then vacuum.

    Returns what it did: ``{"version", "files_healed", "optimized", "files_added", "files_removed",
    "files_vacuumed"}`` (``version``: the table's version afterwards).
    """
    table = open_table(table_uri, location.storage_options)
    _align_retention(table, retention_hours)
    done: dict[str, Any] = {"optimized": False, "files_added": 0, "files_removed": 0}
    done["files_healed"] = heal(table, location)
    if optimize_interval_hours and _optimize_due(table, optimize_interval_hours, now):
        removed, added = compact(table, location, cluster_by)
        done.update(optimized=True, files_added=added, files_removed=removed)
    vacuumed = _vacuum(table, retention_hours, full=retention_hours >= UNCOMMITTED_MIN_AGE_HOURS)
    if retention_hours < UNCOMMITTED_MIN_AGE_HOURS:
        vacuumed += _vacuum(table, UNCOMMITTED_MIN_AGE_HOURS, full=True)
    if vacuumed:
        table.create_checkpoint()
    done.update(files_vacuumed=len(vacuumed), version=table.version())
    return done


def _vacuum(table: Any, retention_hours: int, full: bool) -> list[str]:
    """Delete the files older than ``retention_hours`` that the log removed, and (``full``) those no
    log entry names: the leftovers of commits that never happened."""
    return table.vacuum(
        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False, full=full
    )


def _optimize_due(table: Any, interval_hours: int, now: dt.datetime) -> bool:
    """No compaction in the history yet (``file_rewrites.compact``, or a delta-rs OPTIMIZE of a lake
    written before it), or the last one committed ``interval_hours`` before ``now``."""
    last = next((entry for entry in table.history() if _is_compaction(entry)), None)
    if last is None:
        return True
    committed = dt.datetime.fromtimestamp(last["timestamp"] / 1000, tz=dt.timezone.utc)
    return now - committed >= dt.timedelta(hours=interval_hours)


def _is_compaction(entry: Mapping[str, Any]) -> bool:
    return entry.get("operation") == "OPTIMIZE" or entry.get(OPERATION_METADATA) == COMPACTION


def _align_retention(table: Any, retention_hours: int) -> None:
    wanted = {
        "delta.deletedFileRetentionDuration": f"interval {retention_hours} hours",
        "delta.logRetentionDuration": f"interval {max(retention_hours, _DEFAULT_LOG_RETENTION_HOURS)} hours",
    }
    current = table.metadata().configuration
    if any(current.get(key) != value for key, value in wanted.items()):
        table.alter.set_table_properties(wanted)


def remove_uncommitted_leftovers(
    location: LakeLocation, prefix: str, retention_hours: int, now: dt.datetime
) -> list[str]:
    """Delete the files under ``prefix``'s zones that no table's log names and vacuum does not see,
    last modified ``retention_hours`` (at least ``UNCOMMITTED_MIN_AGE_HOURS``) before ``now``;
    returns their URIs.

    Those are every file outside a directory with a ``_delta_log`` (a leftover of a first commit
    that never happened: mongo-cdc keeps nothing else there), and the files of a killed transform
    under a table's ``STAGING_DIR``. The rest of a table is vacuum's. Younger files are kept, as
    vacuum keeps them: they may be a write under way.
    """
    fs, root = location.filesystem()
    cutoff = now - dt.timedelta(hours=max(retention_hours, UNCOMMITTED_MIN_AGE_HOURS))
    stale: list[FileInfo] = []
    for zone in ZONES:
        stale.extend(_uncommitted_files(fs, f"{root}/{zone}/{prefix}", cutoff))
    for info in stale:
        fs.delete_file(info.path)
    return [location.root + info.path[len(root) :] for info in stale]


def _uncommitted_files(fs: FileSystem, path: str, cutoff: dt.datetime) -> list[FileInfo]:
    children = fs.get_file_info(FileSelector(path, allow_not_found=True))
    if any(child.base_name == "_delta_log" for child in children):
        staged = [child.path for child in children if child.base_name == STAGING_DIR]
        return [
            info
            for directory in staged
            for info in fs.get_file_info(FileSelector(directory, recursive=True))
            if _older(info, cutoff)
        ]
    found = [child for child in children if _older(child, cutoff)]
    for child in children:
        if child.type == FileType.Directory:
            found.extend(_uncommitted_files(fs, child.path, cutoff))
    return found


def _older(info: FileInfo, cutoff: dt.datetime) -> bool:
    """A file last modified at ``cutoff`` or before."""
    return info.type == FileType.File and info.mtime is not None and info.mtime <= cutoff
