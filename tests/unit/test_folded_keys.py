"""``folded_keys``: which documents a run folds apart, summed per slice and then per bucket of keys."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import bson
import pyarrow.parquet as pq
import pytest

from mongo_cdc import extjson, lake
from mongo_cdc.capture.collection_events import COLLECTION_KEY
from mongo_cdc.capture.raw_tables import rows_to_table
from mongo_cdc.lake.batch_log import BatchWindow
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform import keys
from mongo_cdc.transform.folded_keys import (
    KeyCount,
    KeyRange,
    folded_in_rows,
    folded_keys,
    key_bucket,
    slice_key_buckets,
)
from mongo_cdc.transform.raw_slices import RawPiece, read_slice
from mongo_cdc.transform.slice_tasks import none_folded_apart, plan_slice

SEQ = 1
BUCKET_OF_A = 418_577  # zlib.crc32(b'["s","a"]') % 1_000_003
WINDOW = BatchWindow({"rs0": (SEQ,)})


def event(
    number: int, document_id: object, op: str | None, *, after: bool = True, partial: bool = False
) -> dict:
    return {
        "key": extjson.document_key(document_id),
        "op": op,
        "after": bson.encode({"_id": document_id}) if after and op in ("c", "u", "r") else None,
        "updateDescription": {"updatedFields": bson.encode({"v": 1})} if partial else None,
        "source": {"rs": "rs0"},
        "cluster_time": lake.pack_cluster_time(1_700_000_000, number),
        "event_order": f"82{number:04x}",
    }


def slices_of(tmp_path: Path, *slices: list[dict]) -> list[tuple[RawPiece, ...]]:
    """Each list of events as one raw file, one slice each."""
    raw_slices = []
    for index, events in enumerate(slices):
        name = f"raw-{index}.parquet"
        pq.write_table(rows_to_table(events, SEQ), tmp_path / name)
        raw_slices.append((RawPiece(name, None),))
    return raw_slices


def folded_apart(tmp_path: Path, buckets: int, blocks_in_reverse: bool = False) -> dict[str, KeyCount]:
    """``folded_keys`` over the buckets of three slices: "a" has an event in two slices, "b" two in
    one, "d" is an update without after; the rest are no document folded apart."""
    location = LakeLocation(str(tmp_path))
    raw_slices = slices_of(
        tmp_path,
        # "a" has an event in two slices; "b" twice in one; "c" once
        [event(1, "a", "c"), event(2, "b", "c"), event(3, "b", "u"), event(4, "c", "c")],
        # "d" is an update without after; 5 (an int _id) a delete and its tombstone, which is no event
        [
            event(5, "a", "u"),
            event(6, "d", "u", after=False, partial=True),
            event(7, 5, "d"),
            event(8, 5, None),
        ],
        # a drop is no document's event; 6 is one document in any slice
        [event(9, "e", "c"), {**event(10, None, lake.DROP), "key": COLLECTION_KEY}, event(11, 6, "c")],
    )
    by_bucket = defaultdict(list)
    for index, raw_slice in enumerate(raw_slices):
        for bucket, block in slice_key_buckets(location, index, raw_slice, WINDOW, buckets):
            assert 0 <= bucket < buckets
            by_bucket[bucket].append(block)
    return dict(
        pair
        for blocks in by_bucket.values()
        for pair in folded_keys(reversed(blocks) if blocks_in_reverse else blocks)
    )


FOLDED_APART = {
    keys.document_key("a"): KeyCount(2, False, (0, 1)),
    keys.document_key("b"): KeyCount(2, False, (0,)),
    keys.document_key("d"): KeyCount(1, True, (1,)),
}


@pytest.mark.parametrize("buckets", [1, 3, 16])
def test_only_documents_with_several_events_or_an_update_without_after_are_folded_apart(
    tmp_path: Path, buckets: int
) -> None:
    assert folded_apart(tmp_path, buckets) == FOLDED_APART


def test_a_documents_slices_are_listed_in_order_whatever_order_its_counts_come_in(tmp_path: Path) -> None:
    # Arrow's threaded group-by lists a key's slices in whichever order its threads ran: under load
    # "a" came out as slices (1, 0) about once in a thousand
    assert folded_apart(tmp_path, 1, blocks_in_reverse=True) == FOLDED_APART


def test_a_key_falls_in_the_same_bucket_in_every_process() -> None:
    # a fixed function of the key's UTF-8 (zlib.crc32), where Python's own str hash changes with
    # each process's seed: executors must agree on it
    assert key_bucket('["s","a"]', 1_000_003) == BUCKET_OF_A


def test_a_run_in_one_slice_folds_apart_the_keys_it_repeats_and_its_updates_without_after(
    tmp_path: Path,
) -> None:
    location = LakeLocation(str(tmp_path))
    [one_slice, only_a_drop] = slices_of(
        tmp_path,
        [
            event(1, "a", "c"),
            event(2, "b", "c"),
            event(3, "b", "u"),
            event(4, "c", "u", after=False, partial=True),
            event(5, "d", "u", partial=True),  # its after is there: one event, folded by its slice
        ],
        [{**event(6, None, lake.DROP), "key": COLLECTION_KEY}],
    )
    rows = read_slice(location, one_slice, WINDOW.filter())
    assert folded_in_rows(rows) == {keys.document_key("b"), keys.document_key("c")}
    assert folded_in_rows(read_slice(location, only_a_drop, WINDOW.filter())) == frozenset()


def test_a_plan_finds_no_document_folded_apart_where_the_pieces_hold_disjoint_ranges_of_keys(
    tmp_path: Path,
) -> None:
    location = LakeLocation(str(tmp_path))
    # integer _ids by number (as text, the key of 10 sorts before the key of 9), the others as text
    first, second, overlapping, repeating, updating = slices_of(
        tmp_path,
        [event(1, 9, "r"), event(2, "a", "r"), event(3, 1, "r")],
        [
            event(4, 10, "r"),
            event(5, 11, "r"),
            event(6, "b", "r"),
            event(12, "d", "r"),
            {**event(7, None, lake.DROP), "key": COLLECTION_KEY},
        ],
        [event(8, "c", "r")],
        [event(9, "e", "c"), event(10, "e", "d")],
        [event(11, "f", "u")],
    )
    plans = [plan_slice(location, raw_slice, WINDOW) for raw_slice in (first, second, overlapping)]
    assert plans[0].key_ranges == (KeyRange(True, 1, 9), KeyRange(False, '["s","a"]', '["s","a"]'))
    assert plans[1].rows == 5 and len(plans[1].drops) == 1
    assert none_folded_apart(plans[:2])
    assert not none_folded_apart(plans)  # "c" is between "b" and "d"
    # a document twice in a piece, or an update (which may lack after): the buckets decide
    assert plan_slice(location, repeating, WINDOW).key_ranges is None
    assert not none_folded_apart([plan_slice(location, updating, WINDOW)])


def test_an_update_with_its_after_among_rows_that_are_no_event_is_not_folded_apart(tmp_path: Path) -> None:
    """The documents are read again only for a slice with updates: each update's own after, past a
    drop and a tombstone (rows that are no document's event) before it."""
    location = LakeLocation(str(tmp_path))
    [one_slice] = slices_of(
        tmp_path,
        [
            {**event(1, None, lake.DROP), "key": COLLECTION_KEY},
            event(2, 5, None),
            event(3, "f", "u", partial=True),
            event(4, "g", "u", after=False, partial=True),
            event(5, "h", "u", partial=True),
        ],
    )
    blocks = [block for _, block in slice_key_buckets(location, 0, one_slice, WINDOW, 1)]
    assert dict(folded_keys(blocks)) == {keys.document_key("g"): KeyCount(1, True, (0,))}
