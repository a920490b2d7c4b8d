"""``transform.backlog``: the committed batches with rows of a collection that its tables have not
applied, read from a real lake (delta-rs tables, the batch log, the tables' app transactions)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from mongo_cdc import lake
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.backlog import (
    Backlog,
    behind_text,
    collection_backlog,
    collections_behind,
    source_backlogs,
)
from mongo_cdc.transform.raw_events import applied_app_id

ORDERS, USERS, EMPTY = "shop.orders", "shop.users", "shop.empty"


def commit(source_lake: SourceLake, rs: str, seq: int, namespaces: tuple[str, ...], **manifest) -> None:
    """Batch ``seq`` of ``rs`` in the batch log (the raw rows are not needed to count it)."""
    source_lake.commit(Batch(rs, seq, "stream", None, seq << 32, namespaces=namespaces, **manifest))


def record_applied(source_lake: SourceLake, zone: str, namespace: str, applied: dict[str, int]) -> None:
    """A commit of a derived table with the app transactions the transform writes with its rows."""
    db, _, collection = namespace.partition(".")
    write_deltalake(
        lake.table_uri(source_lake.location, zone, source_lake.prefix, db, collection),
        pa.table({"__key": ["k"]}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(applied_app_id(zone, rs), seq) for rs, seq in applied.items()]
        ),
    )


def test_a_collection_is_behind_by_the_committed_batches_with_its_rows_that_a_table_has_not_applied(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(
        source_lake,
        "rs0",
        1,
        (ORDERS, USERS),
        snapshot_cluster_time=1 << 32,
        collections=(ORDERS, USERS, EMPTY),
    )
    commit(source_lake, "rs0", 2, (USERS,))
    commit(source_lake, "rs0", 3, (ORDERS,))
    commit(source_lake, "rs1", 1, (ORDERS,))
    commit(source_lake, "rs1", 2, ())  # a batch that wrote no rows (a position only)
    batches = source_lake.batches()

    # no tables yet: every batch with rows of the collection is pending in both
    assert collection_backlog(source_lake, ORDERS, batches) == Backlog(
        state=frozenset({("rs0", 1), ("rs0", 3), ("rs1", 1)}),
        changes=frozenset({("rs0", 1), ("rs0", 3), ("rs1", 1)}),
    )
    # the tables record what they applied per replica set; the state is ahead of the changes
    record_applied(source_lake, "state", ORDERS, {"rs0": 3, "rs1": 0})
    record_applied(source_lake, "changes", ORDERS, {"rs0": 1})
    backlog = collection_backlog(source_lake, ORDERS, batches)
    assert backlog == Backlog(state=frozenset({("rs1", 1)}), changes=frozenset({("rs0", 3), ("rs1", 1)}))
    assert (backlog.batches, backlog.of_table("state"), backlog.of_table("changes")) == (2, 1, 2)

    # a table that applied every batch (the transform records each replica set's last): caught up
    record_applied(source_lake, "state", USERS, {"rs0": 3, "rs1": 2})
    record_applied(source_lake, "changes", USERS, {"rs0": 3, "rs1": 2})
    everyone = source_backlogs(source_lake, batches)
    # a collection only a manifest names, without rows, has no tables to bring up to date
    assert list(everyone) == [ORDERS, USERS]
    assert {namespace: b.batches for namespace, b in everyone.items()} == {ORDERS: 2, USERS: 0}
    assert collections_behind(everyone) == {ORDERS: 2}

    # a batch committed later with rows of the collection: one more behind, until it is applied
    commit(source_lake, "rs0", 4, (USERS,))
    assert collection_backlog(source_lake, USERS, source_lake.batches()).batches == 1
    record_applied(source_lake, "state", USERS, {"rs0": 4, "rs1": 2})
    record_applied(source_lake, "changes", USERS, {"rs0": 4, "rs1": 2})
    assert collection_backlog(source_lake, USERS, source_lake.batches()) == Backlog()


def test_behind_text_names_each_collection_with_its_count():
    assert behind_text({USERS: 1, ORDERS: 3}) == "shop.orders (3 batches behind), shop.users (1 batch behind)"
