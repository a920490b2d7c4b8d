"""``transform.applied_mark``: the collections the transform's last run left caught up are not read
again until a batch names them, and a mark that may be wrong is never trusted. Real delta-rs tables:
a mark that says more than the tables do is how a test tells a read table from one left unread."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import zlib

import pyarrow as pa
from deltalake import write_deltalake
from test_backlog import EVERY_TABLE, ORDERS, USERS, commit, record_applied

from mongo_cdc import lake
from mongo_cdc.lake.batch_log import BATCH_LOG_SCHEMA, Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.maintenance import maintained
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.applied_mark import (
    APPLIED_MARK_SCHEMA,
    AppliedMark,
    flattening_text,
    read_mark,
    withdraw_figures,
    write_mark,
)
from mongo_cdc.transform.backlog import Backlog, source_backlogs
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.work import WorkPlan, plan_work, source_work

DEFAULTS = FlatteningOptions()


def two_collections_marked_applied(tmp_path) -> SourceLake:
    """Orders and users with batch 1 of rs0 each, which no table has applied, and a mark saying every
    table has: wherever the mark is trusted, their tables are not read."""
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS, USERS))
    write_mark(source_lake, AppliedMark.of(source_lake.batches(), DEFAULTS, ()))
    return source_lake


def test_the_mark_round_trips_through_its_table(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    assert read_mark(source_lake) is None
    commit(source_lake, "rs0", 1, (ORDERS,))
    commit(source_lake, "rs0", 2, (USERS,))
    commit(source_lake, "rs1", 7, (ORDERS,))
    written = AppliedMark.of(source_lake.batches(), DEFAULTS, {USERS})
    write_mark(source_lake, written)
    assert written == AppliedMark(
        {"rs0": 2, "rs1": 7}, {"rs0": 2, "rs1": 1}, written.flattening, frozenset({USERS})
    )
    assert read_mark(source_lake) == written
    assert written.written_with(DEFAULTS) and not written.written_with(FlatteningOptions(flatten_struct=True))


def test_the_tables_figures_are_given_only_to_the_run_that_started_the_job(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS, USERS))
    figures = {ORDERS: {"state": (3, 10), "changes": (2, 14)}, USERS: {"state": (0, 1)}}
    write_mark(
        source_lake, AppliedMark.of(source_lake.batches(), DEFAULTS, (), "scheduled__2024-05-01", figures)
    )
    mark = read_mark(source_lake)
    assert mark is not None and mark.figures("scheduled__2024-05-01") == figures
    # another run's summary (its transform failed or never ran), or a job started by no run: none
    assert mark.figures("scheduled__2024-05-02") == {} and mark.figures("") == {}
    # a job about to commit withdraws them, and keeps what the mark says of the batches
    withdraw_figures(source_lake)
    withdrawn = read_mark(source_lake)
    assert withdrawn == AppliedMark(mark.through, mark.batches, mark.flattening, mark.lagging)
    assert withdrawn.figures("scheduled__2024-05-01") == {}


def test_a_mark_written_before_the_figures_were_reads_as_one_without_them(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS,))
    row = {"through": '{"rs0": 1}', "batches": '{"rs0": 1}', "flattening": flattening_text(DEFAULTS),
           "lagging": [], "written_at": dt.datetime.now(dt.timezone.utc)}  # fmt: skip
    older = pa.schema([field for field in APPLIED_MARK_SCHEMA if field.name not in ("run_id", "tables")])
    write_deltalake(source_lake.source_uri(lake.APPLIED_MARK), pa.Table.from_pylist([row], schema=older))
    assert read_mark(source_lake) == AppliedMark({"rs0": 1}, {"rs0": 1}, flattening_text(DEFAULTS))
    assert source_work(source_lake, source_lake.batches(), DEFAULTS) == {}
    # the job's next mark replaces it whole, in the new schema
    write_mark(
        source_lake, AppliedMark.of(source_lake.batches(), DEFAULTS, (), "run", {ORDERS: {"state": (1, 1)}})
    )
    assert read_mark(source_lake).figures("run") == {ORDERS: {"state": (1, 1)}}


def test_collections_the_mark_covers_have_no_work_and_no_backlog_without_a_table_read(tmp_path):
    source_lake = two_collections_marked_applied(tmp_path)
    batches = source_lake.batches()
    assert source_work(source_lake, batches, DEFAULTS) == {}
    assert source_backlogs(source_lake, batches) == {ORDERS: Backlog(), USERS: Backlog()}

    # a newer batch of orders: orders is read (its tables applied nothing: both batches are behind)
    commit(source_lake, "rs0", 2, (ORDERS,))
    batches = source_lake.batches()
    assert sorted(source_work(source_lake, batches, DEFAULTS)) == [ORDERS]
    behind = frozenset({("rs0", 1), ("rs0", 2)})
    assert source_backlogs(source_lake, batches) == {ORDERS: Backlog(behind, behind), USERS: Backlog()}

    # a copy's manifest naming users past the mark: users is read too
    commit(source_lake, "rs0", 3, (), snapshot_cluster_time=3 << 32, collections=(USERS,))
    assert sorted(source_work(source_lake, source_lake.batches(), DEFAULTS)) == [ORDERS, USERS]


def test_a_collection_the_last_run_failed_is_read_until_it_catches_up(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS, USERS))
    batches = source_lake.batches()
    write_mark(source_lake, AppliedMark.of(batches, DEFAULTS, {USERS}))
    assert sorted(source_work(source_lake, batches, DEFAULTS)) == [USERS]
    assert source_backlogs(source_lake, batches)[USERS] == Backlog(
        frozenset({("rs0", 1)}), frozenset({("rs0", 1)})
    )


def test_plan_work_reads_tables_only_up_to_the_first_collection_with_work(tmp_path, monkeypatch):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    many = [f"shop.c{index:02d}" for index in range(20)]
    commit(source_lake, "rs0", 1, tuple(many))
    write_mark(source_lake, AppliedMark.of(source_lake.batches(), DEFAULTS, ()))
    read: list[str] = []
    tables = SourceLake.tables
    monkeypatch.setattr(
        SourceLake,
        "tables",
        lambda self, namespaces, zones: read.extend(namespaces) or tables(self, namespaces, zones),
    )
    # the mark covers every collection: no table is read
    assert plan_work(source_lake, source_lake.batches(), DEFAULTS) == WorkPlan(None, (), ())
    assert read == []

    # a batch past the mark names every collection: all are pending, the first few are read
    commit(source_lake, "rs0", 2, tuple(reversed(many)))
    plan = plan_work(source_lake, source_lake.batches(), DEFAULTS)
    assert plan == WorkPlan(many[0], ("state batches to apply", "changes batches to apply"), tuple(many))
    assert read and set(read) < set(many) and many[0] in read
    assert plan.every is None  # the job reads every collection itself

    # the ones read have applied it (a job whose mark was not written): the next ones are read
    for namespace in read:
        for zone in ("state", "changes"):
            record_applied(source_lake, zone, namespace, {"rs0": 2})
    first_read = set(read)
    plan = plan_work(source_lake, source_lake.batches(), DEFAULTS)
    assert plan.first == min(set(many) - first_read) and plan.pending == tuple(many)


def test_plan_work_without_a_mark_reads_every_collection_and_names_those_behind(tmp_path):
    source_lake = SourceLake(LakeLocation(str(tmp_path)), "shop")
    commit(source_lake, "rs0", 1, (ORDERS, USERS))
    for zone in ("state", "changes"):
        record_applied(source_lake, zone, ORDERS, {"rs0": 1})
    plan = plan_work(source_lake, source_lake.batches(), DEFAULTS)
    assert plan == WorkPlan(USERS, ("state batches to apply", "changes batches to apply"), (USERS,))
    # having read every collection, it hands the job source_work's answer rather than have it read again
    assert plan.every == source_work(source_lake, source_lake.batches(), DEFAULTS)
    # maintenance is work, but not a backlog
    plan = plan_work(source_lake, source_lake.batches(), DEFAULTS, maintenance=EVERY_TABLE)
    assert plan == WorkPlan(ORDERS, ("maintenance",), (USERS,))


def test_the_mark_is_not_trusted_where_it_may_be_wrong(tmp_path, caplog):
    source_lake = two_collections_marked_applied(tmp_path)
    for zone in ("state", "changes"):
        record_applied(source_lake, zone, USERS, {"rs0": 1})
    batches = source_lake.batches()
    # other flattening options, hours to rewrite, maintenance: every table is read
    flattened = FlatteningOptions(flatten_struct=True)
    assert sorted(source_work(source_lake, batches, flattened)) == [ORDERS, USERS]
    assert sorted(source_work(source_lake, batches, DEFAULTS, ("2024-05-01T13",))) == [ORDERS, USERS]
    assert sorted(source_work(source_lake, batches, DEFAULTS, maintenance=EVERY_TABLE)) == [ORDERS, USERS]
    # a scheduled run maintains one share of the collections: only those are read besides the mark's
    share = dataclasses.replace(EVERY_TABLE, slot=zlib.crc32(USERS.encode()) % 24)
    assert not maintained(share, ORDERS)  # the test's two collections fall in different shares
    assert {
        ns: w.reasons for ns, w in source_work(source_lake, batches, DEFAULTS, maintenance=share).items()
    } == {USERS: ["maintenance"]}

    # a batch numbered below the mark's last, committed after it (the batch log is not the one the
    # mark counted): every batch of that replica set is read, not those of the others
    commit(source_lake, "rs1", 5, (USERS,))
    write_mark(source_lake, AppliedMark.of(source_lake.batches(), DEFAULTS, ()))
    late = Batch("rs1", 4, "stream", None, 4 << 32, namespaces=(USERS,))
    write_deltalake(
        source_lake.source_uri(lake.BATCH_LOG),
        pa.Table.from_pylist([late.to_row()], schema=BATCH_LOG_SCHEMA),
        mode="append",
    )
    assert sorted(source_work(source_lake, source_lake.batches(), DEFAULTS)) == [USERS]

    # a mark that cannot be read: a warning, and every table is read
    write_deltalake(
        source_lake.source_uri(lake.APPLIED_MARK), pa.table({"through": ["not json"]}), mode="overwrite",
        schema_mode="overwrite",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, "mongo_cdc.transform.applied_mark"):
        assert read_mark(source_lake) is None
        assert sorted(source_work(source_lake, source_lake.batches(), DEFAULTS)) == [ORDERS, USERS]
    assert "_applied cannot be read (JSONDecodeError" in caplog.text
    assert "every collection's tables are read instead" in caplog.text
