"""The benchmark's documents and the change backlog, generated from seeds (no data set to download)."""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bson import Int64, ObjectId
from pymongo import DeleteOne, UpdateOne
from pymongo.collection import Collection

INSERT_BATCH = 5_000
LARGE_DOCUMENT_BYTES = 64 * 1024
_BASE = dt.datetime(2024, 1, 1)
_CITIES = ("Berlin", "Lisbon", "Osaka", "Quito", "Accra", "Perth")


def small_documents(start: int, count: int) -> list[dict]:
    """~170 bytes of BSON each: a flat customer row with an int64, a date, an array, a sub-document."""
    rnd = random.Random(start)
    return [
        {
            "_id": ObjectId(),
            "name": f"customer-{i}",
            "n": i,
            "big": Int64(i * 1_000_003),
            "price": round(rnd.random() * 1000, 2),
            "when": _BASE + dt.timedelta(seconds=i),
            "tags": ["new", "vip", f"t{i % 17}"][: 1 + i % 3],
            "addr": {"city": _CITIES[i % len(_CITIES)], "zip": f"{i % 100_000:05d}"},
        }
        for i in range(start, start + count)
    ]


def nested_documents(start: int, count: int) -> list[dict]:
    """~4 KB of BSON each: a customer with 7 orders of 4 items each, with dates, doubles, and nulls."""
    rnd = random.Random(start)
    return [
        {
            "_id": ObjectId(),
            "customer": {
                "name": f"customer-{i}",
                "email": f"c{i}@example.com",
                "since": _BASE + dt.timedelta(days=i % 3000),
                "tier": ("gold", "silver", "bronze")[i % 3],
                "address": {
                    "street": f"{i} Long Street",
                    "city": _CITIES[i % len(_CITIES)],
                    "zip": f"{i % 100_000:05d}",
                    "geo": {"lat": rnd.uniform(-90, 90), "lon": rnd.uniform(-180, 180)},
                },
            },
            "orders": [
                {
                    "order_id": i * 1_000 + j,
                    "placed": _BASE + dt.timedelta(minutes=i + j),
                    "status": ("open", "paid", "shipped", "returned")[j % 4],
                    "total": round(rnd.random() * 500, 2),
                    "coupon": None if j % 2 else "SPRING",
                    "items": [
                        {
                            "sku": f"SKU-{(i + j + k) % 5000:05d}",
                            "qty": 1 + k % 4,
                            "price": round(rnd.random() * 100, 2),
                            "attrs": {
                                "color": ("red", "blue", "green")[k % 3],
                                "size": ("S", "M", "L")[k % 3],
                            },
                        }
                        for k in range(4)
                    ],
                }
                for j in range(7)
            ],
            "notes": "lorem ipsum dolor sit amet " * 12,
            "scores": [rnd.random() for _ in range(16)],
            "flags": {"active": bool(i % 2), "verified": i % 3 == 0, "beta": None},
        }
        for i in range(start, start + count)
    ]


def large_documents(start: int, count: int) -> list[dict]:
    """~64 KB of BSON each: a text body (an attachment, a rendered page) beside a few small fields."""
    return [
        {
            "_id": ObjectId(),
            "name": f"page-{i}",
            "n": i,
            "when": _BASE + dt.timedelta(seconds=i),
            "body": f"{i:08d} " * (LARGE_DOCUMENT_BYTES // 9),
        }
        for i in range(start, start + count)
    ]


def load(
    collection: Collection, count: int, make: Callable[[int, int], list[dict]], batch: int = INSERT_BATCH
) -> float:
    """Insert ``count`` documents made by ``make(start, count)``, ``batch`` at a time; returns seconds.
    Two inserts in flight keep mongod busy while the next batch is built."""
    started = time.monotonic()

    def insert(start: int) -> None:
        collection.insert_many(make(start, min(batch, count - start)), ordered=False)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(insert, start) for start in range(0, count, batch)]:
            future.result()
    return time.monotonic() - started


def change_backlog(collection: Collection, events: int) -> int:
    """About ``events`` change events on ``collection``: 50% inserts, 30% updates, 20% deletes.

    Returns the number of events written. Each update changes one document (one event each), so
    with ``updateLookup`` the stream reads the whole document back for every one of them.
    """
    inserts = events // 2
    load(collection, inserts, small_documents)
    ids = [document["_id"] for document in collection.find({}, {"_id": 1})]
    updates = min(events * 3 // 10, len(ids))
    deletes = min(events - inserts - updates, len(ids))
    ops: list[UpdateOne | DeleteOne] = [
        UpdateOne({"_id": ids[i % len(ids)]}, {"$inc": {"n": 1}, "$set": {"tags.0": f"u{i}"}})
        for i in range(updates)
    ]
    ops += [DeleteOne({"_id": document_id}) for document_id in ids[len(ids) - deletes :]]
    for start in range(0, len(ops), INSERT_BATCH):
        collection.bulk_write(ops[start : start + INSERT_BATCH], ordered=True)
    return inserts + updates + deletes
