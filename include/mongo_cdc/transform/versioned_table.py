"""Versioned derived tables: each version is a directory; the public path is a symlink to one.

A version is written completely (data, then ``_mongo_cdc.json``) before the symlink is
repointed with an atomic rename, so readers see the old or the new version, never a mix, and a
crash mid-write leaves the previous version published. The current and the previously
published version are kept (a reader may still be reading the latter); every other version
directory, including ones left by crashed runs, is deleted on publish.

``_mongo_cdc.json`` holds the table's bookkeeping, e.g. per replica set the last raw batch
``seq`` applied. The leading underscore makes Spark and pyarrow skip it, like ``_deleted``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

from mongo_cdc import lake

METADATA_FILE = "_mongo_cdc.json"
_VERSION_NAME = re.compile(r"^v(\d+)$")


class VersionedTable:
    def __init__(self, public_path: str, versions_dir: str) -> None:
        self.public_path = public_path
        self.versions_dir = versions_dir

    @classmethod
    def of_collection(
        cls, lake_root: str, table: str, prefix: str, db: str, collection: str
    ) -> VersionedTable:
        return cls(
            lake.table_path(lake_root, table, prefix, db, collection),
            lake.versions_dir(lake_root, table, prefix, db, collection),
        )

    def current_version(self) -> str | None:
        """The published version directory, or None before the first publish."""
        if not os.path.islink(self.public_path):
            return None
        return os.path.realpath(self.public_path)

    def read_metadata(self) -> dict[str, Any] | None:
        current = self.current_version()
        path = os.path.join(current, METADATA_FILE) if current else None
        if path is None or not os.path.exists(path):
            return None
        with open(path) as file:
            return json.load(file)

    def next_version_dir(self) -> str:
        """A new version directory path (not created), numbered after every existing one."""
        numbers = [int(match[1]) for match in map(_VERSION_NAME.match, self._version_names()) if match]
        return os.path.join(self.versions_dir, f"v{max(numbers, default=0) + 1:06d}")

    def publish(self, version_dir: str) -> None:
        """Point the public path at ``version_dir`` atomically, then drop stale versions."""
        previous = self.current_version()
        parent = os.path.dirname(self.public_path)
        os.makedirs(parent, exist_ok=True)
        temporary = os.path.join(parent, f".{os.path.basename(self.public_path)}.publishing")
        if os.path.lexists(temporary):
            os.remove(temporary)
        # Relative, so the lake stays valid wherever it is mounted.
        os.symlink(os.path.relpath(version_dir, parent), temporary)
        os.replace(temporary, self.public_path)
        keep = {os.path.realpath(version_dir), previous}
        for name in self._version_names():
            path = os.path.join(self.versions_dir, name)
            if _VERSION_NAME.match(name) and os.path.realpath(path) not in keep:
                shutil.rmtree(path)

    def _version_names(self) -> list[str]:
        return os.listdir(self.versions_dir) if os.path.isdir(self.versions_dir) else []


def write_metadata(version_dir: str, metadata: dict[str, Any]) -> None:
    """Replace the version's metadata file atomically (it may be the published version)."""
    path = os.path.join(version_dir, METADATA_FILE)
    temporary = os.path.join(version_dir, f".{METADATA_FILE}.tmp")
    with open(temporary, "w") as file:
        json.dump(metadata, file, sort_keys=True)
    os.replace(temporary, path)
