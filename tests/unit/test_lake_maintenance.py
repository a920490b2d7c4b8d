"""maintain_table: compaction on its interval, vacuum past the retention, time travel in between."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from mongo_cdc.lake.errors import LakeFileError
from mongo_cdc.lake.maintenance import maintain_table
from mongo_cdc.lake.readers import read_table
from mongo_cdc.lake.storage import LakeLocation

HOURS = ("2026-01-01T00", "2026-01-01T01")


def small_appends(uri: str, options: dict[str, str], ids: range) -> None:
    for i in ids:
        batch = pa.table({"id": [i], "hour": [HOURS[i % 2]]})
        write_deltalake(uri, batch, partition_by=["hour"], mode="append", storage_options=options)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_maintain_compacts_vacuums_and_keeps_retained_versions(where: str, tmp_path: Path, request) -> None:
    lake = LakeLocation(str(tmp_path)) if where == "local" else request.getfixturevalue("s3_lake")
    uri, options = lake.table_uri("changes", "p", "db", "c"), dict(lake.storage_options)
    small_appends(uri, options, range(12))
    before = DeltaTable(uri, storage_options=options)
    assert len(before.file_uris()) == 12
    now = dt.datetime.now(dt.timezone.utc)

    done = maintain_table(uri, lake, optimize_interval_hours=24, retention_hours=1, now=now)
    after = DeltaTable(uri, storage_options=options)
    assert done["optimized"] and (done["files_removed"], done["files_added"]) == (12, 2)
    assert done["files_vacuumed"] == 0  # the small files were removed just now: still retained
    assert len(after.file_uris()) == 2
    assert done["version"] == after.version()  # what a run reports: the compaction's commit included
    assert sorted(read_table(uri, options).column("id").to_pylist()) == list(range(12))
    assert after.metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 1 hours"
    assert sorted(read_table(uri, options, version=5).column("id").to_pylist()) == list(range(6))

    # within the interval: no second compaction, even with new small files
    small_appends(uri, options, range(12, 13))
    again = maintain_table(uri, lake, optimize_interval_hours=24, retention_hours=1, now=now)
    assert not again["optimized"] and again["files_vacuumed"] == 0
    later = maintain_table(uri, lake, 24, 1, now + dt.timedelta(hours=25))
    assert (
        later["optimized"] and later["files_removed"] == 2
    )  # hour 00's compacted file + the new one (id 12)
    assert later["version"] == DeltaTable(uri, storage_options=options).version()

    # retention 0: every removed file goes; old versions can no longer be read, the latest can
    gone = maintain_table(uri, lake, optimize_interval_hours=0, retention_hours=0, now=now)
    assert not gone["optimized"] and gone["files_vacuumed"] == 12 + 2
    assert sorted(read_table(uri, options).column("id").to_pylist()) == list(range(13))
    with pytest.raises(LakeFileError, match=r"\(missing\).*Version 5 may be older than lake.retention.hours"):
        read_table(uri, options, version=5)
    # the checkpoint after a vacuum keeps the next one from re-listing what is already deleted
    version = DeltaTable(uri, storage_options=options).version()
    assert maintain_table(uri, lake, 0, 0, now) == {
        "files_healed": 0,
        "optimized": False,
        "files_added": 0,
        "files_removed": 0,
        "files_vacuumed": 0,
        "version": version,
    }


def test_optimize_interval_zero_never_compacts(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    small_appends(uri, {}, range(4))
    done = maintain_table(
        uri,
        LakeLocation(str(tmp_path)),
        optimize_interval_hours=0,
        retention_hours=168,
        now=dt.datetime.now(dt.UTC),
    )
    assert not done["optimized"] and len(DeltaTable(uri).file_uris()) == 4
