"""The ``field.hash.list`` key: the password of the Airflow connection ``field.hash.connection.id``.

Read at task time, by each task that reads documents (and by ``discover``, so a missing key fails
the run before anything lands), and handed to the core as bytes inside the task's ``SourceConfig``:
never written to the source file, a Variable, an XCom, a log line or a spark-submit command (the
Spark job never hashes: documents are hashed before they land).
"""

from __future__ import annotations

from mongo_cdc.config import SourceConfig, SourceConfigError
from mongo_cdc.field_hashing import HashKey


def with_hash_key(config: SourceConfig) -> SourceConfig:
    """``config`` with its ``field.hash.list`` key; itself when the list is empty.

    SourceConfigError naming the connection and the fix when it is missing or has no password.
    """
    if not config.field_hash:
        return config
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    conn_id = config.field_hash_conn_id
    fix = (
        f"create the Airflow connection '{conn_id}' with the key as its password (a long random "
        "secret, the same for every source whose hashes must join), or set field.hash.connection.id"
    )
    try:
        password = Connection.get(conn_id).password
    except AirflowNotFoundException:
        raise SourceConfigError(
            f"{config.path}: field.hash.list is set but connection '{conn_id}' does not exist: {fix}"
        ) from None
    if not password:
        raise SourceConfigError(f"{config.path}: connection '{conn_id}' has no password (the key): {fix}")
    return config.with_hash_key(HashKey(password.encode()))
