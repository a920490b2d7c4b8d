"""A point lookup on the state: how many of its files a reader opens (issue 47's budget).

deltalake's pyarrow dataset keeps a file only where its Delta statistics (``minValues``/
``maxValues``) may hold the value: the fragments ``get_fragments(filter=...)`` yields are the files
a filtered read opens. With the state's files clustered by ``__key`` (a build's slices and
compaction write narrow key ranges) and ``_id`` an ObjectId (whose ``__key`` sorts as it does), a
lookup by ``_id`` opens one file or two.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable

from mongo_cdc.lake.maintenance import maintain_table
from mongo_cdc.lake.readers import read_table
from mongo_cdc.lake.storage import LakeLocation, table_filesystem
from mongo_cdc_dev.bench.table import Row

# the budget's aim: a point lookup opens two files at most (the table's limit is exclusive)
LOOKUP_MAX_FILES = 3


def files_opened(uri: str, column: str, value: Any) -> tuple[int, int]:
    """(files a read of ``column == value`` opens, files in the table)."""
    table = DeltaTable(uri)
    dataset = table.to_pyarrow_dataset(filesystem=table_filesystem(table))
    opened = sum(1 for _ in dataset.get_fragments(filter=pc.field(column) == value))
    return opened, len(table.file_uris())


def middle_id(uri: str) -> str:
    """An ``_id`` from the middle of the state (its ObjectId text)."""
    ids = read_table(uri, columns=["_id"]).column("_id").to_pylist()
    return sorted(ids)[len(ids) // 2]


def compact(lake: LakeLocation, uri: str) -> None:
    """The maintenance's compaction of the state, as a scheduled run makes it (due, sorted by key)."""
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    maintain_table(uri, lake, 1, 168, later, "__key")


def lookup_rows(section: str, documents: int, figures: dict[str, tuple[int, int]]) -> list[Row]:
    """One row per table state: the files a lookup by ``_id`` opens, against the files there are."""
    return [
        Row(
            section,
            f"point lookup by _id on {documents:,} docs after {when}: files opened",
            opened,
            "files",
            opened / total,
            f"{total} files in the table",
            max_value=LOOKUP_MAX_FILES,
        )
        for when, (opened, total) in figures.items()
    ]
