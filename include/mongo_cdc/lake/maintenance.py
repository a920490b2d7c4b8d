"""Table maintenance: compact small files, delete the files of versions past the retention.

Both are ordinary Delta commits, so readers never wait: a reader keeps reading the version it
started with, whose files vacuum leaves alone for ``lake.retention.hours``. A reader (or time
travel) that needs a version older than that may find its files gone.

The table's own retention properties are kept equal to ``lake.retention.hours`` so that other
Delta writers (delta-spark's VACUUM, say) honour the same setting, and so that the checkpoint
written after a vacuum drops the tombstones it has dealt with (delta-rs lists the tombstones
still in the log on every vacuum, and would commit an empty VACUUM pair on every run).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from mongo_cdc.lake.storage import open_table

# Delta's default: the log keeps 30 days of commits. Time travel needs the commit and the files,
# so a longer file retention lengthens the log's too.
_DEFAULT_LOG_RETENTION_HOURS = 30 * 24


def maintain_table(
    table_uri: str,
    storage_options: Mapping[str, str] | None,
    optimize_interval_hours: int,
    retention_hours: int,
    now: dt.datetime,
) -> dict[str, Any]:
    """Compact when the last OPTIMIZE is ``optimize_interval_hours`` old (0: never), then vacuum.

    Returns what it did: ``{"version", "optimized", "files_added", "files_removed",
    "files_vacuumed"}`` (``version``: the table's version afterwards).
    """
    table = open_table(table_uri, storage_options)
    _align_retention(table, retention_hours)
    done: dict[str, Any] = {"optimized": False, "files_added": 0, "files_removed": 0}
    if optimize_interval_hours and _optimize_due(table, optimize_interval_hours, now):
        metrics = table.optimize.compact()
        done.update(
            optimized=True,
            files_added=metrics["numFilesAdded"],
            files_removed=metrics["numFilesRemoved"],
        )
    vacuumed = table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False)
    if vacuumed:
        table.create_checkpoint()
    done.update(files_vacuumed=len(vacuumed), version=table.version())
    return done


def _optimize_due(table: Any, interval_hours: int, now: dt.datetime) -> bool:
    """No OPTIMIZE in the history yet, or the last one committed ``interval_hours`` before ``now``."""
    last = next((entry for entry in table.history() if entry.get("operation") == "OPTIMIZE"), None)
    if last is None:
        return True
    committed = dt.datetime.fromtimestamp(last["timestamp"] / 1000, tz=dt.timezone.utc)
    return now - committed >= dt.timedelta(hours=interval_hours)


def _align_retention(table: Any, retention_hours: int) -> None:
    wanted = {
        "delta.deletedFileRetentionDuration": f"interval {retention_hours} hours",
        "delta.logRetentionDuration": f"interval {max(retention_hours, _DEFAULT_LOG_RETENTION_HOURS)} hours",
    }
    current = table.metadata().configuration
    if any(current.get(key) != value for key, value in wanted.items()):
        table.alter.set_table_properties(wanted)
