"""``ReplicaSetCapture``: what every capture step of one replica set needs, as one value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pymongo import MongoClient

    from mongo_cdc.capture.offsets import OffsetKeeper
    from mongo_cdc.config import SourceConfig
    from mongo_cdc.lake.landing import SourceLake


@dataclass(frozen=True)
class ReplicaSetCapture:
    """One replica set of one source: a client connected to it, the source's settings, and the
    keeper of its offset (which knows the replica set's name and the source's lake). Snapshots,
    pulls and backfills take it whole, so the four never drift apart between two calls."""

    client: MongoClient
    config: SourceConfig
    keeper: OffsetKeeper

    @property
    def rs(self) -> str:
        return self.keeper.rs

    @property
    def lake(self) -> SourceLake:
        return self.keeper.lake
