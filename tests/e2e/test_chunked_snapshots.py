"""Chunked, parallel, resumable snapshots (issue 11 items 1-4), end to end through Airflow's dag.test.

A collection is split into ``_id`` ranges following MongoDB's order across BSON types; the chunks
run as mapped ``snapshot_copy`` tasks, each committing on its own; a run cut short re-reads only
the chunks that did not commit; collections the filters start matching later are copied while the
others keep streaming from their position.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections import Counter
from dataclasses import replace

import bson
import pytest
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from cdc_support import assert_state_equals_collection
from datagen import COLLECTIONS, FALLBACK_FIELDS, load, random_writes
from pymongo.synchronous.pool import Connection

from mongo_cdc import extjson
from mongo_cdc.capture import chunk_reads, snapshot
from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.topology import make_client
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.snapshot_log import Chunk
from mongo_cdc_airflow.chunk_copy import split_evenly
from mongo_cdc_dev.testing.lake import database_source, memory_keeper

MIXED_DOCUMENTS = 200_000


def _mixed_ids(count: int) -> list:
    """``_id``s of every BSON type an ``_id`` can have, most of them ints, strings and ObjectIds."""
    rare = [MinKey(), MaxKey(), None, True, False, 2.5, Decimal128("7.25"), Int64(2**40),
            Timestamp(5, 1), Binary(b"\x01\x02", 0), {"nested": 1}, {"nested": "x"}]  # fmt: skip
    per_kind = (count - len(rare)) // 5
    day = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    return rare + [
        *range(per_kind),
        *(f"key-{i:07d}" for i in range(per_kind)),
        *(ObjectId() for _ in range(per_kind)),
        *(day + dt.timedelta(seconds=i) for i in range(per_kind)),
        *({"n": i} for i in range(count - len(rare) - 4 * per_kind)),
    ]


def _writes_racing_the_copy(monkeypatch, db, count: int, **options) -> dict:
    """Random writes in a thread started when the first chunks are copied (position and plan are
    recorded by then); ``["log"]`` holds their events, ``["thread"]`` the thread to join."""
    racing: dict = {}
    copy_chunks = snapshot.copy_chunks

    def copy_while_writing(*args, **kwargs):
        if "thread" not in racing:
            writes = threading.Thread(target=lambda: racing.update(log=random_writes(db, count, **options)))
            racing["thread"] = writes
            writes.start()
        return copy_chunks(*args, **kwargs)

    monkeypatch.setattr(snapshot, "copy_chunks", copy_while_writing)
    return racing


def _states(run) -> dict:
    return {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}


def _keys(source, collection: str) -> Counter:
    return Counter(row["key"] for row in source.raw_rows(collection) if row["op"] == "r")


def _expected_keys(client, database: str, collection: str) -> Counter:
    ids = (
        client[database].get_collection(collection, codec_options=extjson.DECODE_OPTIONS).find({}, {"_id": 1})
    )
    return Counter(extjson.document_key(document["_id"]) for document in ids)


def test_mixed_id_types_snapshot_in_parallel_chunks_each_document_once(cdc_source, replica_set, db_name):
    source = cdc_source(
        db_name,
        **{"snapshot.chunk.size": 20_000, "snapshot.max.tasks": 3, "snapshot.max.threads": 2},
    )
    with replica_set.client() as client:
        ids = _mixed_ids(MIXED_DOCUMENTS)
        client[db_name].mixed.insert_many(({"_id": i, "n": n} for n, i in enumerate(ids)), ordered=False)
        client[db_name].create_collection("empty")
        run = source.run(skip_spark=True)

        [batch] = [batch for batch in source.lake.batches() if batch.kind == "snapshot"]
        plan = source.lake.snapshot_plan("rs0", batch.raw_seq)
        mixed = [chunk for chunk in plan.chunks if chunk.namespace == f"{db_name}.mixed"]
        assert len(mixed) >= 8
        # every document once, none missing: the union of the chunks is the collection
        assert _keys(source, "mixed") == _expected_keys(client, db_name, "mixed")
        assert sum(_keys(source, "mixed").values()) == MIXED_DOCUMENTS
    assert batch.manifest.collections == (f"{db_name}.empty", f"{db_name}.mixed")
    copied = source.lake.copied_chunks("rs0", batch.raw_seq)
    assert sum(copied.values()) == MIXED_DOCUMENTS and len(copied) == len(plan.chunks)
    # the chunks ran as snapshot.max.tasks mapped instances labelled by shard, collection and chunks
    states = _states(run)
    labels = [ti.rendered_map_index for ti in run.get_task_instances() if ti.task_id == "snapshot_copy"]
    assert [states[("snapshot_copy", i)] for i in range(3)] == ["success"] * 3
    assert len(labels) == 3 and all(label.startswith("rs0: ") for label in labels)
    assert f"{db_name}.mixed 1–" in "".join(labels) and f"/{len(mixed)}" in "".join(labels)


def test_work_is_cut_into_at_most_max_tasks_even_runs():
    assert split_evenly(list(range(10)), 4) == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    assert split_evenly([1, 2], 8) == [[1], [2]]
    assert split_evenly([], 3) == []


@pytest.mark.slow
def test_a_run_cut_short_re_reads_only_the_chunks_that_did_not_commit(
    cdc_source, replica_set, db_name, monkeypatch
):
    """The copy dies right after chunk 5's rows committed, before the snapshot log recorded any chunk
    (the worst moment): the next run reads only chunks 6-10, and chunk 5's rows are not doubled."""
    source = cdc_source(db_name, **{"snapshot.chunk.size": 150, "snapshot.max.tasks": 1})
    with replica_set.client() as client:
        load(client[db_name], {"orders": 1500})
        read: list[str] = []
        raw_batches = chunk_reads._raw_batches

        def reading(collection, fetch_size, chunk, query=None):
            read.append(chunk.label)
            return raw_batches(collection, fetch_size, chunk, query)

        monkeypatch.setattr(chunk_reads, "_raw_batches", reading)
        write_chunk = SourceLake.write_chunk
        written = []

        def dying(lake, rs, seq, chunk, data):
            write_chunk(lake, rs, seq, chunk, data)
            written.append(chunk)
            if len(written) == 5:
                raise RuntimeError("injected crash: chunk 5 committed, not recorded")

        monkeypatch.setattr(SourceLake, "write_chunk", dying)
        run = source.run(expect="failed", skip_spark=True)
        states = _states(run)
        assert states[("snapshot_copy", 0)] == "failed"
        # the pull went on beside the copy; the commit waits for the chunks left
        assert states[("shard_sync.snapshot", 0)] == "failed" and states[("shard_sync.pull", 0)] == "success"
        names = [f"{db_name}.orders {n}/10" for n in range(1, 11)]
        # chunks 1-5, and those read ahead while chunk 5 committed (small chunks commit behind the reads)
        assert read[:5] == names[:5] and read == names[: len(read)]
        # the snapshot is not committed yet (the pull beside it may have committed its position)
        assert [batch for batch in source.lake.batches() if batch.kind == "snapshot"] == []
        assert source.raw_rows("orders") == []
        plan = source.lake.snapshot_plan("rs0", 1)
        committed = {chunk.label for chunk in plan.chunks if source.lake.chunk_landed("rs0", 1, chunk)}
        assert set(names[:5]) <= committed  # those started before the crash finished their commits

        monkeypatch.setattr(SourceLake, "write_chunk", write_chunk)
        read.clear()
        client[db_name].orders.insert_one({"_id": 10**6, "status": "written between the runs"})
        source.run()
        assert read == [name for name in names if name not in committed]  # committed ones are not read again
        assert _keys(source, "orders") == _expected_keys(client, db_name, "orders")
        assert_state_equals_collection(source, client, "orders", FALLBACK_FIELDS["orders"])


