"""Damaged data files are named with their fix; a lake of the previous layout is refused, and only it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from mongo_cdc.lake.errors import LakeFileError, LegacyLakeError, damaged_files, refuse_legacy_layout
from mongo_cdc.lake.readers import read_table
from mongo_cdc.lake.storage import LakeLocation


def two_partitions(uri: str, options: dict[str, str]) -> list[str]:
    """A table with one file per hour; returns the file URIs, hour 00's first."""
    batch = pa.table({"id": list(range(1000)), "hour": ["2026-01-01T00"] * 500 + ["2026-01-01T01"] * 500})
    write_deltalake(uri, batch, partition_by=["hour"], storage_options=options)
    return sorted(DeltaTable(uri, storage_options=options).file_uris())


@pytest.fixture
def lake(local_or_s3_lake: LakeLocation) -> LakeLocation:
    return local_or_s3_lake


def damage(lake: LakeLocation, file_uri: str, truncate: bool) -> None:
    fs, base = lake.filesystem()
    path = base + file_uri[len(lake.root) :]
    if truncate:
        data = fs.open_input_file(path).read()
        with fs.open_output_stream(path) as out:
            out.write(data[: len(data) // 2])
    else:
        fs.delete_file(path)


@pytest.mark.parametrize("truncate", [False, True], ids=["deleted", "truncated"])
def test_damaged_state_file_is_named_with_the_resnapshot_fix(lake: LakeLocation, truncate: bool) -> None:
    uri, options = lake.table_uri("state", "p", "shop", "orders"), dict(lake.storage_options)
    first, second = two_partitions(uri, options)
    damage(lake, first, truncate)
    problem = r"truncated: \d+ of \d+ bytes" if truncate else "missing"
    with pytest.raises(LakeFileError) as error:
        read_table(uri, options)
    message = str(error.value)
    assert re.search(rf"data file {re.escape(first)} \({problem}\)", message), message
    assert second not in message
    assert '{"resnapshot": true, "collections": ["shop.orders"]}' in message
    assert "Restore the file from a backup" in message
    # a read that does not touch the damaged file still works
    assert read_table(uri, options, filters=[("hour", "=", "2026-01-01T01")]).num_rows == 500


def test_damaged_raw_file_cannot_be_rebuilt(tmp_path: Path) -> None:
    uri = str(tmp_path / "lake" / "raw" / "p" / "shop" / "orders")
    first, _ = two_partitions(uri, {})
    os.remove(first)
    with pytest.raises(LakeFileError, match="raw history cannot be rebuilt") as error:
        read_table(uri)
    assert first in str(error.value) and "resnapshot" not in str(error.value)


def test_damaged_files_lists_only_the_damaged_ones(tmp_path: Path) -> None:
    uri = str(tmp_path / "lake" / "changes" / "p" / "shop" / "orders")
    first, _ = two_partitions(uri, {})
    os.remove(first)
    assert [(file.uri, file.problem) for file in damaged_files(uri)] == [(first, "missing")]


def test_other_errors_pass_through(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    two_partitions(uri, {})
    with pytest.raises(Exception, match="nope") as error:
        read_table(uri, columns=["nope"])
    assert not isinstance(error.value, LakeFileError)


def test_legacy_layouts_are_refused(tmp_path: Path) -> None:
    def lake_with(*files: str, links: tuple[tuple[str, str], ...] = ()) -> LakeLocation:
        root = tmp_path / f"lake{len(list(tmp_path.iterdir()))}"
        for name in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"a": [1]}), root / name) if name.endswith(".parquet") else (
                root / name
            ).write_text("{}")
        for link, target in links:
            (root / link).parent.mkdir(parents=True, exist_ok=True)
            (root / target).mkdir(parents=True, exist_ok=True)
            os.symlink(root / target, root / link)
        root.mkdir(exist_ok=True)
        return LakeLocation(str(root))

    old = lake_with("_versions/state/p/db/c/v000001/part-0.parquet")
    with pytest.raises(
        LegacyLakeError, match=rf"a _versions/ directory at {re.escape(old.root)}/_versions\."
    ) as error:
        refuse_legacy_layout(old, "p")
    assert "Nothing was written" in str(error.value) and '{"resnapshot": true}' in str(error.value)
    with pytest.raises(LegacyLakeError, match=r"a symlinked table directory at .*/state/p/db/c\."):
        refuse_legacy_layout(lake_with(links=(("state/p/db/c", "elsewhere/v000001"),)), "p")

    # the Delta layout, an empty lake, and a writer's leftovers before a table's first commit pass:
    # Parquet without a _delta_log in a table directory (raw, state, a reserved table) is no sign
    delta = lake_with(
        "raw/p/_snapshots/rs0-000000000001.json",
        "raw/p/db/new/hour=2026-01-01T00/part-00000-x.parquet",
        "state/p/db/new/part-00000-y.parquet",
        "raw/p/transaction/hour=2026-01-01T00/part-00000-z.parquet",
    )
    for table in ("raw/p/db/c", "state/p/db/c"):
        two_partitions(delta.table_uri(*table.split("/")), {})
    refuse_legacy_layout(delta, "p")
    refuse_legacy_layout(LakeLocation(str(tmp_path / "nothing-yet")), "p")


def test_legacy_layout_on_s3(s3_lake: LakeLocation) -> None:
    with s3_lake.open_output("state", "p", "db", "c", "part-00000-x.parquet") as out:
        pq.write_table(pa.table({"a": [1]}), out)
    refuse_legacy_layout(s3_lake, "p")  # a leftover of a first commit that never happened
    with s3_lake.open_output("_versions", "state", "p", "db", "c", "v000001", "part-0.parquet") as out:
        pq.write_table(pa.table({"a": [1]}), out)
    with pytest.raises(
        LegacyLakeError, match=rf"a _versions/ directory at {re.escape(s3_lake.root)}/_versions"
    ):
        refuse_legacy_layout(s3_lake, "p")
