"""The states the bench's verification section (``run.verification``) verifies the ``--small``
collection against: one that matches it, one where every ``every``-th document differs (drift
spread over the key range).

They are written here straight from the collection's raw batches (``__key`` and ``__doc_bson``, the
only columns a verification reads), not by the Spark transform: the section measures the
verification, and a state the transform built holds the same two columns.
"""

from __future__ import annotations

import bson
import pyarrow as pa
from deltalake import write_deltalake
from pymongo import MongoClient

from mongo_cdc import lake as lake_layout
from mongo_cdc.capture.document_ids import document_keys
from mongo_cdc.capture.raw_tables import raw_documents
from mongo_cdc.capture.stream_start import start_without_snapshot
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.raw_events import event_keys
from mongo_cdc_dev.bench.worker import bench_config
from mongo_cdc_dev.testing.lake import memory_keeper

_WRITE_ROWS = 200_000


def write_state(
    client: MongoClient, db: str, rs: str, collection: str, lake: str, every: int | None
) -> dict[str, str]:
    """A state table of ``collection`` in ``lake`` (every ``every``-th document changed: drift) and
    an offset streaming from now; the offsets a verifying worker starts from."""
    config = bench_config({"db": db, "collection": collection, "lake": lake})
    keeper = memory_keeper(config, rs)
    start_without_snapshot(client, rs, keeper)
    uri = lake_layout.table_uri(LakeLocation(lake), "state", config.topic_prefix, db, collection)
    keys: list[pa.Array] = []
    documents: list[pa.Array] = []
    seen = 0

    def flush() -> None:
        table = pa.table({"__key": pa.concat_arrays(keys), "__doc_bson": pa.concat_arrays(documents)})
        write_deltalake(uri, table, mode="append")
        keys.clear()
        documents.clear()

    for batch in client[db][collection].find_raw_batches({}):
        read = raw_documents(batch)
        if every is not None:
            changed = read.to_pylist()
            for position in range(-seen % every, len(changed), every):
                changed[position] = bson.encode({**bson.decode(changed[position]), "drift": True})
            read = pa.array(changed, pa.binary())
        seen += len(read)
        keys.append(event_keys(document_keys(read))[0])
        documents.append(read)
        if sum(len(found) for found in keys) >= _WRITE_ROWS:
            flush()
    if keys:
        flush()
    return dict(keeper.store.values)  # type: ignore[attr-defined]
