"""``transform.backlog``: the committed batches with rows of a collection that its tables have not
applied, and ``transform.work``: whether the transform has anything to do for it, read from a real
lake (delta-rs tables, the batch log, the tables' app transactions)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from mongo_cdc import lake
from mongo_cdc.lake import landing
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.maintenance import MaintenanceSettings
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.backlog import (
    Backlog,
    behind_text,
    collection_backlog,
    collections_behind,
    source_backlogs,
)
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.raw_events import applied_app_id
from mongo_cdc.transform.work import source_work

ORDERS, USERS, EMPTY = "shop.orders", "shop.users", "shop.empty"
# --maintain without a slot
EVERY_TABLE = MaintenanceSettings(optimize_interval_hours=24, retention_hours=168)


def commit(source_lake: SourceLake, rs: str, seq: int, namespaces: tuple[str, ...], **manifest) -> None:
    """Batch ``seq`` of ``rs`` in the batch log (the raw rows are not needed to count it)."""
    source_lake.commit(Batch(rs, seq, "stream", None, seq << 32, namespaces=namespaces, **manifest))


def record_applied(source_lake: SourceLake, zone: str, namespace: str, applied: dict[str, int]) -> None:
    """A commit of a derived table with the app transactions the transform writes with its rows."""
    db, _, collection = namespace.partition(".")
    write_deltalake(
        lake.table_uri(source_lake.location, zone, source_lake.prefix, db, collection),
        pa.table({"__key": ["k"], lake.HOUR_COLUMN: ["2024-05-01T13"]}),  # no flattening recorded: defaults
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


def test_a_collection_has_transform_work_for_batches_a_manifest_other_flattening_hours_or_maintenance(
    tmp_path,
):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS, USERS), snapshot_cluster_time=1 << 32, collections=(ORDERS, USERS))
    defaults = FlatteningOptions()
    work = source_work(source_lake, source_lake.batches(), defaults)
    assert {namespace: w.reasons for namespace, w in work.items()} == {
        namespace: ["state batches to apply", "changes batches to apply"] for namespace in (ORDERS, USERS)
    }
    assert all(w.applies_batches for w in work.values())
    for namespace in (ORDERS, USERS):
        for zone in ("state", "changes"):
            record_applied(source_lake, zone, namespace, {"rs0": 1})
    # every table caught up: an idle run, which starts no Spark
    assert source_work(source_lake, source_lake.batches(), defaults) == {}

    # a copy that found no document of users lands no row of it, yet its manifest deletes them
    commit(source_lake, "rs0", 2, (ORDERS,), snapshot_cluster_time=2 << 32, collections=(ORDERS, USERS))
    work = source_work(source_lake, source_lake.batches(), defaults)
    assert work[USERS].reasons == ["a copy's manifest to apply"] and not work[USERS].applies_batches
    assert work[ORDERS].reasons == [
        "state batches to apply",
        "a copy's manifest to apply",
        "changes batches to apply",
    ]
    for namespace in (ORDERS, USERS):
        for zone in ("state", "changes"):
            record_applied(source_lake, zone, namespace, {"rs0": 2})
    batches = source_lake.batches()
    assert source_work(source_lake, batches, defaults) == {}

    # no new batch, yet other flattening options, hours to rewrite, maintenance: each is work
    flattened = source_work(source_lake, batches, FlatteningOptions(flatten_struct=True))
    assert {namespace: w.reasons for namespace, w in flattened.items()} == {
        namespace: ["changes table written with other flattening options"] for namespace in (ORDERS, USERS)
    }
    assert {
        namespace: w.reasons
        for namespace, w in source_work(source_lake, batches, defaults, ("2024-05-01T13",)).items()
    } == {namespace: ["hours of change rows to rewrite"] for namespace in (ORDERS, USERS)}
    assert {
        namespace: w.reasons
        for namespace, w in source_work(source_lake, batches, defaults, maintenance=EVERY_TABLE).items()
    } == {namespace: ["maintenance"] for namespace in (ORDERS, USERS)}


def test_a_copied_collection_without_rows_has_its_missing_tables_to_create_once(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS,), snapshot_cluster_time=1 << 32, collections=(ORDERS, EMPTY))
    defaults = FlatteningOptions()
    work = source_work(source_lake, source_lake.batches(), defaults)[EMPTY]
    assert work.reasons == ["empty tables to create (state, changes)"]
    assert work.updates_state and work.updates_changes and not work.applies_batches
    # a run that committed the state table and failed before the changes table: the changes table only
    record_applied(source_lake, "state", EMPTY, {"rs0": 1})
    work = source_work(source_lake, source_lake.batches(), defaults)[EMPTY]
    assert work.reasons == ["empty tables to create (changes)"]
    assert not work.updates_state and work.updates_changes
    record_applied(source_lake, "changes", EMPTY, {"rs0": 1})
    record_applied(source_lake, "state", ORDERS, {"rs0": 1})
    record_applied(source_lake, "changes", ORDERS, {"rs0": 1})
    assert source_work(source_lake, source_lake.batches(), defaults) == {}
    # its first documents are batches to apply, as any collection's
    commit(source_lake, "rs0", 2, (EMPTY,))
    work = source_work(source_lake, source_lake.batches(), defaults)
    assert {namespace: w.reasons for namespace, w in work.items()} == {
        EMPTY: ["state batches to apply", "changes batches to apply"]
    }


def test_the_batch_log_is_read_again_only_when_a_commit_moved_it(tmp_path, monkeypatch):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS,))
    reads = []
    read_rows = landing.read_rows
    monkeypatch.setattr(
        landing, "read_rows", lambda table, **kw: reads.append(table) or read_rows(table, **kw)
    )
    assert source_lake.batches() == source_lake.batches() and len(reads) == 1  # one read of version 1
    commit(source_lake, "rs0", 2, (USERS,))
    commit(SourceLake(LakeLocation(str(tmp_path)), "shop"), "rs1", 1, (ORDERS,))  # another writer's
    assert [(batch.rs, batch.seq) for batch in source_lake.batches()] == [("rs0", 1), ("rs0", 2), ("rs1", 1)]
