"""A time-series collection captured in batches, end to end (Airflow dag.test, a real mongod, real
Spark): measurements inserted before and after the first run land once each, however often the
windows overlap; a late measurement inside the lateness window lands at the next run, one beyond it
at the reconcile, which also lands a ``deleteMany`` and an ``updateMany`` on the ``metaField``, so
the state then equals the collection. The bucket collection never reaches the lake. Once dropped,
the collection's state empties.

One source and four DAG runs (the first without Spark) serve the whole sequence.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

from bson import json_util
from conftest import make_source

from mongo_cdc.capture.raw_tables import raw_documents

DB_COLLECTION = "cpu"
LATENESS_S = 600


def _measurement(host: str, value: int, minutes_ago: float) -> dict:
    at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=minutes_ago)
    # MongoDB keeps milliseconds: the state's bytes are compared with the collection's
    return {"t": at.replace(microsecond=at.microsecond // 1000 * 1000), "host": host, "v": value}


def _summary(run) -> dict:
    return run.get_task_instance("summary").xcom_pull(task_ids="summary")


def _raw_ops(source) -> Counter:
    return Counter(
        (json_util.loads(row["key"])["id"], row["op"]) for row in source.raw_rows(DB_COLLECTION) if row["op"]
    )


def test_measurements_land_once_and_the_reconcile_makes_the_state_equal_the_collection(
    airflow_db, tmp_path, replica_set, db_name
):
    source = make_source(tmp_path, replica_set.uri, db_name, **{"time.series.lateness.seconds": LATENESS_S})
    client = replica_set.client()
    db = client[db_name]
    db.create_collection(DB_COLLECTION, timeseries={"timeField": "t", "metaField": "host"})
    cpu = db[DB_COLLECTION]
    # before the first run, inside the next run's window: read again then, landed once
    cpu.insert_many([_measurement("a", 1, 3), _measurement("b", 2, 2), _measurement("c", 3, 1)])

    first = _summary(source.run(skip_spark=True))
    namespace = f"{db_name}.{DB_COLLECTION}"
    assert first["events"][namespace] == {"r": 3}
    freshness = first["time_series"][namespace]
    assert freshness["window_start"] is None and freshness["reconciled"] is False
    assert freshness["lateness_seconds"] == LATENESS_S
    assert (freshness["time_field"], freshness["meta_field"]) == ("t", "host")

    # after it: a new one, a late one inside the window, one beyond it (older than the watermark
    # less the lateness)
    cpu.insert_many([_measurement("b", 4, 0), _measurement("c", 5, 5), _measurement("a", 6, 120)])
    second = _summary(source.run())
    assert second["events"][namespace] == {"r": 2}  # the three of the first run are not landed again
    assert second["time_series"][namespace]["window_start"] is not None
    assert 6 not in {row["v"] for row in source.state_rows(DB_COLLECTION)}  # beyond the window

    cpu.delete_many({"host": "b"})
    cpu.update_many({"host": "c"}, {"$set": {"host": "d"}})
    third = _summary(source.run(conf={"verify": True}))
    assert third["time_series"][namespace]["reconciled"] is True
    # the late one, the two measurements updated and the two deleted
    assert third["events"][namespace] == {"c": 1, "u": 2, "d": 2}
    # byte for byte as MongoDB sends them (a measurement's _id is not its first field)
    stored = sorted(row["__doc_bson"] for row in source.state_rows(DB_COLLECTION))
    assert stored == sorted(
        document for batch in cpu.find_raw_batches() for document in raw_documents(batch).to_pylist()
    )
    ops = _raw_ops(source)
    assert max(ops.values()) == 1, ops  # no measurement landed twice with one op
    reads = Counter(key for key, op in ops if op == "r")
    assert len(reads) == 5 and set(reads.values()) == {1}
    changes = Counter((row["_id"], row["__op"]) for row in source.change_rows(DB_COLLECTION))
    assert max(changes.values()) == 1 and sum(changes.values()) == 10
    # the buckets are MongoDB's storage, never a table of the lake
    assert all("system.buckets" not in namespace for namespace in source.lake.namespaces())

    # dropped: its measurements land as deletes, at the next run and without a reconcile
    cpu.drop()
    fourth = _summary(source.run())
    assert fourth["events"][namespace] == {"d": len(stored)}
    assert source.state_rows(DB_COLLECTION) == []
    batches = len(source.lake.batches())
    assert namespace not in _summary(source.run(skip_spark=True))["events"]  # then nothing more
    # at most the pull's position batch (none when the oplog did not move between the two pulls)
    later = source.lake.batches()[batches:]
    assert all(batch.kind == "position" and not batch.namespaces for batch in later), later
