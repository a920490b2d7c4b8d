"""Support for tests and the demo: real local mongod replica sets (no mocks)."""

from mongo_cdc_dev.testing.mongod import (
    MONGOD_WHEEL,
    MongodError,
    ReplicaSet,
    exit_on_sigterm,
    find_mongod,
    free_ports,
)

__all__ = ["MONGOD_WHEEL", "MongodError", "ReplicaSet", "exit_on_sigterm", "find_mongod", "free_ports"]
