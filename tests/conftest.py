from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from mongo_cdc.testing import ReplicaSet

# ---------------------------------------------------------------------------------------------
# MongoDB: one real single-member replica set per test session (change streams need a replica set).
# Self-contained: uses only mongo_cdc.testing and pytest.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def replica_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    with ReplicaSet("rs0", tmp_path_factory.mktemp("mongod")) as rs:
        yield rs


@pytest.fixture
def db_name(request: pytest.FixtureRequest) -> str:
    """A database name no other test uses, so tests sharing ``replica_set`` don't see each other's data."""
    # MongoDB caps database names at 63 bytes and forbids characters such as "/. \"$".
    stem = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:40]
    return f"t_{stem}_{uuid.uuid4().hex[:8]}"
