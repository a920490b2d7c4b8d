"""One table's rows split between the fast path (``transform.bson_columns``) and the lossless path
(``column_survey.FieldValues`` of the documents decoded), given to ``TableLayout`` as its documents: the
survey, the record batch and ``__doc`` are those of the lossless path for every row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from mongo_cdc.bson_elements import NULL
from mongo_cdc.transform import column_survey, column_types
from mongo_cdc.transform.bson_columns import MISSING, FastDocuments
from mongo_cdc.transform.bson_json import document_texts


class SplitValues:
    """One table's rows' documents, split between the fast path (``FastDocuments``) and the lossless
    path (``column_survey.FieldValues``): what ``TableLayout`` takes for its survey and its record batch,
    which are those of the same documents decoded (``column_survey.FieldValues`` of them all)."""

    def __init__(
        self,
        stored: column_types.StructFields,
        fast: FastDocuments,
        fast_rows: np.ndarray,
        slow: column_survey.FieldValues,
        slow_rows: np.ndarray,
        documents: Sequence[Any],
    ) -> None:
        self.stored = stored
        self.documents = documents
        self.fast, self.slow = fast, slow
        self.fast_rows, self.slow_rows = fast_rows, slow_rows
        # each row's position among the fast rows' values followed by the slow rows'
        order = np.argsort(np.concatenate([fast_rows, slow_rows]), kind="stable")
        self._positions = pa.array(order)
        self._in_order = bool((order == np.arange(len(order))).all())  # no row to move (all fast, say)
        self._arrays: dict[tuple[str, column_types.ColumnType, pa.DataType], pa.Array] = {}

    def __len__(self) -> int:
        return len(self._positions)

    @property
    def names(self) -> set[str]:
        return set(self.fast.census) | self.slow.names

    def typed(self, name: str) -> bool:
        in_fast = (
            column_types.without_nulls(self.fast.census.get(name, column_types.NULL)) != column_types.NULL
        )
        return in_fast or (name in self.slow.names and self.slow.typed(name))

    def survey(self, stored: column_types.StructFields) -> column_survey.BatchTypes:
        if stored != self.stored:
            raise ValueError("these documents were split against other stored fields")
        return self.fast.survey.merge(self.slow.survey(stored))

    def arrow(self, name: str, column: column_types.ColumnType, arrow: pa.DataType) -> pa.Array:
        key = (name, column, arrow)
        if key not in self._arrays:
            self._arrays[key] = self._rows(
                self.fast.array(name, column, arrow), self.slow.arrow(name, column, arrow)
            )
        return self._arrays[key]

    def split(
        self, name: str, column: column_types.ColumnType, arrow: pa.DataType
    ) -> tuple[pa.Array, pa.Array]:
        typed, texts = self.slow.split(name, column, arrow)
        fast = self.fast.array(name, column, arrow)  # they fit: no text
        return self._rows(fast, typed), self._rows(pa.nulls(len(fast), pa.string()), texts)

    def ejson(self, render: Callable[[int], str | None]) -> pa.Array:
        """Each row's document as Extended JSON text: the fast rows' from their bytes
        (``bson_json.document_texts``), the others' ``render(row)``."""
        texts = document_texts(self.fast)
        slow = pa.array([render(row) for row in self.slow_rows.tolist()], pa.string())
        return self._rows(texts, slow)

    def _rows(self, fast: pa.Array, slow: pa.Array) -> pa.Array:
        if self._in_order:
            return fast if not len(slow) else slow if not len(fast) else pa.concat_arrays([fast, slow])
        return pa.concat_arrays([fast, slow]).take(self._positions)


def split_documents(
    stored: column_types.StructFields,
    raw: pa.BinaryArray | pa.ChunkedArray,
    documents: Sequence[Any],
    read: Callable[[Any], dict],
) -> SplitValues:
    """The rows' documents split for ``stored`` (a table's ``TableLayout.stored_fields``): ``raw``
    holds each row's BSON (null: the row takes the lossless path), ``documents`` the same, whose
    values ``read`` gives (only the lossless rows' are read; None reads as ``{}``). A fast document
    whose field's type would merge with the lossless documents' into a type that does not hold it as it is (a
    ``fallback``) goes to the lossless side, until every fast document fits."""
    raw = raw.combine_chunks() if isinstance(raw, pa.ChunkedArray) else raw
    raw = raw.cast(pa.large_binary()) if pa.types.is_binary(raw.type) else raw
    _, offsets_buffer, data_buffer = raw.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64)[raw.offset : raw.offset + len(raw) + 1]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    candidates = np.flatnonzero(raw.is_valid().to_numpy(zero_copy_only=False))
    stored_types = dict(stored)
    while True:
        fast = FastDocuments(data, offsets[candidates], stored)
        fast_rows = candidates[fast.indices]
        lossless = np.ones(len(raw), bool)
        lossless[fast_rows] = False
        slow_rows = np.flatnonzero(lossless)
        slow = column_survey.FieldValues([read(documents[row]) or {} for row in slow_rows.tolist()])
        merged = fast.survey.merge(slow.survey(stored))
        added = dict(merged.additions[1]) if merged.additions != column_types.NULL else {}
        unfit = np.zeros(len(raw), bool)
        for name, column in fast.census.items():
            final = column_types.merge_types(
                stored_types.get(name, column_types.NULL), added.get(name, column_types.NULL)
            )
            if not column_types.fits_type(final, column):
                field = fast.top[name]
                unfit[candidates[field.root[(field.kind != MISSING) & (field.kind != NULL)]]] = True
        if not unfit.any():
            return SplitValues(stored, fast, fast_rows, slow, slow_rows, documents)
        candidates = candidates[~unfit[candidates]]
