"""dlt's MongoDB load with arrow items into Parquet files: run by the bench inside its own dlt venv.

Not imported by mongo_cdc (this venv has neither mongo_cdc nor its dependencies); run as a script:
``<venv>/bin/python dlt_pipeline.py '<json task>'``. The last line printed is the JSON result
(``count``, ``seconds``, ``peak_mib``).

The resource reads the collection the way dlt's verified ``mongodb`` source does with
``data_item_format="arrow"`` (its ``CollectionArrowLoader``): ``find_raw_batches`` of
``chunk_size`` documents, each batch turned into an Arrow table by pymongoarrow's
``process_bson_stream``, ObjectId/Decimal128 columns rewritten as strings value by value. (The
source itself is not on PyPI: ``dlt init mongodb`` copies it from GitHub, which a benchmark run
cannot count on reaching.) The pipeline writes Parquet to a local filesystem destination.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

CHUNK_SIZE = 10_000  # the verified source's default chunk_size


def _peak_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _strings_for_bson_types(table: Any) -> Any:
    """ObjectId and Decimal128 extension columns as strings, as the verified source converts them."""
    import pyarrow as pa
    from pymongoarrow.types import _is_decimal128, _is_objectid

    for i, field in enumerate(table.schema):
        if _is_objectid(field.type) or _is_decimal128(field.type):
            values = [str(value) for value in table[field.name]]
            table = table.set_column(i, pa.field(field.name, pa.string()), pa.array(values, type=pa.string()))
    return table


def main(task: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    import dlt
    from pymongo import MongoClient
    from pymongoarrow.context import PyMongoArrowContext

    client: MongoClient = MongoClient(task["uri"])
    collection = client[task["db"]][task["collection"]]
    rows = 0

    @dlt.resource(name=task["collection"], write_disposition="replace")
    def documents() -> Any:
        nonlocal rows
        for batch in collection.find_raw_batches({}, batch_size=CHUNK_SIZE):
            context = PyMongoArrowContext(None, codec_options=collection.codec_options)
            context.process_bson_stream(batch)
            table = _strings_for_bson_types(context.finish())
            rows += table.num_rows
            yield table

    pipeline = dlt.pipeline(
        pipeline_name="mongo_cdc_bench",
        pipelines_dir=os.path.join(task["dir"], "pipelines"),
        destination=dlt.destinations.filesystem(bucket_url="file://" + os.path.join(task["dir"], "out")),
        dataset_name="bench",
    )
    started = time.perf_counter()
    pipeline.run(documents(), loader_file_format="parquet")
    seconds = time.perf_counter() - started
    client.close()
    return {"count": rows, "seconds": seconds, "peak_mib": _peak_mib()}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
