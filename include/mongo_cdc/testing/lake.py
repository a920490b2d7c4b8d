"""Offsets for tests and the benchmark: kept in memory, checked against a local lake."""

from __future__ import annotations

from mongo_cdc.config import SourceConfig
from mongo_cdc.landing import SourceLake
from mongo_cdc.offsets import MemoryOffsetStore, OffsetKeeper
from mongo_cdc.storage import LakeLocation


def memory_keeper(config: SourceConfig, rs: str, store: MemoryOffsetStore | None = None) -> OffsetKeeper:
    """A keeper of ``rs``'s offset in ``store`` (a new one by default), with the source's lake."""
    lake = SourceLake(LakeLocation(config.lake_root), config.topic_prefix)
    return OffsetKeeper(store if store is not None else MemoryOffsetStore(), config.name, rs, lake)
