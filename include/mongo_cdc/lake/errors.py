"""Damaged lakes: data files missing or truncated, and lakes still in the previous layout.

``naming_damaged_files`` turns whatever delta-rs, pyarrow or Spark raises on a damaged data file
(their messages differ and some name no file) into a ``LakeFileError`` naming the file and the
fix. It finds the file by comparing each live file of the table with the size the Delta log
recorded for it, so it does not depend on the wording of anybody's message.

``refuse_legacy_layout`` refuses a lake written by mongo-cdc before the Delta layout (plain
Parquet directories switched by symlinks under ``_versions/``), by those signs only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote

from pyarrow.fs import FileType

from mongo_cdc.lake.layout import table_names
from mongo_cdc.lake.storage import LakeLocation, TableVersion, file_actions, open_table

ZONES = ("raw", "changes", "state")


class LakeFileError(RuntimeError):
    """A data file a Delta table lists is missing or damaged; the message names it and the fix."""


class LegacyLakeError(RuntimeError):
    """The lake root holds tables of the previous (Parquet + symlinks) layout."""


@dataclass(frozen=True)
class DamagedFile:
    uri: str
    problem: str  # "missing" or "truncated: <actual> of <logged> bytes"


def damaged_files(
    table_uri: str, storage_options: Mapping[str, str] | None = None, version: TableVersion = None
) -> list[DamagedFile]:
    """The live files of a table version whose object is missing or not the size its log recorded."""
    actions = file_actions(open_table(table_uri, storage_options, version))
    base = table_uri.rstrip("/")
    fs, root = LakeLocation(base, storage_options or {}).filesystem()
    # the log holds paths relative to the table, percent-encoded like URIs
    relative = [unquote(path) for path in actions.column("path").to_pylist()]
    infos = fs.get_file_info([f"{root}/{path}" for path in relative])
    damaged = []
    for path, logged, info in zip(relative, actions.column("size_bytes").to_pylist(), infos, strict=True):
        if info.type == FileType.NotFound:
            damaged.append(DamagedFile(f"{base}/{path}", "missing"))
        elif info.size != logged:
            damaged.append(DamagedFile(f"{base}/{path}", f"truncated: {info.size} of {logged} bytes"))
    return damaged


def fix_for(table_uri: str, version: TableVersion = None) -> str:
    """What a user does about a damaged file of this table (by its zone, from the lake layout)."""
    zone, db, collection = table_names(table_uri)
    restore = "Restore the file from a backup or the bucket's object versioning"
    if version is not None:
        restore = (
            f"Version {version} may be older than lake.retention.hours, whose files vacuum deletes: "
            f"read a newer version. Otherwise, restore the file from a backup or object versioning"
        )
    if zone == "raw":
        return f"{restore}; raw history cannot be rebuilt (MongoDB's oplog no longer holds it)."
    if zone in ("changes", "state"):
        conf = json.dumps({"resnapshot": True, "collections": [f"{db}.{collection}"]})
        lost = " (the changes table keeps the new snapshot's reads; the lost file's events stay lost)"
        # verify heals the state: the file leaves the table's log, its documents come back as repairs
        heal = (
            ', or heal it from MongoDB: trigger the source\'s DAG with {"verify": true} (verify.on.drift '
            "repair or fail)"
        )
        return (
            f"{restore}{heal if zone == 'state' else ''}, or re-snapshot the collection: trigger the "
            f"source's DAG with {conf}{lost if zone == 'changes' else ''}."
        )
    return f"{restore}."


@contextmanager
def naming_damaged_files(
    table_uri: str, storage_options: Mapping[str, str] | None = None, version: TableVersion = None
) -> Iterator[None]:
    """Re-raise a read's failure as ``LakeFileError`` when the table has a missing or truncated file.

    Any other failure (a bad query, a network error on a healthy table) propagates unchanged.
    """
    try:
        yield
    except LakeFileError:
        raise
    except Exception as error:
        try:
            damaged = damaged_files(table_uri, storage_options, version)
        except Exception:  # the check itself failed (the log is gone, say): the read's error says more
            raise error from None
        if not damaged:
            raise
        raise LakeFileError(_damage_text(table_uri, damaged, version)) from error


def _damage_text(table_uri: str, damaged: list[DamagedFile], version: TableVersion = None) -> str:
    listed = "; ".join(f"{file.uri} ({file.problem})" for file in damaged)
    return f"Delta table {table_uri}: data file {listed}. {fix_for(table_uri, version)}"


def damage_in(
    table_uris: Iterable[str], storage_options: Mapping[str, str] | None = None
) -> LakeFileError | None:
    """The missing or truncated data files of the current versions of ``table_uris``, named with
    their fixes (None: every file is whole). For a failure whose error names no file (pyarrow's
    ``Parquet magic bytes not found in footer``): a table that does not exist is skipped."""
    found = []
    for uri in table_uris:
        try:
            damaged = damaged_files(uri, storage_options)
        except Exception:  # no table there, or no log to compare with: nothing to name
            continue
        if damaged:
            found.append(_damage_text(uri, damaged))
    return LakeFileError(" ".join(found)) if found else None


def refuse_legacy_layout(location: LakeLocation, prefix: str) -> None:
    """Raise ``LegacyLakeError`` if ``prefix``'s part of the lake was written by the previous layout.

    Its signs, and only those: a ``_versions/`` directory at the root, or (local lakes; S3 has no
    symlinks) a symlink where a zone, database or table directory of ``prefix`` is. Parquet files
    in a directory without a ``_delta_log`` are no sign: Delta writers (delta-rs, Spark) write a new
    table's data files before its first commit, so a writer killed in between leaves exactly that.
    Such files belong to no table: every reader and writer treats the directory as a table not yet
    created, and ``maintenance.remove_uncommitted_leftovers`` deletes them after
    ``lake.retention.hours``. It lists directories level by level, and never reads a data file.
    """
    found = _legacy_sign(location, prefix)
    if found:
        conf = json.dumps({"resnapshot": True})
        raise LegacyLakeError(
            f"lake.root {location.root} holds a lake of mongo-cdc's previous layout: {found}. That "
            "layout is plain Parquet directories switched by symlinks under _versions/, not Delta "
            "tables, and is not converted in place. Nothing was written. Move the old lake aside (or "
            f"point lake.root at a new location), then trigger the source's DAG with {conf} so a new "
            "snapshot builds every table; the old raw history is not carried over."
        )


def _legacy_sign(location: LakeLocation, prefix: str) -> str | None:
    fs, root = location.filesystem()
    if fs.get_file_info(f"{root}/_versions").type != FileType.NotFound:
        return f"a _versions/ directory at {location.table_uri('_versions')}"
    if not location.is_local:
        return None
    for zone in ZONES:
        sign = _symlink(f"{root}/{zone}/{prefix}", 2)
        if sign:
            return sign
    return None


def _symlink(path: str, depth: int) -> str | None:
    """A symlinked directory at ``path`` or ``depth`` levels below it (not inside a Delta table)."""
    if os.path.islink(path):
        return f"a symlinked table directory at {path}"
    if depth == 0 or not os.path.isdir(path) or os.path.isdir(os.path.join(path, "_delta_log")):
        return None
    for child in sorted(os.listdir(path)):
        sign = _symlink(os.path.join(path, child), depth - 1)
        if sign:
            return sign
    return None
