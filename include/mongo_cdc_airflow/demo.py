"""`make demo`: replicate Debezium's sample `inventory` database end to end on this machine.

Starts a one-member replica set under .local/demo, loads the sample data, runs the CDC DAG
(snapshot), applies a scripted mix of inserts/updates/deletes, runs the DAG again (streaming),
prints per collection the live documents, state-table rows and landed change events by op,
then stops the mongod it started. Every run starts from a clean .local/demo, so it can be
repeated. Exits non-zero when a state table does not match its collection.

``--load-into URI`` only loads the sample data (the compose stack's one-shot loader).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterator

from mongo_cdc.config.dag_ids import cdc_dag_id
from mongo_cdc_airflow import local_env

DEMO_DIR = os.path.join(local_env.REPO_ROOT, ".local", "demo")
DAG_ID = cdc_dag_id("inventory")
LOG_TAIL_LINES = 60


def inventory_documents() -> dict[str, list[dict]]:
    """Debezium's tutorial `inventory` database (MongoDB flavour)."""
    from bson import Int64

    customers = [
        ("Sally", "Thomas", "sally.thomas@acme.com"),
        ("George", "Bailey", "gbailey@foobar.com"),
        ("Edward", "Walker", "ed@walker.com"),
        ("Anne", "Kretchmar", "annek@noanswer.org"),
    ]
    products = [
        ("scooter", "Small 2-wheel scooter", 3.14, 3),
        ("car battery", "12V car battery", 8.1, 8),
        ("12-pack drill bits", "12-pack of drill bits with sizes ranging from #40 to #3", 0.8, 18),
        ("hammer", "12oz carpenter's hammer", 0.75, 4),
        ("hammer", "14oz carpenter's hammer", 0.875, 5),
        ("hammer", "16oz carpenter's hammer", 1.0, 0),
        ("rocks", "box of assorted rocks", 5.3, 44),
        ("jacket", "water resistent black wind breaker", 0.1, 2),
        ("spare tire", "24 inch spare tire", 22.2, 5),
    ]
    orders = [
        ("2016-01-16", 1001, 1, 102),
        ("2016-01-17", 1002, 2, 105),
        ("2016-02-19", 1002, 2, 106),
        ("2016-02-21", 1003, 1, 107),
    ]
    return {
        "customers": [
            {"_id": Int64(1001 + i), "first_name": f, "last_name": last, "email": e}
            for i, (f, last, e) in enumerate(customers)
        ],
        "products": [
            {"_id": Int64(101 + i), "name": n, "description": d, "weight": w, "quantity": q}
            for i, (n, d, w, q) in enumerate(products)
        ],
        "orders": [
            {
                "_id": Int64(10001 + i),
                "order_date": dt.datetime.fromisoformat(day).replace(tzinfo=dt.timezone.utc),
                "purchaser_id": Int64(purchaser),
                "quantity": quantity,
                "product_id": Int64(product),
            }
            for i, (day, purchaser, quantity, product) in enumerate(orders)
        ],
    }


def load_inventory(db) -> None:
    """Insert the sample documents into each collection of ``db`` that is still empty.

    Leaving non-empty collections alone makes a restarted compose stack's loader (``--load-into``)
    a no-op instead of a duplicate-key failure.
    """
    for name, documents in inventory_documents().items():
        if db[name].estimated_document_count() == 0:
            db[name].insert_many(documents)


def apply_changes(db) -> None:
    """The scripted mix streamed by the second run."""
    from bson import Int64

    db.customers.insert_one(
        {"_id": Int64(1005), "first_name": "Kenneth", "last_name": "Anderson", "email": "kander@acme.com"}
    )
    db.customers.update_one({"_id": Int64(1004)}, {"$set": {"first_name": "Anne Marie"}})
    db.customers.update_one({"_id": Int64(1003)}, {"$unset": {"email": ""}})
    db.products.update_many({"name": "hammer"}, {"$inc": {"quantity": 10}})
    db.products.update_one({"_id": Int64(108)}, {"$push": {"tags": "outdoor"}})
    db.products.delete_one({"_id": Int64(109)})
    db.orders.replace_one(
        {"_id": Int64(10004)},
        {
            "order_date": dt.datetime(2016, 2, 22, tzinfo=dt.timezone.utc),
            "purchaser_id": Int64(1003),
            "quantity": 2,
            "product_id": Int64(107),
        },
    )
    db.orders.insert_one(
        {
            "_id": Int64(10005),
            "order_date": dt.datetime(2016, 3, 1, tzinfo=dt.timezone.utc),
            "purchaser_id": Int64(1005),
            "quantity": 1,
            "product_id": Int64(101),
        }
    )
    db.customers.delete_one({"_id": Int64(1002)})


