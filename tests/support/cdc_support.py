"""Shared checks for the end-to-end tests: run a source's DAG, compare lake tables with MongoDB."""

from __future__ import annotations

import datetime as dt
import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import bson
import pyarrow as pa
from bson import json_util
from bson.datetime_ms import DatetimeMS
from sqlalchemy import select

from mongo_cdc import extjson
from mongo_cdc.lake import pack_cluster_time, table_uri
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.storage import LakeLocation, table_if_exists

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS_PAGE = os.path.join(REPO, "docs", "reading.md")
# The Spark job's entry point: what spark-submit runs (the DAG's ``settings.spark_app()`` in a checkout).
SPARK_APP = os.path.join(REPO, "spark_apps", "cdc_transform.py")
DOCUMENTED_ASSET_URI = "file:///data/lake/state/shop/shop/orders"
EJSON_OPTIONS = json_util.JSONOptions(datetime_conversion=bson.DatetimeConversion.DATETIME_MS)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
OPLOG_TRUNCATION_TIMEOUT_S = 90


@functools.cache
def spark_job() -> ModuleType:
    """The Spark job's entry module (``SPARK_APP``: ``parse_args``, ``main``), loaded from its file:
    ``spark_apps`` is a folder of scripts, not a package on ``sys.path``."""
    spec = importlib.util.spec_from_file_location("cdc_transform", SPARK_APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class CdcSource:
    name: str
    database: str
    lake_root: str
    prefix: str
    storage_options: tuple[tuple[str, str], ...] = ()  # an object-store lake's (hashable: frozen)

    @property
    def location(self) -> LakeLocation:
        return LakeLocation(self.lake_root, dict(self.storage_options))

    @property
    def dag_id(self) -> str:
        return f"mongo_cdc__{self.name}"

    def run(
        self,
        logical_date: dt.datetime | None = None,
        expect: str = "success",
        skip_spark: bool = False,
        conf: dict[str, Any] | None = None,
        scheduled: bool = False,
    ):
        """One real DAG run through ``dag.test()`` (``conf``: the trigger params; ``scheduled``: the
        run is of type ``scheduled``, as the scheduler makes them, where ``dag.test()`` makes a manual
        one); returns the DagRun."""
        import airflow.models.dagrun as dagrun_module
        from airflow.dag_processing.dagbag import DagBag
        from airflow.utils.types import DagRunType

        bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
        assert not bag.import_errors, bag.import_errors
        dag = bag.get_dag(self.dag_id)
        kwargs: dict[str, Any] = {"mark_success_pattern": "^transform$"} if skip_spark else {}
        if logical_date is not None:
            kwargs["logical_date"] = logical_date
        create_run = dagrun_module.get_or_create_dagrun

        def scheduled_run(**arguments: Any):
            run = create_run(**arguments)
            run.run_type = DagRunType.SCHEDULED
            arguments["session"].commit()
            return run

        chosen = scheduled_run if scheduled else create_run
        with mock.patch.object(dagrun_module, "get_or_create_dagrun", chosen):
            run = dag.test(run_conf=conf, **kwargs)
        assert run.state == expect, [(ti.task_id, ti.state) for ti in run.get_task_instances()]
        return run

    def verify_reporting(self, client, rs: str, shard: Any = None) -> Any:
        """The verification the DAG's verify task runs on replica set ``rs`` (through ``client``; of a
        cluster: ``shard``, a ``ShardScope``), with ``verify.on.drift: report``, which writes no offset:
        the DAG runs' offset is read into a store of the test's own. Returns the VerificationResult."""
        from airflow.models import Variable

        from mongo_cdc.capture.offsets import offset_key
        from mongo_cdc.capture.replica_set import ReplicaSetCapture
        from mongo_cdc.config import load_sources
        from mongo_cdc.verify.verification import verify_replica_set
        from mongo_cdc_dev.testing.lake import MemoryOffsetStore, memory_keeper

        configs, errors = load_sources(os.environ["MONGO_CDC_SOURCES_DIR"])
        assert not errors
        [config] = [config for config in configs if config.name == self.name]
        store = MemoryOffsetStore()
        key = offset_key(config.name, rs)
        store.set(key, Variable.get(key))
        capture = ReplicaSetCapture(client, config, memory_keeper(config, rs, store))
        return verify_replica_set(capture, "report", shard)

    def backfill(
        self, from_date: dt.datetime, to_date: dt.datetime, expect: str = "success", skip_spark: bool = False
    ) -> list:
        """``airflow backfill create`` over [from_date, to_date]; its runs executed by ``dag.test()``.

        Airflow's own backfill code creates the Backfill and its runs (run type ``backfill``); with no
        scheduler here, ``dag.test()`` then runs each of them in place of a new manual run.
        """
        import airflow.models.dagrun as dagrun_module
        from airflow.models.backfill import Backfill, ReprocessBehavior, _create_backfill
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState

        backfill = _create_backfill(
            dag_id=self.dag_id,
            from_date=from_date,
            to_date=to_date,
            max_active_runs=1,
            reverse=False,
            dag_run_conf=None,
            triggering_user_name="test",
            reprocess_behavior=ReprocessBehavior.COMPLETED,
        )

        def the_backfill_run(*, dag, logical_date, session, **_: Any) -> DagRun:
            run = session.scalars(
                select(DagRun).where(
                    DagRun.dag_id == dag.dag_id,
                    DagRun.logical_date == logical_date,
                    DagRun.backfill_id == backfill.id,
                )
            ).one()
            run.state = DagRunState.RUNNING
            session.commit()
            run.dag = dag  # as create_dagrun leaves it
            return run

        with create_session() as session:
            query = select(DagRun.logical_date).where(DagRun.backfill_id == backfill.id)
            logical_dates = session.scalars(query.order_by(DagRun.logical_date)).all()
        runs = []
        with mock.patch.object(dagrun_module, "get_or_create_dagrun", the_backfill_run):
            for logical_date in logical_dates:
                runs.append(self.run(logical_date, expect=expect, skip_spark=skip_spark))
        with create_session() as session:
            session.get(Backfill, backfill.id).completed_at = dt.datetime.now(dt.timezone.utc)
        return runs

    @property
    def lake(self) -> SourceLake:
        return SourceLake(self.location, self.prefix)

    def table_rows(self, zone: str, collection: str) -> list[dict]:
        """Every live row of a derived table, read with delta-rs (no table yet: none)."""
        table = table_if_exists(
            table_uri(self.location, zone, self.prefix, self.database, collection), dict(self.storage_options)
        )
        return [] if table is None else pa.table(table.to_pyarrow_dataset().to_table()).to_pylist()

    def state_rows(self, collection: str) -> list[dict]:
        return self.table_rows("state", collection)

    def change_rows(self, collection: str) -> list[dict]:
        return self.table_rows("changes", collection)

    def verification_rows(self) -> list[dict]:
        """Every row of the verification log (``raw/<prefix>/_verifications``)."""
        from mongo_cdc.lake import VERIFICATION_LOG, source_table_uri

        table = table_if_exists(
            source_table_uri(self.location, self.prefix, VERIFICATION_LOG), dict(self.storage_options)
        )
        return [] if table is None else pa.table(table.to_pyarrow_dataset().to_table()).to_pylist()

    def raw_rows(self, collection: str) -> list[dict]:
        """The committed raw rows of a collection, in oplog order (a tombstone after its delete)."""
        rows = self.lake.committed_raw(f"{self.database}.{collection}").to_pylist()
        return sorted(rows, key=lambda r: (r["cluster_time"], r["event_order"], r["op"] is None))

    def transform_command(self, *arguments: str) -> list[str]:
        """The spark-submit command of the DAG's Spark job (e.g. with ``--rebuild-hours``)."""
        return [
            "spark-submit",
            "--master",
            "local[2]",
            SPARK_APP,
            "--lake-root",
            self.lake_root,
            "--topic-prefix",
            self.prefix,
            *arguments,
        ]

    def transform(self, *arguments: str) -> dict[str, Any]:
        """The DAG's Spark job run by hand (e.g. with ``--rebuild-hours``); its JSON summary."""
        done = subprocess.run(self.transform_command(*arguments), capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def streamed_events(self, collection: str) -> list[tuple[str, str]]:
        """(document id EJSON, op) of every non-snapshot event, tombstones left out, in oplog order."""
        return [
            (json_util.loads(r["key"])["id"], r["op"])
            for r in self.raw_rows(collection)
            if r["op"] not in (None, "r")
        ]


def stored_offset(source: CdcSource, rs: str) -> Any:
    """The replica set's offset as its Airflow Variable holds it."""
    from airflow.models import Variable

    from mongo_cdc.capture.offsets import offset_key, parse_offset

    key = offset_key(source.name, rs)
    return parse_offset(key, Variable.get(key))


def stream_past_everything_written_so_far(source: CdcSource, client, rs: str) -> None:
    """Move the committed resume position to now (in the lake's batch log, then the Variable), as if
    every write so far had been streamed: the pipeline never sees those writes (like changes that
    left the oplog during an outage)."""
    from dataclasses import replace

    from airflow.models import Variable

    from mongo_cdc.capture.change_cursor import token_cluster_time
    from mongo_cdc.capture.offsets import offset_key
    from mongo_cdc.capture.snapshot import current_position
    from mongo_cdc.lake.batch_log import Batch

    offset = stored_offset(source, rs)
    token = current_position(client)
    seq = offset.batch_seq + 1
    source.lake.commit(Batch(rs, seq, "position", token, token_cluster_time(token)))
    moved = replace(offset, resume_token=token, cluster_time=token_cluster_time(token), batch_seq=seq)
    Variable.set(offset_key(source.name, rs), moved.to_json())


def overwrite_the_oplog_past(client, cluster_time: int) -> None:
    """Write large documents (to a database no source captures) until the oplog's first entry is
    newer than ``cluster_time`` (on a replica set started like conftest's ``small_oplog``)."""
    blob = "x" * (512 * 1024)
    deadline = time.monotonic() + OPLOG_TRUNCATION_TIMEOUT_S
    writes = 0
    while True:
        first = client.local["oplog.rs"].find_one(sort=[("$natural", 1)])["ts"]
        if pack_cluster_time(first.time, first.inc) > cluster_time:
            return
        assert time.monotonic() < deadline, "the oplog was not truncated in time"
        client.oplog_filler.blobs.replace_one({"_id": writes % 4}, {"blob": f"{blob}{writes}"}, upsert=True)
        writes += 1


def truncate_state_files(source: CdcSource, collection: str) -> dict[Path, bytes]:
    """Cut every data file of the collection's state table in half (its next MERGE fails reading
    them); their bytes, to restore them."""
    table = table_if_exists(table_uri(source.location, "state", source.prefix, source.database, collection))
    assert table is not None
    originals = {}
    for uri in table.file_uris():
        path = Path(uri.removeprefix("file://"))
        originals[path] = path.read_bytes()
        path.write_bytes(originals[path][: len(originals[path]) // 2])
    assert originals
    return originals


def documents(client, database: str, collection: str) -> list[dict]:
    return list(client[database].get_collection(collection, codec_options=extjson.DECODE_OPTIONS).find())


def assert_state_equals_collection(
    source: CdcSource, client, collection: str, fallback: frozenset = frozenset()
) -> None:
    """Every live document has exactly one state row, holding every field value; nothing else is there.

    ``fallback`` names top-level fields whose values differ in type across documents, which the
    transform stores as Extended JSON text.
    """
    assert_state_equals_documents(
        source, collection, documents(client, source.database, collection), fallback
    )


def assert_state_equals_documents(
    source: CdcSource, collection: str, docs: list[dict], fallback: frozenset = frozenset()
) -> None:
    rows = source.state_rows(collection)
    by_id = {row["__id"]: row for row in rows}
    assert len(rows) == len(by_id), "duplicate document ids in the state table"
    assert sorted(by_id) == sorted(extjson.encode_str(d["_id"]) for d in docs)
    for doc in docs:
        row = by_id[extjson.encode_str(doc["_id"])]
        # the lossless copy is byte-for-byte the same BSON, and its Extended JSON parses back to it
        assert row["__doc_bson"] == bson.encode(doc)
        assert bson.encode(json_util.loads(row["__doc"], json_options=EJSON_OPTIONS)) == bson.encode(doc)
        for field, value in doc.items():
            sibling = row.get(f"{field}__fallback")
            if field in fallback or sibling is not None:
                # a value the column's type cannot hold: Extended JSON text, in the column (a first
                # batch's conflict) or in its fallback sibling (a later batch's)
                text = row[field] if field in fallback else sibling
                assert text == extjson.encode_str(value), (field, text, value)
            elif field not in row:
                assert value is None, f"{field} has no column (only nulls seen) but holds {value!r}"
            else:
                assert_cell_equals(row[field], value, field)
        for field, cell in row.items():
            base = field.removesuffix("__fallback")
            if not field.startswith("__") and field not in doc and base not in doc:
                assert cell is None, f"{field} is not in the document but has {cell!r}"


def assert_cell_equals(cell: Any, value: Any, where: str) -> None:
    """A typed Parquet cell holds the BSON value (per the documented type mapping)."""
    if value is None:
        assert cell is None, where
    elif isinstance(value, bson.ObjectId):
        assert cell == str(value), where
    elif isinstance(value, DatetimeMS):
        assert (cell - EPOCH) // dt.timedelta(milliseconds=1) == int(value), where
    elif isinstance(value, bson.Decimal128):
        assert cell == str(value), where
    elif isinstance(value, bson.Binary | bytes):
        assert cell == bytes(value), where
    elif isinstance(value, float) and math.isnan(value):
        assert isinstance(cell, float) and math.isnan(cell), (where, cell)
    elif isinstance(value, dict):
        assert isinstance(cell, dict), where
        for key, item in value.items():
            assert_cell_equals(cell[key], item, f"{where}.{key}")
        assert all(cell[k] is None for k in cell if k not in value), where
    elif isinstance(value, list):
        assert isinstance(cell, list) and len(cell) == len(value), where
        for i, (c, v) in enumerate(zip(cell, value, strict=True)):
            assert_cell_equals(c, v, f"{where}[{i}]")
    else:
        assert isinstance(cell, bool) == isinstance(value, bool), where
        assert cell == value, (where, cell, value)


def op_counts(events: list[tuple[str, str]]) -> Counter:
    return Counter(op for _, op in events)


def documented_downstream_dag(uri: str) -> str:
    """The example DAG of docs/reading.md ("Airflow Assets") scheduled on a table's Asset, made to
    schedule on ``uri``."""
    with open(ASSETS_PAGE) as page:
        section = page.read().split("\n## Airflow Assets\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert DOCUMENTED_ASSET_URI in code
    return code.replace(DOCUMENTED_ASSET_URI, uri)


def asset_events(dag_id: str, run_id: str) -> dict[str, dict]:
    """The asset events a run's summary task emitted: URI -> extras."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetModel.name, AssetEvent.extra, AssetEvent.source_task_id)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
        ).all()
    assert all(name == uri and task == "summary" for uri, name, _, task in rows), rows
    events = {uri: extra for uri, _, extra, _ in rows}
    assert len(events) == len(rows), "one event per table and run"
    return events
