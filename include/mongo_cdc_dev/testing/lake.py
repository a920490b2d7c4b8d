"""Sources and offsets for tests and the benchmark: a source capturing some databases into a local
lake, its offsets kept in memory and checked against that lake."""

from __future__ import annotations

import os
import re
from typing import Any

from mongo_cdc.capture.offsets import MemoryOffsetStore, OffsetKeeper
from mongo_cdc.config import SourceConfig
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation


def database_source(
    name: str, lake_root: str | os.PathLike[str], database: str, **settings: Any
) -> SourceConfig:
    """A source named ``name`` (its topic prefix too, unless ``settings`` give one) capturing the
    databases the regex ``database`` matches into the lake at ``lake_root``; ``settings``: other
    ``SourceConfig`` fields."""
    fields = {
        "name": name,
        "path": f"<{name}>",
        "topic_prefix": name,
        "lake_root": str(lake_root),
        "database_include": (re.compile(database),),
        **settings,
    }
    return SourceConfig(**fields)


def memory_keeper(config: SourceConfig, rs: str, store: MemoryOffsetStore | None = None) -> OffsetKeeper:
    """A keeper of ``rs``'s offset in ``store`` (a new one by default), with the source's lake."""
    lake = SourceLake(LakeLocation(config.lake_root), config.topic_prefix)
    return OffsetKeeper(store if store is not None else MemoryOffsetStore(), config.name, rs, lake)