def raw_ops(lake_root: str, prefix: str, namespace: str) -> Counter:
    from mongo_cdc.lake.landing import SourceLake
    from mongo_cdc.lake.storage import LakeLocation

    ops = SourceLake(LakeLocation(lake_root), prefix).committed_raw(namespace, columns=["op"]).column("op")
    return Counter(op or "tombstone" for op in ops.to_pylist())


def table_rows(uri: str) -> int:
    """Live rows of a Delta table (its files' row counts in the log, as any Delta reader counts them), 0
    if it has none yet."""
    from mongo_cdc.lake.storage import row_count, table_if_exists

    return row_count(table_if_exists(uri, {}))


@contextlib.contextmanager
def output_to(path: str) -> Iterator[None]:
    """Send this process's stdout and stderr (and its children's: spark-submit) to ``path``.

    ``dag.test()`` logs every task at WARNING and above, and without a DAG processor or scheduler
    it warns about what only they would do (assets no parsed DAG registered, mapped tasks it has
    not expanded yet): noise for a demo, which prints its own steps and points at this log when a
    run fails.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, original in zip((1, 2), saved, strict=True):
                os.dup2(original, fd)
                os.close(original)


def run_dag(label: str, log_path: str) -> None:
    from airflow.dag_processing.dagbag import DagBag

    print(f"== {label}: running {DAG_ID} (Airflow's log: {log_path}) ...", flush=True)
    with output_to(log_path):
        dag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag(DAG_ID)
        run = dag.test()
    if run.state != "success":
        failed = [ti.task_id for ti in run.get_task_instances() if ti.state != "success"]
        with open(log_path, errors="replace") as log_file:
            sys.stderr.writelines(log_file.readlines()[-LOG_TAIL_LINES:])
        raise SystemExit(
            f"demo: DAG run {run.run_id} ended {run.state}; tasks not successful: {failed}; "
            f"the last {LOG_TAIL_LINES} lines of {log_path} are above"
        )


def report(client, lake_root: str, prefix: str) -> bool:
    from mongo_cdc.lake import table_uri
    from mongo_cdc.lake.storage import LakeLocation

    location = LakeLocation(lake_root)
    matches = True
    print(f"{'collection':<22}{'live docs':>10}{'state rows':>12}{'change rows':>13}  raw events by op")
    for collection in ("customers", "orders", "products"):
        live = client.inventory[collection].count_documents({})
        state = table_rows(table_uri(location, "state", prefix, "inventory", collection))
        changes = table_rows(table_uri(location, "changes", prefix, "inventory", collection))
        ops = raw_ops(lake_root, prefix, f"inventory.{collection}")
        flag = "" if live == state else "   <-- MISMATCH"
        matches &= live == state
        by_op = ", ".join(f"{op}={n}" for op, n in sorted(ops.items()))
        print(f"inventory.{collection:<12}{live:>10}{state:>12}{changes:>13}  {by_op}{flag}")
    return matches


def main() -> int:
    from mongo_cdc_dev.testing import ReplicaSet, exit_on_sigterm

    exit_on_sigterm()
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    lake_root = os.path.join(DEMO_DIR, "lake")
    with ReplicaSet("rs0", os.path.join(DEMO_DIR, "mongo")) as replica_set:
        print(f"== mongod replica set rs0 at {replica_set.uri}", flush=True)
        local_env.configure(os.path.join(DEMO_DIR, "airflow"), lake_root, replica_set.uri)
        os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
        local_env.migrate()
        from mongo_cdc.config import load_source

        prefix = load_source(
            os.path.join(local_env.REPO_ROOT, "include", "sources", "inventory.yaml")
        ).topic_prefix
        with replica_set.client() as client:
            load_inventory(client.inventory)
            log_path = os.path.join(DEMO_DIR, "airflow", "dag-runs.log")
            run_dag("snapshot", log_path)
            report(client, lake_root, prefix)
            apply_changes(client.inventory)
            run_dag("streaming", log_path)
            ok = report(client, lake_root, prefix)
    print(f"== lake at {lake_root}; mongod stopped", flush=True)
    if not ok:
        print("demo: a state table does not match its collection", file=sys.stderr)
        return 1
    return 0


def load_into(uri: str) -> int:
    """The compose stack's loader: the sample data into database ``inventory`` behind ``uri``."""
    from pymongo import MongoClient

    with MongoClient(uri) as client:
        load_inventory(client.inventory)
        counts = {name: client.inventory[name].count_documents({}) for name in inventory_documents()}
    print(f"inventory at {uri}: {counts}", flush=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--load-into", metavar="URI", help="only load the sample data into this MongoDB (no demo run)"
    )
    args = parser.parse_args()
    sys.exit(load_into(args.load_into) if args.load_into else main())