@pytest.mark.slow
def test_writes_racing_a_chunked_parallel_snapshot_are_not_lost(
    cdc_source, replica_set, db_name, monkeypatch
):
    source = cdc_source(
        db_name,
        **{
            "snapshot.chunk.size": 300,
            "snapshot.max.tasks": 3,
            "snapshot.max.threads": 2,
            "snapshot.fetch.size": 50,
        },
    )
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 1500, "orders": 1500, "products": 1500})
        writer = _writes_racing_the_copy(monkeypatch, db, 400, seed=3)
        source.run()
        writer["thread"].join()
        monkeypatch.undo()
        source.run()  # streams whatever the first run's pull did not reach yet
        [batch] = [batch for batch in source.lake.batches() if batch.kind == "snapshot"]
        assert len(source.lake.snapshot_plan("rs0", batch.raw_seq).chunks) == 15
        for collection in COLLECTIONS:
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])
            assert source.streamed_events(collection) == writer["log"].of(collection)


@pytest.mark.slow
def test_a_collection_added_to_the_include_list_is_copied_while_the_others_stream_on(
    cdc_source, replica_set, db_name, monkeypatch
):
    include = {"collection.include.list": [f"{db_name}\\.customers"], "snapshot.chunk.size": 200}
    source = cdc_source(db_name, **include)
    with replica_set.client() as client:
        db = client[db_name]
        load(db, {"customers": 300, "orders": 700})
        source.run(skip_spark=True)
        assert source.raw_rows("orders") == []
        seq_before = source.lake.committed()["rs0"]

        writes = random_writes(db, 300, seed=5)  # both collections; orders' are not streamed yet
        source = cdc_source(
            db_name, **{**include, "collection.include.list": [f"{db_name}\\.(customers|orders)"]}
        )
        racing = _writes_racing_the_copy(monkeypatch, db, 200, seed=6, start_index=200_000)
        source.run()
        racing["thread"].join()
        monkeypatch.undo()
        source.run()

        [copy] = [b for b in source.lake.batches() if b.kind == "snapshot" and b.seq > seq_before]
        assert copy.manifest.collections == (f"{db_name}.orders",)
        assert len(source.lake.snapshot_plan("rs0", copy.raw_seq).chunks) >= 4  # chunked like any snapshot
        # customers were not copied again: their events streamed on from the stored position, no gap
        assert sum(_keys(source, "customers").values()) == 300
        assert source.streamed_events("customers") == writes.of("customers") + racing["log"].of("customers")
        # orders' events since the stored position are streamed too: the state skips those older
        # than the copy
        assert source.streamed_events("orders") == writes.of("orders") + racing["log"].of("orders")
        for collection in ("customers", "orders"):
            assert_state_equals_collection(source, client, collection, FALLBACK_FIELDS[collection])


