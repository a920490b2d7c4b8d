"""Spark job: every collection's committed raw events -> its Delta ``state`` and ``changes`` tables.

    spark-submit spark_apps/cdc_transform.py --lake-root /lake --topic-prefix shop

The entry point: the job's arguments and ``main``. How a run goes is ``mongo_cdc.transform.driver``
(the driver's side: ``CollectionTransform``, ``collection_run``, ``state_commit``,
``changes_commit``) and ``mongo_cdc.transform.slice_tasks`` (what each Spark task does with its raw
slice, ``raw_slices``). Object-store
credentials come from the environment (``storage.LakeLocation.from_env``).

Only the collections with work run (``mongo_cdc.transform.work``): a run where none has any starts no
SparkContext and prints an empty summary. Collections fail alone: the job carries on with the
others, then exits 1 after one stderr line (right before the summary) naming each failed collection
and its batches behind. Output: the last
stdout line is the JSON summary (``driver.JobSummary``). Bad arguments print one line to stderr and
exit 2 before Spark starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from concurrent.futures import ThreadPoolExecutor

from pyspark import SparkConf, SparkContext

from mongo_cdc.lake.errors import refuse_legacy_layout
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.maintenance import MaintenanceSettings
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.driver import JobSummary, transform_collections
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.work import plan_work, source_work

HOUR_NAME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}")


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _flattening(text: str) -> FlatteningOptions:
    try:
        return FlatteningOptions.from_json(json.loads(text))
    except ValueError as error:  # JSONDecodeError included
        raise argparse.ArgumentTypeError(str(error)) from None


def _hours(text: str) -> tuple[str, ...]:
    try:
        hours = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    if not isinstance(hours, list) or not all(isinstance(h, str) and HOUR_NAME.fullmatch(h) for h in hours):
        raise argparse.ArgumentTypeError('expected ["YYYY-MM-DDTHH", ...]')
    return tuple(hours)


def _maintenance(text: str) -> MaintenanceSettings:
    try:
        return MaintenanceSettings.from_text(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _ArgumentParser(prog="cdc_transform", description=__doc__.splitlines()[0])
    parser.add_argument("--lake-root", required=True, help="a local path or an s3://, gs://, abfss:// URI")
    parser.add_argument("--topic-prefix", required=True)
    parser.add_argument(
        "--flattening",
        type=_flattening,
        default=FlatteningOptions(),
        help='the changes table\'s event flattening, e.g. {"flatten.struct": true} (defaults otherwise)',
    )
    parser.add_argument(
        "--rebuild-hours",
        type=_hours,
        default=(),
        help='JSON list of hours whose change rows are rewritten, e.g. ["2024-05-01T13"]',
    )
    parser.add_argument(
        "--maintain",
        type=_maintenance,
        default=None,
        help='compact and vacuum the tables afterwards, e.g. {"optimize_interval_hours": 24, '
        '"retention_hours": 168}: every table, or with "slot": N the collections of share N of '
        "optimize_interval_hours (lake.maintenance.maintained)",
    )
    parser.add_argument(
        "--run-id",
        default="",
        help="the run that starts the job (the CDC DAG's run id): its summary finds the tables' figures "
        "in the applied mark",
    )
    args = parser.parse_args(argv)
    if args.topic_prefix in ("", ".", "..") or "/" in args.topic_prefix:
        parser.error(f"--topic-prefix {args.topic_prefix!r} is not a directory name")
    return args


def start_spark() -> SparkContext:
    """The job's SparkContext. No SparkSession: the job runs Python tasks only, and a session's SQL
    state takes seconds to build on every run."""
    context = SparkContext.getOrCreate(
        SparkConf().setAppName("mongo-cdc-transform").set("spark.ui.enabled", "false")
    )
    context.setLogLevel("WARN")
    return context


def main(argv: list[str] | None = None, context: SparkContext | None = None) -> int:
    """The job; ``context``: a caller's SparkContext to run on, left running (by default the job
    starts its own and stops it)."""
    args = parse_args(argv)
    # force: pyspark installs a root handler on stdout, where only the summary may go.
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s", force=True
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    source_lake = SourceLake(LakeLocation.from_env(args.lake_root), args.topic_prefix)
    refuse_legacy_layout(source_lake.location, args.topic_prefix)
    batches = source_lake.batches()
    plan = plan_work(source_lake, batches, args.flattening, args.rebuild_hours, args.maintain)
    summary = JobSummary()
    if plan.first is None:
        logging.info("no collection has work: Spark is not started")
    else:
        # Spark starts while every collection's tables are read (work.source_work): both take seconds
        # in a source of hundreds of collections
        with ThreadPoolExecutor(1, thread_name_prefix="spark-start") as starter:
            starting = starter.submit(start_spark) if context is None else None
            try:
                work = plan.every
                if work is None:  # plan_work read only up to the first collection with work
                    work = source_work(
                        source_lake, batches, args.flattening, args.rebuild_hours, args.maintain
                    )
                for namespace, collection_work in work.items():
                    logging.info("%s: %s", namespace, ", ".join(collection_work.reasons))
                summary = transform_collections(
                    context if starting is None else starting.result(),
                    source_lake,
                    batches,
                    work,
                    args.flattening,
                    args.rebuild_hours,
                    args.maintain,
                    args.run_id,
                )
            finally:
                if starting is not None and starting.exception() is None:
                    starting.result().stop()
    if summary.failed:  # before the summary: spark-submit passes the driver's stderr on in its stdout
        sys.stderr.write(summary.failure_line())
        sys.stderr.flush()
    print(summary.to_json(), flush=True)
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
