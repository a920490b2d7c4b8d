"""What mongo-cdc keeps in Airflow Variables: offsets (``offsets.OffsetStore``) and each source's topology."""

from __future__ import annotations

import json

from airflow.sdk import Variable

from mongo_cdc.capture.offsets import OffsetKeeper
from mongo_cdc.capture.topology import Shard
from mongo_cdc.config import SourceConfig
from mongo_cdc_airflow.lake_storage import source_lake

# Shown next to each offset Variable in the UI (docs/offsets.md).
OFFSET_DESCRIPTION = (
    "mongo-cdc offset of one replica set: where its change stream resumes and its last committed "
    "batch. It caches the lake's batch log (raw/<topic.prefix>/_batches), which is the authority: an "
    "offset behind the log is healed from it, one that disagrees with it fails the run with the exact "
    "`airflow variables set` command that restores the lake's position. Opening and saving it "
    "unchanged is safe. Do not move its position by hand: delete it for a new snapshot of the replica "
    'set, or trigger the DAG with {"resnapshot": true}. See docs/offsets.md.'
)


class VariableOffsetStore:
    """``offsets.OffsetStore`` backed by Airflow Variables (JSON text, with ``OFFSET_DESCRIPTION``)."""

    def get(self, key: str) -> str | None:
        return Variable.get(key, default=None)

    def set(self, key: str, value: str) -> None:
        Variable.set(key, value, description=OFFSET_DESCRIPTION)

    def keys(self, prefix: str) -> list[str]:
        return list(Variable.keys(prefix=prefix))


def offset_keeper(config: SourceConfig, rs: str) -> OffsetKeeper:
    """The replica set's offset Variable, checked against the source's lake."""
    return OffsetKeeper(VariableOffsetStore(), config.name, rs, source_lake(config))


def topology_variable(source: str) -> str:
    return f"mongo_cdc.{source}.topology"


def stored_topology(source: str) -> list[Shard]:
    """The shards the last live ``discover`` stored (empty before the first run)."""
    key = topology_variable(source)
    text = Variable.get(key, default=None)
    if text is None:
        return []
    try:
        return [Shard.from_dict(entry) for entry in json.loads(text)]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"Variable '{key}' is not a valid shard list ({exc}); delete it "
            f"(`airflow variables delete {key}`): the next run discovers the shards again"
        ) from None


def store_topology(source: str, shards: list[Shard]) -> None:
    Variable.set(topology_variable(source), json.dumps([shard.to_dict() for shard in shards]))