def test_newly_captured_names_only_collections_the_recorded_filter_did_not_match(
    replica_set, db_name, tmp_path
):
    config = database_source("t", tmp_path, db_name, collection_include=(re.compile(rf"{db_name}\.(a|b.*)"),))
    with replica_set.client() as client:
        for name in ("a", "b1", "c"):
            client[db_name][name].insert_one({"_id": 1})
        recorded = Offset(snapshot={"status": "complete", "captured": config.capture_filter})
        assert snapshot.newly_captured(client, config, recorded) == ()
        client[db_name]["b2"].insert_one({"_id": 1})  # created later under the same filter: streamed whole
        wider = replace(config, collection_include=(re.compile(rf"{db_name}\..*"),))
        assert snapshot.newly_captured(client, wider, recorded) == (f"{db_name}.c",)
        # an offset from before capture filters were recorded: nothing is taken for new
        assert snapshot.newly_captured(client, wider, Offset(snapshot={"status": "complete"})) == ()


def test_a_chunk_names_its_range_for_labels_and_logs():
    low = bson.encode({"_id": ObjectId("0123456789abcdef01234567")})
    chunk = Chunk("db.c", 2, 5, (("_id", 1),), low, None, 100)
    assert chunk.label == "db.c 3/5"
    assert chunk.describe() == '[{"$oid":"0123456789abcdef01234567"}, end)'


def test_one_copier_reads_the_next_chunk_while_this_one_commits(replica_set, db_name, tmp_path, monkeypatch):
    """With one thread, chunk n+1's first batch is read while chunk n's file is written and committed,
    and a range chunk is read in several batches, so the server reads while the client encodes."""
    config = database_source("shop", tmp_path / "lake", re.escape(db_name), snapshot_chunk_size=1_000)
    events: list[str] = []
    raw_batches, write_chunk = chunk_reads._raw_batches, SourceLake.write_chunk
    fetch_sizes = []

    def reading(collection, fetch_size, chunk, query=None):
        events.append(f"read {chunk.index}")
        fetch_sizes.append(fetch_size)
        return raw_batches(collection, fetch_size, chunk, query)

    def committing(lake, rs, seq, chunk, data):
        write_chunk(lake, rs, seq, chunk, data)
        events.append(f"commit {chunk.index}")

    monkeypatch.setattr(chunk_reads, "_raw_batches", reading)
    monkeypatch.setattr(SourceLake, "write_chunk", committing)
    with make_client(replica_set.uri) as client:
        client[db_name].orders.insert_many([{"_id": i, "n": i} for i in range(4_000)])
        result = snapshot.run_snapshot(ReplicaSetCapture(client, config, memory_keeper(config, "rs0")))
    assert result.total == 4_000
    chunks = sum(event.startswith("commit") for event in events)
    assert chunks >= 3
    # the next chunk's read starts before this chunk's commit ends
    for index in range(chunks - 1):
        assert events.index(f"read {index + 1}") < events.index(f"commit {index}"), events
    assert all(0 < size < 1_000 for size in fetch_sizes), fetch_sizes


def test_the_server_streams_a_chunks_batches_unasked(replica_set, db_name, monkeypatch):
    """An exhaust cursor: the server sends a chunk's batches one after the other, reading the next
    while the client takes this one. The client sends a find and one getMore, not a getMore a batch
    (mongod's own counters count the batches it streams as getMores too: the client's messages tell)."""
    sent: list[int] = []
    send_message = Connection.send_message

    def counting(connection, message, max_doc_size):
        sent.append(len(message))
        return send_message(connection, message, max_doc_size)

    with make_client(replica_set.uri) as client:
        orders = client[db_name].orders
        orders.insert_many([{"_id": i} for i in range(4_000)])
        whole = Chunk(orders.full_name, 0, 1)
        in_range = Chunk(
            orders.full_name, 0, 1, (("_id", 1),), bson.encode({"_id": 1_000}), bson.encode({"_id": 3_000})
        )
        monkeypatch.setattr(Connection, "send_message", counting)
        for chunk, documents in ((whole, 4_000), (in_range, 2_000)):
            sent.clear()
            batches = list(chunk_reads._raw_batches(orders, 50, chunk))
            assert len(batches) == documents // 50
            assert sum(len(bson.decode_all(batch)) for batch in batches) == documents
            assert len(sent) == 2, sent  # find, then one getMore: the rest came unasked
