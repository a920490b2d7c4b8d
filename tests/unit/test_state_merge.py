"""``transform.state_merge``: the state's rule run by delta-rs' MERGE (``merge_into``, on a real Delta
table), by pyarrow over a small table (``merged_rows``), file by file (``merge_files``) and by
ranges of keys as Spark's tasks run it (``merge_ranges.merge_ranges`` planned from the files' key
bounds, each range's ``merge_range`` here in turn; tests/e2e/test_executor_merge.py runs the same
cases, tests/support/merge_cases.py, on Spark) gives the same rows, for stated cases and for random
ones (ties of position, deletions, copies' and drops' positions, files of unknown key ranges,
overlapping files); a small table's ``rewrite`` writes those rows of its files as one new file."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bson import Int64, ObjectId
from deltalake import DeltaTable, write_deltalake
from merge_cases import (
    SCHEMA,
    SOURCE_SCHEMA,
    by_merge_into,
    by_ranges,
    random_case,
    rows,
    stated_case,
    stored_in_files,
)

from mongo_cdc.id_ranges import IdRange
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform import state_merge, whole_collection
from mongo_cdc.transform.column_survey import NO_CHANGES
from mongo_cdc.transform.data_files import DataFile, write_data_file
from mongo_cdc.transform.document_state import DocumentVersion, reconcile_with_snapshots
from mongo_cdc.transform.keys import document_key
from mongo_cdc.transform.merge_ranges import (
    MergeRange,
    key_groups,
    merge_ranges,
    source_key_bounds,
)
from mongo_cdc.transform.slice_tasks import write_state_file
from mongo_cdc.transform.state_merge import (
    Gone,
    MergedFiles,
    Rewrite,
    merge_files,
    merged_rows,
    rewrite,
)
from mongo_cdc.transform.stored_rows import KeyedFile
from mongo_cdc.transform.table_layout import TableLayout
from mongo_cdc.transform.task_contract import Output, StateOutput, StateSpec
from mongo_cdc.transform.whole_collection import rewritten_whole


def both_engines(tmp_path, stored: pa.Table, source: pa.Table, gone: list[Gone]) -> tuple[list, list]:
    """The table's rows after the MERGE, and after ``merged_rows``, each sorted by key."""
    merged = by_merge_into(tmp_path, stored, source, gone)
    return merged, merged_rows(stored, source, gone).sort_by("__key").to_pylist()


