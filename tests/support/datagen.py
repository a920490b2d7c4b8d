"""Rich sample documents and a reproducible random mix of writes, recording the events they must produce."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field

from bson import Binary, Decimal128, Int64, ObjectId

from mongo_cdc import extjson

COLLECTIONS = ("customers", "orders", "products")
# orders.mixed holds an int in some documents and a string in others (a schemaless collection)
FALLBACK_FIELDS = {"customers": frozenset(), "orders": frozenset({"mixed"}), "products": frozenset()}
BASE_DAY = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _day(rng: random.Random) -> dt.datetime:
    return BASE_DAY + dt.timedelta(milliseconds=rng.randint(0, 10**10))


def customer(rng: random.Random, i: int) -> dict:
    return {
        "_id": ObjectId(),
        "name": f"customer {i}",
        "age": rng.randint(18, 90),
        "balance": Int64(rng.randint(-(2**40), 2**40)),
        "score": rng.random() * 100,
        "vip": rng.random() < 0.2,
        "joined": _day(rng),
        "credit": Decimal128(f"{rng.randint(0, 10**6)}.{rng.randint(0, 99):02d}"),
        "avatar": Binary(rng.randbytes(8), 0),
        "nickname": None if i % 3 else f"nick{i}",
        "address": {
            "street": f"{i} Main St",
            "geo": {"lat": rng.uniform(-90, 90), "lng": rng.uniform(-180, 180)},
        },
        "tags": [f"t{rng.randint(0, 9)}" for _ in range(rng.randint(0, 3))],
        "history": [{"at": _day(rng), "amount": Decimal128(str(rng.randint(1, 500)))} for _ in range(2)],
    }


def order(rng: random.Random, i: int) -> dict:
    return {
        "_id": i,
        "customer": ObjectId(),
        "lines": [
            {"sku": f"sku-{rng.randint(0, 99)}", "qty": rng.randint(1, 5)} for _ in range(rng.randint(1, 3))
        ],
        "total": Decimal128(f"{rng.randint(1, 9999)}.{rng.randint(0, 99):02d}"),
        "placed": _day(rng),
        "status": rng.choice(["new", "paid", "shipped"]),
        "mixed": i if i % 2 else f"text {i}",
    }


def product(rng: random.Random, i: int) -> dict:
    return {
        "_id": f"sku-{i}",
        "price": round(rng.uniform(1, 100), 2),
        "stock": Int64(rng.randint(0, 10**12)),
        "dims": {"w": rng.randint(1, 50), "h": rng.randint(1, 50)},
        "blob": Binary(rng.randbytes(4), 0),
        "discontinued": None,
        "ratings": [rng.randint(1, 5) for _ in range(rng.randint(0, 4))],
    }


MAKERS = {"customers": customer, "orders": order, "products": product}


def load(db, counts: dict[str, int], seed: int = 7) -> None:
    rng = random.Random(seed)
    for collection, count in counts.items():
        db[collection].insert_many([MAKERS[collection](rng, i) for i in range(count)])


@dataclass
class WriteLog:
    """The events a sequence of writes must produce: (collection, document id EJSON, op)."""

    events: list[tuple[str, str, str]] = field(default_factory=list)

    def record(self, collection: str, document_id, op: str) -> None:
        self.events.append((collection, extjson.encode_str(document_id), op))

    def of(self, collection: str) -> list[tuple[str, str]]:
        return [(key, op) for coll, key, op in self.events if coll == collection]


def random_writes(db, count: int, seed: int = 11, start_index: int = 100_000) -> WriteLog:
    """``count`` single-document writes (insert, $set, $unset, $inc, $push, replace, delete)."""
    rng = random.Random(seed)
    live = {c: [d["_id"] for d in db[c].find({}, {"_id": 1})] for c in COLLECTIONS}
    log = WriteLog()
    for n in range(count):
        collection = rng.choice(COLLECTIONS)
        kind = rng.choice(["insert", "set", "unset", "inc", "push", "replace", "delete"])
        if kind == "insert" or not live[collection]:
            document = MAKERS[collection](rng, start_index + n)
            db[collection].insert_one(document)
            live[collection].append(document["_id"])
            log.record(collection, document["_id"], "c")
            continue
        target = rng.choice(live[collection])
        if kind == "delete":
            db[collection].delete_one({"_id": target})
            live[collection].remove(target)
            log.record(collection, target, "d")
            continue
        update = {
            "set": {"$set": {"note": f"note {n}", "updated": _day(rng)}},
            "unset": {"$unset": {"note": "", "nickname": "", "status": "", "discontinued": ""}},
            "inc": {"$inc": {"counter": 1}},
            "push": {"$push": {"events": {"n": n, "at": _day(rng)}}},
        }.get(kind)
        if update is not None:
            result = db[collection].update_one({"_id": target}, update)
            if result.modified_count == 0:  # e.g. $unset of fields already absent: no oplog entry
                continue
        else:
            replacement = MAKERS[collection](rng, start_index + n)
            replacement.pop("_id")
            db[collection].replace_one({"_id": target}, replacement)
        log.record(collection, target, "u")
    return log
