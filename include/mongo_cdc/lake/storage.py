"""Where the lake lives: a local path or an object-store URI, plus the credentials to reach it.

``LakeLocation`` is the one value every writer and reader of the lake gets. Its
``storage_options`` are delta-rs (object_store) keys such as ``AWS_ACCESS_KEY_ID``; the
Airflow side builds them from a connection (``mongo_cdc_airflow.lake_storage``); the Spark
driver gets them through one environment variable (``to_env``/``from_env``) and the executors
inside the pickled location of each task, never on a command line.

Commits on S3. delta-rs 1.x writes each ``_delta_log/<version>.json`` with a conditional put
(``If-None-Match: *``) by default: no option is needed, no DynamoDB lock, and
``AWS_S3_ALLOW_UNSAFE_RENAME`` is ignored. Two writers racing for one version therefore never
overwrite each other: the loser re-reads the log and retries, or fails with
``CommitFailedError`` when its transaction conflicts (for instance the same app transaction
already committed). The store must support conditional writes: AWS S3 (since 2024), MinIO,
Cloudflare R2 and moto's server (used by the tests) do. Nothing in the lake relies on renames.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    from deltalake import DeltaTable

# A table version for time travel: its number, a timestamp (datetime or ISO-8601 text), None = latest.
TableVersion = int | str | dt.datetime | None

# Object-store schemes a lake root may use (delta-rs and pyarrow both understand them).
URI_SCHEMES = ("s3", "gs", "abfs", "abfss")
STORAGE_OPTIONS_ENV = "MONGO_CDC_LAKE_STORAGE_OPTIONS"
_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")
# Option names whose values are never printed (repr, errors, logs).
_SECRET_KEY = re.compile(r"secret|token|key|password|sas|credential", re.IGNORECASE)
# delta-rs S3 option -> pyarrow.fs.S3FileSystem argument (see LakeLocation.filesystem).
_S3_FILESYSTEM_ARGS = {
    "AWS_ACCESS_KEY_ID": "access_key",
    "AWS_SECRET_ACCESS_KEY": "secret_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_REGION": "region",
}


class LakeRootError(ValueError):
    """``lake.root`` is neither an absolute local path nor a URI of a supported object store."""


def _allowed_roots() -> str:
    return "an absolute local path or " + ", ".join(f"{scheme}://<bucket>/<prefix>" for scheme in URI_SCHEMES)


def uri_scheme(root: str) -> str | None:
    """The scheme of a ``scheme://`` root (lower case), None for a local path."""
    match = _URI.match(root)
    return match["scheme"].lower() if match else None


def resolve_root(root: str, relative_to: str) -> str:
    """A checked lake root: URIs as given (no trailing ``/``), local paths absolute and normalised.

    A relative local path is taken relative to ``relative_to`` (the source YAML's folder); a URI
    never is. An unknown scheme or a URI without a bucket raises ``LakeRootError``.
    """
    scheme = uri_scheme(root)
    if scheme is None:
        return os.path.normpath(os.path.join(relative_to, root))
    if scheme not in URI_SCHEMES:
        raise LakeRootError(
            f"lake root {root!r} has an unsupported scheme '{scheme}://'; use {_allowed_roots()}"
        )
    if not urlsplit(root).netloc:
        raise LakeRootError(f"lake root {root!r} names no bucket or container; use {_allowed_roots()}")
    return f"{scheme}://{_URI.match(root)['rest'].rstrip('/')}"


def _redacted(options: Mapping[str, str]) -> dict[str, str]:
    return {key: "***" if _SECRET_KEY.search(key) else value for key, value in options.items()}