def file_by_file(tmp_path, stored: pa.Table, source: pa.Table, gone: list[Gone], files: int = 3) -> list:
    """The table's rows after ``merge_files`` (``stored`` in ``files`` files of disjoint key ranges,
    and one file whose statistics are unknown), sorted by key: the files it kept and those it wrote."""
    location = LakeLocation(str(tmp_path))
    ordered = stored.sort_by("__key")
    size = -(-ordered.num_rows // files) or 1
    written = [
        write_data_file(location, "state", ordered.slice(start, size))
        for start in range(0, ordered.num_rows, size)
    ]
    bounds = [
        (min(part), max(part))
        for part in (pq.read_table(tmp_path / "state" / f.path).column("__key").to_pylist() for f in written)
    ]
    stored_files = [
        KeyedFile(f"state/{file.path}", *(bound if index else (None, None)))
        for index, (file, bound) in enumerate(zip(written, bounds, strict=True))
    ]
    merged = merge_files(location, "state", stored_files, SCHEMA, source, gone)
    kept = [file for file in stored_files if file.path not in merged.removed]
    parts = [pq.read_table(tmp_path / file.path) for file in kept]
    parts += [pq.read_table(tmp_path / "state" / file.path) for file in merged.written]
    after = pa.concat_tables([SCHEMA.empty_table(), *(part.cast(SCHEMA) for part in parts)])
    assert merged.rows_added - merged.rows_removed == after.num_rows - stored.num_rows
    return after.sort_by("__key").to_pylist()


def test_newer_versions_win_deletions_delete_and_copies_remove_what_they_did_not_find(tmp_path):
    stored, source, gone = stated_case()
    merged, in_memory = both_engines(tmp_path / "t", stored, source, gone)
    assert merged == in_memory == file_by_file(tmp_path / "f", stored, source, gone)
    for files, tasks in [(1, 1), (3, 2), (8, 3)]:
        ranged, _, _ = by_ranges(tmp_path / f"r{files}", stored, source, gone, files, tasks)
        assert ranged == in_memory
    assert {row["__key"]: row["v"] for row in in_memory} == {
        "updated": 10,
        "older update": 2,
        "older deletion": 4,
        "after the copy": 6,
        "of another replica set": 7,
        "named, not newer": 8,
        "inserted": 90,
    }


@pytest.mark.parametrize("seed", range(12))
def test_both_engines_give_the_same_rows_for_random_runs(tmp_path, seed):
    stored, source, gone, draw = random_case(seed)
    merged, in_memory = both_engines(tmp_path / "t", stored, source, gone)
    assert merged == in_memory == file_by_file(tmp_path / "f", stored, source, gone, draw.randint(1, 4))
    ranged, _, _ = by_ranges(
        tmp_path / "r",
        stored,
        source,
        gone,
        draw.randint(1, 6),
        draw.randint(1, 4),
        overlapping=seed % 3 == 0,
    )
    assert ranged == in_memory


def test_a_rewrite_writes_the_rows_after_the_run_of_every_file_of_the_table_as_one_new_file(tmp_path):
    stored = rows(
        SCHEMA, [("kept", 10, "b", "rs0", 1), ("updated", 10, "b", "rs0", 2), ("deleted", 10, "b", "rs0", 3)]
    )
    table_path = tmp_path / "state"
    write_deltalake(table_path, stored.slice(0, 2))
    write_deltalake(table_path, stored.slice(2), mode="append")  # two files, both read
    table = DeltaTable(table_path)
    files = tuple(table.get_add_actions(flatten=True).column("path").to_pylist())
    source = rows(
        SOURCE_SCHEMA,
        [
            ("updated", 11, "a", "rs0", 20, False),
            ("deleted", 11, "b", "rs0", None, True),
            ("new", 12, "a", "rs0", 4, False),
        ],
    )
    written = rewrite(LakeLocation(str(tmp_path)), Rewrite("state", SCHEMA, files), source, [])
    new_rows = pq.read_table(table_path / written.path).to_pylist()
    assert len(files) == 2 and written.rows == 3
    assert new_rows == merged_rows(stored, source, []).sort_by("__key").to_pylist()
    assert {row["__key"]: row["v"] for row in new_rows} == {"kept": 1, "updated": 20, "new": 4}
    assert DeltaTable(table_path).version() == table.version()  # written, not committed


def shared_run(tmp_path) -> tuple[LakeLocation, StateSpec, Rewrite, list[StateOutput], pa.Table, DataFile]:
    """A two-row state table, a shared task's state rows held in memory (an update) and one staged
    file of rows (an insert), as ``whole_collection.rewritten_whole`` gets them."""
    location = LakeLocation(str(tmp_path))
    write_deltalake(
        tmp_path / "state", rows(SCHEMA, [("kept", 10, "b", "rs0", 1), ("updated", 10, "b", "rs0", 2)])
    )
    files = tuple(DeltaTable(tmp_path / "state").get_add_actions(flatten=True).column("path").to_pylist())
    spec = StateSpec(TableLayout(()), False, "staging", with_flag=True, held=True)
    held = rows(SOURCE_SCHEMA, [("updated", 11, "a", "rs0", 20, False)])
    inserted = rows(SOURCE_SCHEMA, [("new", 12, "a", "rs0", 4, False)])
    staged_file = write_state_file(location, "staging", inserted, spec.layout)
    outputs = [
        StateOutput(Output((), NO_CHANGES, held), None),
        StateOutput(Output((staged_file,), NO_CHANGES), None),
    ]
    return location, spec, Rewrite("state", SCHEMA, files), outputs, held, staged_file


def test_a_shared_task_writes_its_held_and_staged_rows_whole_and_hands_the_driver_no_rows(tmp_path):
    location, spec, target, outputs, _, staged_file = shared_run(tmp_path)

    written, handed = rewritten_whole(location, spec, target, outputs)

    assert written is not None
    new_rows = pq.read_table(tmp_path / "state" / written.path).to_pylist()
    assert {row["__key"]: row["v"] for row in new_rows} == {"kept": 1, "updated": 20, "new": 4}
    assert [state.output for state in handed] == [Output((), NO_CHANGES), Output((), NO_CHANGES)]
    assert not (tmp_path / "staging" / staged_file.path).exists()


def test_rows_too_many_to_write_whole_are_all_staged_for_the_drivers_merge(tmp_path, monkeypatch):
    location, spec, target, outputs, held, staged_file = shared_run(tmp_path)
    monkeypatch.setattr(whole_collection, "REWRITE_MAX_ROWS", 1)

    written, handed = rewritten_whole(location, spec, target, outputs)

    assert written is None
    assert all(state.output.rows is None for state in handed)
    (held_file,) = handed[0].output.files
    assert pq.read_table(tmp_path / "staging" / held_file.path).to_pylist() == held.to_pylist()
    assert handed[1] == outputs[1] and (tmp_path / "staging" / staged_file.path).exists()


def test_a_merge_by_ranges_rewrites_only_the_files_whose_range_holds_a_source_key(tmp_path):
    stored = rows(SCHEMA, [(f"k{index:02}", 10, "b", "rs0", index) for index in range(40)])
    source = rows(
        SOURCE_SCHEMA,
        [
            ("k05", 11, "a", "rs0", 500, False),
            ("k051", 11, "a", "rs0", 510, False),  # new, between two stored keys of one file
            ("k33", 11, "a", "rs0", None, True),
        ],
    )
    merged, in_memory = both_engines(tmp_path / "t", stored, source, [])
    ranged, written, stored_files = by_ranges(tmp_path / "r", stored, source, [], files=8, tasks=4)

    assert ranged == merged == in_memory
    holding = {
        file.path
        for file in stored_files
        if any(file.min_key <= key <= file.max_key for key in ("k05", "k33"))
    }
    assert len(stored_files) == 8 and len(holding) == 2
    assert set(written.removed) == holding
    assert (
        written.rows_removed == 10 and written.rows_added == 10
    )  # k05's file again with k051, k33's without


def test_ranges_are_cut_between_groups_of_overlapping_files_and_reach_only_what_the_source_may_hold():
    def stored_file(name: str, low: str | None, high: str | None) -> KeyedFile:
        return KeyedFile(f"state/{name}", low, high)

    def staged(low: str, high: str) -> DataFile:
        stats = json.dumps({"numRecords": 1, "minValues": {"__key": low}, "maxValues": {"__key": high}})
        return DataFile(f"{low}-{high}.parquet", 1, 1, (), stats, 0)

    a, b, c, d = (stored_file("a", "a", "c"), stored_file("b", "b", "e"), stored_file("c", "f", "g"),
                  stored_file("d", "m", "p"))  # fmt: skip
    assert [[file.path for file in group] for group in key_groups([d, c, b, a])] == [
        ["state/a", "state/b"],
        ["state/c"],
        ["state/d"],
    ]
    # a source file between two groups belongs to the lower one's range: its keys are new there
    plan = merge_ranges([a, b, c, d], [staged("h", "i")], [], 4)
    assert [(part.low, part.high, [f.path for f in part.stored]) for part in plan] == [
        ("f", "m", ["state/c"])
    ]
    # one task: the groups reached, from the first one's range to the last one's; c's is not reached
    plan = merge_ranges([a, b, c, d], [staged("a", "a"), staged("z", "z")], [], 1)
    assert [(part.low, part.high, [f.path for f in part.stored], len(part.source)) for part in plan] == [
        (None, None, ["state/a", "state/b", "state/d"], 2)
    ]
    # a copy's or a drop's position may delete any stored row: every file is some range's
    plan = merge_ranges([a, b, c, d], [], [Gone("rs0", 1, "")], 8)
    assert sorted(file.path for part in plan for file in part.stored) == [
        "state/a",
        "state/b",
        "state/c",
        "state/d",
    ]
    assert [(part.low, part.high) for part in plan] == [(None, "f"), ("f", "m"), ("m", None)]
    # a file of unknown bounds may hold any key: one range, every file
    plan = merge_ranges([a, stored_file("u", None, None), d], [staged("n", "n")], [], 4)
    assert [(part.low, part.high, len(part.stored)) for part in plan] == [(None, None, 3)]
    # no stored file: the source's keys are all new, one range
    assert merge_ranges([], [staged("n", "n")], [], 4) == [MergeRange(None, None, (), (staged("n", "n"),))]


def test_files_of_objectids_made_one_after_another_are_ranges_of_their_own(tmp_path):
    """A bulk insert's ObjectIds count up by one: each file's key bounds must still tell it from the
    next file, or the whole table is one range and one task MERGEs it, whatever the executors."""
    first = ObjectId("6b15aaa1eeec96ac0daed1c0")
    keys = [document_key(ObjectId(f"{int(str(first), 16) + step:024x}")) for step in range(12)]
    files = stored_in_files(
        LakeLocation(str(tmp_path)), rows(SCHEMA, [(key, 10, "b", "rs0", 1) for key in keys]), 4
    )
    assert [(file.min_key, file.max_key) for file in files] == [
        (keys[start], keys[start + 2]) for start in range(0, 12, 3)
    ]
    assert len(key_groups(files)) == 4


def written_bounds(merged: MergedFiles) -> list[tuple[str | None, str | None]]:
    return [source_key_bounds(file) for file in merged.written]


def test_a_merge_keeps_the_files_key_ranges_disjoint(tmp_path):
    """New keys inside a file's range join that file, the others go to files between the stored ones:
    a later run touching one range of keys then rewrites only that range's files (issue 51)."""
    location = LakeLocation(str(tmp_path))
    stored = rows(SCHEMA, [(key, 10, "b", "rs0", 1) for key in ["b", "c", "d", "f", "g", "h", "k", "l", "m"]])
    files = stored_in_files(location, stored, 3)  # [b, d], [f, h], [k, m]
    source = rows(
        SOURCE_SCHEMA,
        [
            ("c5", 11, "a", "rs0", 2, False),  # new, inside the first file's range
            ("g", 11, "a", "rs0", 3, False),  # an update in the second
            ("e", 11, "a", "rs0", 4, False),  # new, between the first two files
            ("i", 11, "a", "rs0", 5, False),  # new, between the second and the third
            ("z", 11, "a", "rs0", 6, False),  # new, past the last
        ],
    )
    merged = merge_files(location, "state", files, SCHEMA, source, [])
    assert sorted(merged.removed) == sorted(file.path for file in files[:2])  # the third is untouched
    kept = [(files[2].min_key, files[2].max_key)]
    ranges = sorted(written_bounds(merged) + kept)
    assert ranges == [("b", "d"), ("e", "e"), ("f", "h"), ("i", "i"), ("k", "m"), ("z", "z")]
    after = pa.concat_tables(
        [pq.read_table(tmp_path / "state" / file.path).cast(SCHEMA) for file in merged.written]
        + [pq.read_table(tmp_path / files[2].path).cast(SCHEMA)]
    )
    assert after.sort_by("__key").to_pylist() == merged_rows(stored, source, []).sort_by("__key").to_pylist()


def test_a_file_grown_by_new_keys_is_written_as_files_of_bounded_size(tmp_path, monkeypatch):
    monkeypatch.setattr(state_merge, "NEW_FILE_ROWS", 2)
    location = LakeLocation(str(tmp_path))
    files = stored_in_files(location, rows(SCHEMA, [(key, 10, "b", "rs0", 1) for key in "bdf"]), 1)
    source = rows(SOURCE_SCHEMA, [(key, 11, "a", "rs0", 2, False) for key in ["c", "e"]])
    merged = merge_files(location, "state", files, SCHEMA, source, [])
    # the file held 3 rows, more than the bound: its 5 rows are written as files of at most 3
    assert [file.rows for file in merged.written] == [3, 2]
    assert written_bounds(merged) == [("b", "d"), ("e", "f")]


def test_files_of_overlapping_ranges_keep_their_rows_and_new_keys_go_to_new_files(tmp_path):
    location = LakeLocation(str(tmp_path))
    stored = rows(SCHEMA, [(key, 10, "b", "rs0", 1) for key in "bcdefg"])
    files = stored_in_files(location, stored, 2, overlapping=True)
    source = rows(SOURCE_SCHEMA, [("cc", 11, "a", "rs0", 2, False)])
    merged = merge_files(location, "state", files, SCHEMA, source, [])
    assert merged.removed == () and [file.rows for file in merged.written] == [1]


def test_a_copy_of_an_id_range_removes_only_the_stored_documents_of_its_range(tmp_path):
    """A filtered re-snapshot of ``{"_id": {"$gte": 3, "$lt": 6}}`` that read 4 deletes 3 and 5
    (gone from MongoDB), never 1, 6, the string "4" (type bracketing) or another replica set's 5.5."""
    id_range = IdRange({"$gte": 3, "$lt": 6})
    key = document_key
    stored = rows(
        SCHEMA,
        [(key(n), 10, "b", "rs0", n) for n in (1, 3, 4, 5, 6)] + [(key("4"), 10, "b", "rs0", 40)],
    )
    # another shard's document in the range: that shard's copy did not run
    stored = pa.concat_tables([stored, rows(SCHEMA, [(key(Int64(5) + 0.5), 10, "b", "rs1", 51)])])
    source = rows(SOURCE_SCHEMA, [(key(4), 20, "", "rs0", 4, False)])
    gone = [Gone("rs0", 20, "", id_range.text)]
    merged, in_memory = both_engines(tmp_path / "t", stored, source, gone)
    assert merged == in_memory == file_by_file(tmp_path / "f", stored, source, gone)
    ranged, _, _ = by_ranges(tmp_path / "r", stored, source, gone, 3, 2)
    assert ranged == in_memory
    assert sorted(row["v"] for row in in_memory) == [1, 4, 6, 40, 51]
    # the fold of a document's events gives the same answer (``reconcile_with_snapshots``)
    manifest = SnapshotManifest("rs0", 7, 20, ("shop.items",), "", id_range.text)
    for value, deleted in [(3, True), (6, False), ("4", False)]:
        version = DocumentVersion(key(value), "", b"doc", 10, "b", "rs0")
        assert (reconcile_with_snapshots(version, [manifest]).document is None) is deleted
