"""A verification's bulk parts (mongo_cdc.verify.digest, key_order.RangeFinder.indexes): the same
answers as one document at a time, whatever the batching, order or Arrow slicing."""

from __future__ import annotations

import bson
import numpy as np
import pyarrow as pa
from bson import Int64, MaxKey, MinKey, ObjectId

from mongo_cdc.capture.chunking import ID_INDEX
from mongo_cdc.lake.snapshot_log import Chunk
from mongo_cdc.transform.keys import document_key
from mongo_cdc.verify.digest import Digests, document_hashes, id_cells
from mongo_cdc.verify.key_order import RangeFinder

DOCUMENTS = [
    bson.encode({"_id": n, "name": f"user {n}", **({"bio": "x" * (n * 7)} if n % 10 == 0 else {})})
    for n in range(200)
]  # sizes from 30 to about 1,400 bytes: both the bulk path and the one-by-one long documents


def test_hashes_tell_every_byte_apart_and_ignore_how_the_array_is_cut():
    hashes = document_hashes(pa.array(DOCUMENTS, pa.binary()))
    assert hashes.shape == (200, 2) and len({tuple(h) for h in hashes.tolist()}) == 200
    sliced = pa.array([b"junk", *DOCUMENTS], pa.binary()).slice(1)
    assert (document_hashes(sliced) == hashes).all()
    assert (document_hashes(pa.array(DOCUMENTS[50:60], pa.binary())) == hashes[50:60]).all()
    many = pa.array(DOCUMENTS * 100, pa.binary()).slice(30)  # hashed in blocks, from an offset
    assert (document_hashes(many) == np.tile(hashes, (100, 1))[30:]).all()
    for document in (DOCUMENTS[3], DOCUMENTS[100]):  # short and long
        for position in (0, len(document) // 2, len(document) - 2):
            changed = bytearray(document)
            changed[position] ^= 0x01
            assert tuple(document_hashes(pa.array([bytes(changed)]))[0]) != tuple(
                document_hashes(pa.array([document]))[0]
            )
    assert document_hashes(pa.array([], pa.binary())).shape == (0, 2)


def test_range_digests_are_order_independent_and_name_the_ranges_that_differ():
    hashes = document_hashes(pa.array(DOCUMENTS, pa.binary()))
    ranges = np.arange(200) % 4
    whole = Digests(4)
    whole.add(ranges, hashes)
    shuffled = Digests(4)
    order = np.random.default_rng(7).permutation(200)
    for part in np.array_split(order, 5):
        shuffled.add(ranges[part], hashes[part])
    one_by_one = Digests(4)
    for index in range(4):
        one_by_one.add(index, hashes[ranges == index])
    assert not whole.differing(shuffled) and not whole.differing(one_by_one)
    swapped = hashes.copy()
    swapped[[5, 9]] = swapped[[9, 5]]  # two documents of ranges 1 and 1: same digest
    swapped[[2, 3]] = swapped[[3, 2]]  # ranges 2 and 3 trade a document
    other = Digests(4)
    other.add(ranges, swapped)
    assert whole.differing(other) == {2, 3}


def _chunks(key, bounds):
    def encoded(bound):
        return bson.encode(bound) if bound else None

    return [
        Chunk("db.c", n, len(bounds), key, encoded(low), encoded(high))
        for n, (low, high) in enumerate(bounds)
    ]


def test_rows_are_placed_in_bulk_as_one_by_one():
    ids = sorted(ObjectId() for _ in range(300))
    cuts = [{"_id": ids[40]}, {"_id": Int64(5)}, {"_id": ids[200]}]  # a number sorts before ObjectIds
    bounds = [(None, cuts[1]), (cuts[1], cuts[0]), (cuts[0], cuts[2]), (cuts[2], None)]
    finder = RangeFinder(_chunks(ID_INDEX, bounds))
    keys = pa.array([document_key(value) for value in ids])
    documents = pa.array([bson.encode({"_id": value}) for value in ids], pa.binary())
    placed = finder.indexes(keys, documents)
    assert placed.tolist() == [finder.index(key) for key in keys.to_pylist()]
    assert np.bincount(placed).tolist() == [0, 40, 160, 100]
    assert finder.indexes(keys.slice(7), documents.slice(7)).tolist() == placed[7:].tolist()  # cut in place
    mixed = pa.array([document_key(MinKey()), document_key(5), document_key(MaxKey())])
    assert finder.indexes(mixed, pa.array([b""] * 3)).tolist() == [0, 1, 3]


def test_a_shards_ranges_leave_other_shards_rows_out():
    key = (("k", 1),)
    finder = RangeFinder(_chunks(key, [({"k": MinKey()}, {"k": 10}), ({"k": 20}, {"k": MaxKey()})]))
    rows = [{"_id": 1, "k": 3}, {"_id": 2, "k": 15}, {"_id": 3, "k": 25}, {"_id": 4}]  # no k: null
    keys = pa.array([document_key(row["_id"]) for row in rows])
    documents = pa.array([bson.encode(row) for row in rows], pa.binary())
    assert finder.indexes(keys, documents).tolist() == [0, -1, 1, 0]


def test_a_documents_cell_follows_its_id_alone_and_cells_spread():
    ids = [ObjectId(), 1, "s", {"a": 1}, MinKey()]
    one = pa.array([bson.encode({"_id": value, "v": 1}) for value in ids], pa.binary())
    other = pa.array([bson.encode({"_id": value, "v": "changed", "w": [1]}) for value in ids], pa.binary())
    assert (id_cells(one, 4096) == id_cells(other, 4096)).all()  # any _id type, one by one
    # alone, each _id element is of one width (hashed as a matrix); together, of several
    assert [id_cells(one.slice(n, 1), 4096)[0] for n in range(5)] == id_cells(one, 4096).tolist()
    object_ids = pa.array([bson.encode({"_id": ObjectId(), "v": n}) for n in range(2000)], pa.binary())
    again = pa.array(
        [bson.encode({"_id": bson.decode(d)["_id"]}) for d in object_ids.to_pylist()], pa.binary()
    )
    assert (id_cells(object_ids, 64) == id_cells(again, 64)).all()  # in bulk
    assert len(set(id_cells(object_ids, 64).tolist())) == 64