@dataclass(frozen=True, repr=False)
class LakeLocation:
    """The lake root and the delta-rs storage options that reach it (picklable, secrets never shown)."""

    root: str
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if uri_scheme(self.root) is None and not os.path.isabs(self.root):
            raise LakeRootError(f"lake root {self.root!r} is relative; use {_allowed_roots()}")
        object.__setattr__(self, "root", resolve_root(self.root, "/"))
        # a plain dict: pickles into Spark closures, and callers cannot change ours
        object.__setattr__(self, "storage_options", {str(k): str(v) for k, v in self.storage_options.items()})

    def __repr__(self) -> str:
        return f"LakeLocation(root={self.root!r}, storage_options={_redacted(self.storage_options)!r})"

    @property
    def is_local(self) -> bool:
        return uri_scheme(self.root) is None

    def table_uri(self, *parts: str) -> str:
        """URI (or absolute path) of a table or file under the root, e.g. ``table_uri("state", p, db, c)``."""
        if any(not part or "/" in part for part in parts):
            raise ValueError(f"lake path parts must be non-empty names without '/', got {parts!r}")
        if self.is_local:
            return os.path.join(self.root, *parts)
        return "/".join((self.root, *parts))

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem for arbitrary files of the lake, and the root's path inside it.

        ``fs, base = location.filesystem(); pq.read_table(f"{base}/raw/...", filesystem=fs)``; new
        files are best created with ``open_output``.

        * local: ``LocalFileSystem``, base = the root.
        * s3: pyarrow's native ``S3FileSystem`` built from the same options (key, secret, session
          token, region, endpoint), base = ``<bucket>/<prefix>``. It is C++, releases the GIL during
          I/O and was 1.4-2.5x faster than the alternative below against moto. Any other option is
          refused rather than silently ignored.
        * gs, abfs(s): ``PyFileSystem`` over delta-rs' own ``DeltaStorageHandler``, so every
          delta-rs option works unchanged (untested against a real GCS/Azure account here). It
          holds the GIL during I/O, which is why S3 does not use it.
        """
        import pyarrow.fs as pafs  # here, not at the top: the DAG file's parse imports this module

        scheme = uri_scheme(self.root)
        if scheme is None:
            return pafs.LocalFileSystem(), self.root
        parts = urlsplit(self.root)
        base = f"{parts.netloc}{parts.path}" if scheme == "s3" else parts.path.strip("/")
        if scheme == "s3":
            return _s3_filesystem(self.storage_options), base.rstrip("/")
        return _object_store_filesystem(f"{scheme}://{parts.netloc}", self.storage_options), base

    def open_output(self, *parts: str) -> pa.NativeFile:
        """A new file ``<root>/<parts...>`` to write (local: its directories are made first).

        Use this rather than ``filesystem()`` to create files: a local filesystem needs the
        directories, and creating them on S3 would leave empty ``dir/`` marker objects.
        """
        fs, base = self.filesystem()
        path = "/".join((base, *parts))
        if self.is_local:
            fs.create_dir(os.path.dirname(path), recursive=True)
        return fs.open_output_stream(path)

    def to_env(self) -> dict[str, str]:
        """Environment that gives a child process (spark-submit, its executors) these options."""
        return {STORAGE_OPTIONS_ENV: json.dumps(dict(self.storage_options), sort_keys=True)}

    @classmethod
    def from_env(cls, root: str, environ: Mapping[str, str] | None = None) -> LakeLocation:
        """The location of ``root`` with the options ``to_env`` passed (none: ambient credentials)."""
        text = (os.environ if environ is None else environ).get(STORAGE_OPTIONS_ENV, "")
        try:
            options = json.loads(text) if text else {}
        except ValueError:
            options = None  # the text may hold secrets: the error names the variable only
        if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
            raise ValueError(f"environment variable {STORAGE_OPTIONS_ENV} must be a JSON object of strings")
        return cls(root, options)


def table_if_exists(table_uri: str, storage_options: Mapping[str, str] | None = None) -> DeltaTable | None:
    """The latest version of the Delta table at ``table_uri``, or None where there is none yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return None
    return refusing_deletion_vectors(table)


def row_count(table: DeltaTable | None) -> int:
    """Live rows of a Delta table version (0 for None), from the log's file statistics: no data file
    is read. Exact for the tables mongo-cdc writes (delta-rs writes every file's ``numRecords`` and no
    deletion vectors)."""
    if table is None:
        return 0
    import pyarrow.compute as pc

    return pc.sum(file_actions(table).column("num_records")).as_py() or 0


def file_actions(table: DeltaTable) -> pa.Table:
    """The add actions of a table version as delta-rs gives them unflattened: ``path``, ``size_bytes``,
    ``num_records``, and the structs of statistics and partition values (``file_stats``). Flattened,
    they cost delta-rs four times as much: 4 ms against 1 for a small state table, at each read of
    each table of a source of many collections."""
    import pyarrow as pa

    return pa.table(table.get_add_actions(flatten=False))


