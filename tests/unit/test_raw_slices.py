"""``raw_slices``: a slice holds about SLICE_ROWS rows, and about SLICE_BYTES whatever its rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.raw_slices import SLICE_BYTES, SLICE_ROWS, RawFile, RawPiece, raw_slices


def test_small_files_of_large_documents_are_grouped_up_to_the_byte_bound(tmp_path: Path) -> None:
    # four pull batches of 100 rows, each 0.6 times the bound: rows alone would put them in one slice
    files = [RawFile(f"raw/{seq}.parquet", "h", seq, seq, 100, int(0.6 * SLICE_BYTES)) for seq in range(4)]
    slices = raw_slices(LakeLocation(str(tmp_path)), files, parallelism=2)
    assert slices == [
        (RawPiece("raw/0.parquet", None), RawPiece("raw/1.parquet", None)),
        (RawPiece("raw/2.parquet", None), RawPiece("raw/3.parquet", None)),
    ]


def test_a_large_file_of_large_documents_is_split_at_its_row_groups(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"v": list(range(40))}), tmp_path / "raw" / "big.parquet", row_group_size=10)
    # 40 rows said to weigh 2.5 times SLICE_BYTES: two row groups (20 rows) reach the bound
    big = RawFile("raw/big.parquet", "h", 1, 1, 40, int(2.5 * SLICE_BYTES))
    slices = raw_slices(LakeLocation(str(tmp_path)), [big], parallelism=1)
    assert slices == [(RawPiece("raw/big.parquet", (0, 1)),), (RawPiece("raw/big.parquet", (2, 3)),)]


def test_small_documents_are_sliced_by_rows(tmp_path: Path) -> None:
    half = SLICE_ROWS // 2
    files = [RawFile(f"raw/{seq}.parquet", "h", seq, seq, half, SLICE_BYTES // 8) for seq in range(4)]
    slices = raw_slices(LakeLocation(str(tmp_path)), files, parallelism=1)
    assert [len(one) for one in slices] == [2, 2]


def test_a_snapshots_chunk_files_are_sliced_in_the_order_of_their_first_key(tmp_path: Path) -> None:
    # one batch's files, their names (uuids) in another order than their keys: each slice takes
    # neighbouring key ranges, so the first build's state files do not overlap
    half = SLICE_ROWS // 2
    firsts = ['{"id":"c"}', '{"id":"a"}', '{"id":"d"}', '{"id":"b"}']
    files = [
        RawFile(f"raw/{n}.parquet", "h", 7, 7, half, SLICE_BYTES // 8, key) for n, key in enumerate(firsts)
    ]
    slices = raw_slices(LakeLocation(str(tmp_path)), files, parallelism=1)
    assert slices == [
        (RawPiece("raw/1.parquet", None), RawPiece("raw/3.parquet", None)),
        (RawPiece("raw/0.parquet", None), RawPiece("raw/2.parquet", None)),
    ]
