"""``ShardsChangedSensor``: the topology DAG's sensor."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from mongo_cdc.capture.topology import discover_shards, topology_changed
from mongo_cdc.config import SourceConfig
from mongo_cdc_airflow.hooks import MongoCdcHook
from mongo_cdc_airflow.variables import stored_topology, topology_variable

log = logging.getLogger(__name__)


class ShardsChangedSensor(BaseSensorOperator):
    """Done when the cluster's live shard ids differ from the topology the last CDC run stored.

    Every poke logs both lists, so a reader of the task log sees what was compared.
    """

    def __init__(self, *, config: SourceConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config

    def poke(self, context: Any) -> PokeReturnValue:
        with MongoCdcHook(mongo_conn_id=self.config.mongo_conn_id).source_client() as client:
            live = discover_shards(client)
        stored = stored_topology(self.config.name)
        stored_ids = sorted(shard.id for shard in stored if not shard.retiring)
        live_ids = sorted(shard.id for shard in live)
        log.info(
            "stored shards (Variable %s): %s; live shards: %s",
            topology_variable(self.config.name),
            ", ".join(stored_ids) or "none",
            ", ".join(live_ids) or "none",
        )
        changed = topology_changed(stored, live)
        if changed:
            log.info(
                "shard list changed (added: %s; removed: %s): triggering mongo_cdc__%s",
                ", ".join(sorted(set(live_ids) - set(stored_ids))) or "none",
                ", ".join(sorted(set(stored_ids) - set(live_ids))) or "none",
                self.config.name,
            )
        return PokeReturnValue(is_done=changed, xcom_value=live_ids)