def file_stats(actions: pa.Table, kind: str, column: str) -> list[Any] | None:
    """Each file's statistic ``kind`` (``min``, ``max``, ``null_count``) or partition value
    (``partition``) of the top-level ``column`` in ``actions`` (``file_actions``); None when the log
    holds none for it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind not in actions.column_names:
        return None
    values = actions.column(kind)
    if not pa.types.is_struct(values.type) or values.type.get_field_index(column) < 0:
        return None
    return pc.struct_field(values, column).to_pylist()


def open_table(
    table_uri: str, storage_options: Mapping[str, str] | None = None, version: TableVersion = None
) -> DeltaTable:
    """The Delta table at ``version``: a number, a datetime or an ISO-8601 timestamp; None = latest."""
    from deltalake import DeltaTable

    if isinstance(version, int) or version is None:
        table = DeltaTable(table_uri, storage_options=dict(storage_options or {}), version=version)
    else:
        table = DeltaTable(table_uri, storage_options=dict(storage_options or {}))
        table.load_as_version(version)
    return refusing_deletion_vectors(table)


class DeletionVectorsError(RuntimeError):
    """A table lets its writers mark rows deleted in deletion vectors, which mongo-cdc cannot apply."""


def refusing_deletion_vectors(table: DeltaTable) -> DeltaTable:
    """``table``, unless its protocol enables deletion vectors: another engine (Databricks, Spark with
    delta-spark, Trino) may then have deleted rows in a file's vector, and mongo-cdc reads and
    rewrites each data file whole (the transform's MERGE, compaction, ``readers.spark_table``), so
    those rows would come back, silently. Refused at the table's opening, naming the way back."""
    if "deletionVectors" in (table.protocol().reader_features or []):
        raise DeletionVectorsError(
            f"the Delta table {table.table_uri} has deletion vectors enabled (reader feature "
            "deletionVectors): another engine may have marked rows of its files deleted, and mongo-cdc, "
            "which reads and rewrites whole files, would bring them back. Drop the feature with that "
            "engine (Delta Lake 3.1+: ALTER TABLE delta.`<table>` DROP FEATURE deletionVectors, which "
            'purges them first), or rebuild the table (docs/reading.md, "Deletion vectors")'
        )
    return table


def table_filesystem(table: DeltaTable) -> pafs.FileSystem | None:
    """A native pyarrow filesystem rooted at ``table``'s directory, for its
    ``to_pyarrow_dataset(filesystem=...)`` (None: gs/abfs, delta-rs' own is the one there is).

    deltalake's default is a ``PyFileSystem`` over delta-rs' object store: a Python object the scan's
    C++ threads hold, and the last of them to let go of it (after the read returned) takes the GIL
    to do so. When that happens after the interpreter began to shut down, CPython ends the thread
    inside a C++ destructor and the process aborts ("terminate called without an active
    exception", exit 134): half the processes that read a table through deltalake did, with every
    deltalake 1.x and pyarrow 18-26 here. A native filesystem holds no Python object."""
    import pyarrow.fs as pafs

    uri = table.table_uri.rstrip("/")
    scheme = uri_scheme(uri)
    if scheme is None or scheme == "file":
        path = urlsplit(uri).path if scheme == "file" else uri
        return pafs.SubTreeFileSystem(path, pafs.LocalFileSystem())
    if scheme == "s3":
        parts = urlsplit(uri)
        options = getattr(table, "_storage_options", None) or {}
        return pafs.SubTreeFileSystem(f"{parts.netloc}{parts.path}", _s3_filesystem(options))
    return None


def _s3_filesystem(options: Mapping[str, str]) -> pafs.S3FileSystem:
    import pyarrow.fs as pafs

    args: dict[str, Any] = {}
    for key, value in options.items():
        name = key.upper()
        if name in _S3_FILESYSTEM_ARGS:
            args[_S3_FILESYSTEM_ARGS[name]] = value
        elif name == "AWS_ENDPOINT_URL":
            endpoint = urlsplit(value)
            args["endpoint_override"] = f"{endpoint.netloc}{endpoint.path}".rstrip("/")
            args["scheme"] = endpoint.scheme or "https"
        elif name != "AWS_ALLOW_HTTP":  # the endpoint's scheme says it for pyarrow
            raise ValueError(
                f"S3 storage option {key!r} has no pyarrow S3FileSystem equivalent; "
                f"supported: {', '.join([*_S3_FILESYSTEM_ARGS, 'AWS_ENDPOINT_URL', 'AWS_ALLOW_HTTP'])}"
            )
    return pafs.S3FileSystem(**args)


def _object_store_filesystem(bucket_uri: str, options: Mapping[str, str]) -> pafs.PyFileSystem:
    """delta-rs' object_store client as a pyarrow filesystem rooted at the bucket (paths: ``<prefix>/…``)."""
    import pyarrow.fs as pafs

    return pafs.PyFileSystem(_storage_handler_class()(bucket_uri, dict(options)))


@cache
def _storage_handler_class() -> type:
    import pyarrow as pa
    from deltalake.fs import DeltaStorageHandler

    class StorageHandler(DeltaStorageHandler):
        # delta-rs' output stream accepts only ``bytes``, but pyarrow's NativeFile.write hands it a Buffer
        def open_output_stream(self, path: str, metadata: dict[str, str] | None = None) -> pa.PythonFile:
            return pa.PythonFile(_BytesWriter(self._handler.open_output_stream(path, metadata)), mode="w")

    return StorageHandler


class _BytesWriter:
    """Hands delta-rs' output stream ``bytes`` whatever buffer pyarrow writes."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        return self._stream.write(data if isinstance(data, bytes) else bytes(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
