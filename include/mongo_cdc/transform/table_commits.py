"""What the driver's commits to a collection's state and changes tables share.

The job's log (``log``, named ``cdc_transform``: the bench reads its lines by that name), the
lost commit race (``LostCommitRace``, ``creating``), the layouts read from a table and settled from
the tasks' needs (``stored_layout``, ``settled_layout``). Driver only: imports deltalake.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import reduce

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc.transform import column_survey, column_types
from mongo_cdc.transform.table_layout import TableLayout
from mongo_cdc.transform.task_contract import Output

log = logging.getLogger("cdc_transform")


class LostCommitRace(RuntimeError):
    """Another writer committed to one of a collection's tables after this run read it."""


def stored_layout(
    table: DeltaTable | None,
    metadata_columns: tuple[tuple[str, column_types.ColumnType], ...],
    sanitize_field_names: bool,
    reserved_names: tuple[str, ...] = (),
) -> TableLayout:
    """The layout a table was written with (its schema's type metadata), or a new table's."""
    if table is None:
        return TableLayout(metadata_columns, reserved_names, sanitize_field_names)
    schema = pa.schema(table.schema().to_arrow())
    return TableLayout.from_arrow(schema, metadata_columns, reserved_names, sanitize_field_names)


def settled_layout(stored: TableLayout, outputs: list[Output]) -> TableLayout:
    """The table's layout after this run: ``stored`` with what every task's rows needed."""
    return stored.evolved(
        reduce(lambda a, b: a.merge(b), (o.survey for o in outputs), column_survey.NO_CHANGES)
    )


@contextlib.contextmanager
def creating(uri: str, options: dict[str, str]) -> Iterator[None]:
    """Around the creation of a table the run found missing: LostCommitRace if another writer created
    it since."""
    try:
        yield
    except DeltaError as error:
        if isinstance(error, CommitFailedError) or table_if_exists(uri, options) is None:
            raise
        raise LostCommitRace(f"{uri} was created by another writer since this run read it") from error


def committed_version(table: DeltaTable | None) -> int:
    """The version of a table after this run's commits through ``table``, its object as the run read
    it (None: the run created the table, at version 0 since ``creating`` refuses one already there).
    delta-rs moves an object past a MERGE or ``write_deltalake``, not past ``create_write_transaction``,
    and its public ``update_incremental`` replays the new commits into the object's file list, as
    costly as opening the table again (~5 ms in a job of 300 collections): the latest version alone
    is a listing of the log. ``tests/support/model_support`` checks it against the tables."""
    if table is None:
        return 0
    return table._table.get_latest_version()


def version_of(table: DeltaTable | None) -> int | None:
    """A table's version as read, None for no table."""
    return None if table is None else table.version()
