"""Where the lake lives: a local path or an object-store URI, with the options to reach it.

delta-rs (object_store) and the pyarrow filesystem below use the same ``storage_options`` keys
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...), so one location serves every writer and reader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow.fs as pafs

STORAGE_OPTIONS_ENV = "MONGO_CDC_LAKE_STORAGE_OPTIONS"


@dataclass(frozen=True)
class LakeLocation:
    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def table_uri(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem for arbitrary files under the root, and the root's path in it."""
        if self.is_local:
            return pafs.LocalFileSystem(), self.root.removeprefix("file://")
        from deltalake.fs import DeltaStorageHandler

        return pafs.PyFileSystem(DeltaStorageHandler(self.root, dict(self.storage_options))), ""

    def to_env(self) -> dict[str, str]:
        return {STORAGE_OPTIONS_ENV: json.dumps(dict(self.storage_options))}

    @classmethod
    def from_env(cls, root: str) -> LakeLocation:
        return cls(root, json.loads(os.environ.get(STORAGE_OPTIONS_ENV) or "{}"))

    def __repr__(self) -> str:  # never print credentials
        return f"LakeLocation({self.root!r}, storage_options=<{len(self.storage_options)} keys>)"
