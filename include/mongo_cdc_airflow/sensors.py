"""``ShardsChangedSensor``: the topology DAG's deferrable sensor, and ``ShardsChangedTrigger``, its wait
in the triggerer.

The topology DAG is unpaused when it is created and follows its CDC DAG's pause switch instead: its
sensor skips at once while the CDC DAG is paused or has not stored its shards yet (its first run
snapshots every shard anyway), so an on-call engineer has one switch per source, the CDC DAG's.
While it waits, the sensor holds no worker slot: the triggerer polls the cluster every
``poke_interval`` seconds (docs/deploying.md, "Running it under Airflow").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowSkipException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from mongo_cdc.capture.topology import Shard, discover_shards, topology_changed
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.dag_ids import cdc_dag_id
from mongo_cdc_airflow.hooks import MongoCdcHook
from mongo_cdc_airflow.variables import stored_topology, topology_variable

log = logging.getLogger(__name__)


def reason_not_to_watch(source: str, cdc_paused: bool, stored: list[Shard]) -> str | None:
    """Why the shard watch has nothing to do now (None: watch)."""
    if cdc_paused:
        return f"{cdc_dag_id(source)} is paused: the shard watch follows it and waits until it is unpaused"
    if not stored:
        return (
            f"{cdc_dag_id(source)} has not stored its shards yet (Variable {topology_variable(source)}): "
            "its first run snapshots every shard"
        )
    return None


def compare_shards(source: str, mongo_conn_id: str) -> dict[str, Any]:
    """The stored and live shard ids, and whether shards were added or removed; logs both lists."""
    with MongoCdcHook(mongo_conn_id=mongo_conn_id).source_client() as client:
        live = discover_shards(client)
    stored = stored_topology(source)
    stored_ids = sorted(shard.id for shard in stored if not shard.retiring)
    live_ids = sorted(shard.id for shard in live)
    log.info(
        "stored shards (Variable %s): %s; live shards: %s",
        topology_variable(source),
        ", ".join(stored_ids) or "none",
        ", ".join(live_ids) or "none",
    )
    return {
        "changed": topology_changed(stored, live),
        "added": sorted(set(live_ids) - set(stored_ids)),
        "removed": sorted(set(stored_ids) - set(live_ids)),
        "live": live_ids,
    }


class ShardsChangedTrigger(BaseTrigger):
    """Polls the cluster's shard ids until they differ from the stored topology or ``until`` (epoch
    seconds) comes; one event either way, ``changed`` saying which."""

    def __init__(self, source: str, mongo_conn_id: str, poke_interval: float, until: float) -> None:
        super().__init__()
        self.source = source
        self.mongo_conn_id = mongo_conn_id
        self.poke_interval = poke_interval
        self.until = until

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "source": self.source,
                "mongo_conn_id": self.mongo_conn_id,
                "poke_interval": self.poke_interval,
                "until": self.until,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            # pymongo and the Variable/Connection lookups block: a thread keeps the triggerer's loop free
            comparison = await asyncio.to_thread(compare_shards, self.source, self.mongo_conn_id)
            if comparison["changed"] or time.time() + self.poke_interval > self.until:
                yield TriggerEvent(comparison)
                return
            await asyncio.sleep(self.poke_interval)


class ShardsChangedSensor(BaseSensorOperator):
    """Done when the cluster's live shard ids differ from the topology the last CDC run stored; skipped
    when they did not change within ``timeout``, or when there is nothing to watch
    (``reason_not_to_watch``). Its XCom is the live shard ids.
    """

    def __init__(self, *, config: SourceConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config

    def execute(self, context: Any) -> None:
        self._skip_unless_watching(context)
        self.defer(trigger=self.trigger(), method_name="execute_complete")

    def trigger(self) -> ShardsChangedTrigger:
        """The wait in the triggerer, from now until the sensor's timeout."""
        return ShardsChangedTrigger(
            self.config.name, self.config.mongo_conn_id, self.poke_interval, until=time.time() + self.timeout
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> list[str]:
        if not event["changed"]:
            raise AirflowSkipException(f"no shard added or removed within {self.timeout:.0f} s")
        self._skip_unless_watching(context)  # paused while the trigger waited: trigger nothing
        log.info(
            "shard list changed (added: %s; removed: %s): triggering %s",
            ", ".join(event["added"]) or "none",
            ", ".join(event["removed"]) or "none",
            cdc_dag_id(self.config.name),
        )
        return event["live"]

    def _skip_unless_watching(self, context: Any) -> None:
        paused = context["ti"].get_dag(cdc_dag_id(self.config.name)).is_paused
        reason = reason_not_to_watch(self.config.name, paused, stored_topology(self.config.name))
        if reason:
            log.info("%s", reason)
            raise AirflowSkipException(reason)
