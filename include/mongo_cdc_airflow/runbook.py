"""The DAG pages as the on-call runbook: each DAG's ``doc_md`` (shown on its page in the Airflow UI).

Every failure it quotes is the start of a real message, followed by its fix, and every command it
quotes triggers the DAG with valid params (tests/unit/test_runbook.py checks both against the code).
The full story is in the repository's docs/.
"""

from __future__ import annotations

import json

from mongo_cdc.capture.offsets import offset_key
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.dag_ids import cdc_dag_id, topology_dag_id
from mongo_cdc_airflow import task_ids

# (the start of a failure message, what to do), in the order an on-call meets them
FAILURES = (
    (
        'unknown param "',
        "A mistyped trigger param (the message lists the valid ones): trigger again with the right "
        "names. Every param is optional.",
    ),
    (
        "is corrupted:",
        "The offset Variable is not a valid offset. Run the `airflow variables set …` command the "
        "message prints (an offset rebuilt from the lake), or delete the Variable for a new snapshot.",
    ),
    (
        "belongs to another replica set",
        "The offset names another position than the lake for the same batch. Run the printed "
        "`airflow variables set …` command: it is built from the lake, exact and shell-quoted.",
    ),
    (
        "the Variable was edited or the lake lost batches",
        "The offset is ahead of the lake. Run the printed `airflow variables set …` command, or "
        "delete the Variable for a new snapshot.",
    ),
    (
        "is being written by task",
        "Another run's task holds the offset and still runs: let it finish. If it is gone, mark "
        "that task failed and run again.",
    ),
    (
        "is no longer in the oplog",
        "The stored position left the oplog: re-snapshot every collection of every shard (the "
        "command under *Re-snapshot*). Only that moves the position; a re-snapshot of some "
        "collections keeps the lost one, and on a sharded cluster a one-shard re-snapshot can drop "
        "documents a chunk migration moved. The state tables are reconciled. Under snapshot.mode "
        "when_needed runs heal it by themselves (oplog.lost.recovery), copying only what differs.",
    ),
    (
        "older than the oplog's first entry",
        "The op-time has left the oplog; the message names the oplog's first one. A new replica set's "
        "configured start (capture.start.op.time or .resume.token): set capture.start.op.time to "
        "that op-time or later, or copy instead (snapshot.mode initial, without the key). A move "
        "(stream_from): trigger again with that op-time or later. Nothing was committed.",
    ),
    (
        "which were never landed",
        'The move would skip events never landed: trigger again with "skip_unread": true if they may '
        "be lost, or with an earlier op-time. Nothing was moved.",
    ),
    (
        "leaves the oplog in about",
        "A warning (a failure with oplog.headroom.fail): resize the replica set's oplog as the "
        "message says, or run the DAG more often.",
    ),
    (
        "needs change stream pre- and post-images",
        "Enable changeStreamPreAndPostImages on the collections the message lists (it prints the "
        "commands), then run again. Nothing was landed.",
    ),
    (
        "field.hash.list is set but connection",
        "Create the Airflow connection the message names with the hash key as its password (or fix "
        "field.hash.connection.id), then run again. Nothing was landed.",
    ),
    (
        "would mix two kinds of hashed values",
        "field.hash.list or its key changed for the collections the message names: re-snapshot them "
        "(the command under *Re-snapshot*, with those collections), or restore the previous list and "
        "key. Nothing of them was landed.",
    ),
    (
        "cannot reach replica set",
        "Check the source connection (its hosts, network, credentials); the next run catches up.",
    ),
    (
        "did not sync (see their shard_sync tasks)",
        "Read the failed shard's own task log; the other shards landed and it catches up next run.",
    ),
    (
        "the transform failed for",
        "Search the transform task's log for 'FAILED': fix that collection's cause. The other "
        "collections landed; the next successful run catches it up.",
    ),
)


def trigger_command(dag_id: str, params: dict) -> str:
    """The CLI command triggering ``dag_id`` with the trigger params ``params``."""
    return f"airflow dags trigger {dag_id} --conf '{json.dumps(params)}'"


def cdc_doc(config: SourceConfig) -> str:
    """The CDC DAG's page: what each task does, how to re-snapshot, where things are, what to do when
    a task fails."""
    key = offset_key(config.name, "<replica set>")
    failures = "\n".join(f"| `…{start}…` | {fix} |" for start, fix in FAILURES)
    dag_id = cdc_dag_id(config.name)
    resnapshot_all = trigger_command(dag_id, {"resnapshot": True})
    resnapshot_some = trigger_command(dag_id, {"resnapshot": True, "collections": ["<db>.<collection>"]})
    verify = trigger_command(dag_id, {"verify": True})
    move_back = trigger_command(dag_id, {"stream_from": "2026-01-01T00:00:00Z"})
    return f"""\
# MongoDB CDC of `{config.name}`

Source file `{config.path}`; lake `{config.lake_root}` (topic prefix `{config.topic_prefix}`).
Runs on `{config.dag.schedule}` (UTC, the source file's `dag.schedule`); one run at a time. This
DAG's pause switch is the source's: its shard watch `{topology_dag_id(config.name)}` follows it
(skipped while this DAG is paused).

## Tasks

| task | what it does |
| --- | --- |
| `{task_ids.DISCOVER}` | Checks the trigger params, finds the shards, names what is not captured |
| `{task_ids.SNAPSHOT_START}` | Per shard: snapshot, resume or stream (its log says why); plans the copy |
| `snapshot_chunks` | Lists the chunks still to copy, for `snapshot_copy` |
| `snapshot_copy` | Copies one chunk of one collection (mapped: one task per chunk) |
| `{task_ids.SHARD_PULL}` | Per shard: streams into the raw tables until caught up, while the copy runs |
| `{task_ids.SHARD_SNAPSHOT}` | Per shard, after its pull: commits the snapshot, then reads the views |
| `{task_ids.SHARD_VERIFY}` | Per shard, on **Verify** or daily: state vs MongoDB, drift healed |
| `{task_ids.PLAN_TRANSFORM}`, `{task_ids.TRANSFORM}` | Spark updates `state` and `changes` from `raw` |
| `summary` | Event counts, lag, each replica set's oplog window (XCom and log); Asset events |
| `stuck_collections` | Runs only when the transform failed: names the collections left behind |
| `{task_ids.VERIFICATION_FAILED}` | Runs when a shard's task failed; fails the run if a `verify` did |

## Re-snapshot

Trigger with params (all optional): **Re-snapshot** on, then **Collections to re-snapshot**
(`<db>.<collection>`, one per line) and/or **Shards to re-snapshot or move**. Empty lists mean
everything.
The state tables are reconciled: documents that no longer exist disappear.

* Every collection (**Collections** empty): streaming goes on from the re-snapshot's position, as
  after the first snapshot. The only way past a position that left the oplog:
  `{resnapshot_all}`
* Some collections: streaming keeps its stored position, so the other collections miss nothing:
  `{resnapshot_some}`
* On a sharded cluster leave **Shards** empty: chunk migrations emit no events, so a one-shard
  re-snapshot can drop documents a migration moved off that shard.
* **Filters of a re-snapshot** (`{{"<db>.<collection>": <filter>}}`, Extended JSON) copy only the
  matching documents of those collections and upsert them: nothing else is deleted, except by an
  `_id` range filter (`{{"_id": {{"$gte": <low>, "$lt": <high>}}}}`), which also deletes the state
  documents of that range the copy did not find. A wrong filter fails `discover`.

## Move a stream

**Move the stream to an op-time** (epoch seconds, ISO-8601 with a zone, or
`<seconds>:<increment>`) reads the change stream again from there, on every shard or the
**Shards** listed; the op-time must still be in the oplog. Events the lake holds already do not
land again (no raw row, change row or state version twice); the batch log records the move (a
`rewind` batch). Moving **forward** skips the events between, which never land: refused unless
**Skip unread events** is on (a `skip` batch). Not with **Re-snapshot**.
`{move_back}`

## Verify

**Verify** on compares the state tables with MongoDB and heals what drifted, as the
`verify.interval.hours` runs do (report: `raw/{config.topic_prefix}/_verifications`):
`{verify}`

## Reading the summary

`summary`'s log and XCom: events per collection and op (`r` snapshot reads, `c`/`u`/`d`), the lag
from the newest event (or the snapshot's position) to the end of the run (`lag`, e.g. `4 min 10 s`;
`lag_seconds`), disconnects and primary elections, and per replica set the oplog window after the
pull: `window`, `position_age` (how old the committed position is) and `headroom` (how long it can
wait before it leaves the oplog), each also in seconds. `not_captured`: the collections the filters
match that are not captured, with why (a view without a unique `_id`, `system.*`, a sharded
cluster's view or time-series collection); a view's `c`/`u`/`d` are the differences its read found
(docs/semantics.md, Views). Time-series collections are read in batches, not streamed, so `lag`
does not tell how fresh their tables are: `time_series` does, per collection (`landed_up_to`:
measurements timed up to then are in; later-written, updated and deleted ones wait for a reconcile,
every `time.series.reconcile.interval.hours` or **Verify** on).

## Offsets

Admin → Variables → `{key}`: where each replica set's stream resumes. The lake's batch log is the
authority: an offset behind it is healed, one that disagrees fails the run with the exact fix.
Opening and saving it unchanged is safe; never move its position by hand: move the stream (above),
re-snapshot, or delete the Variable to start that replica set over with a new snapshot.
`mongo_cdc.{config.name}.topology` lists the shards. Connections (`{config.mongo_conn_id}`, the
lake's) may come from the environment (`AIRFLOW_CONN_…`), so the Connections page can be empty.

## Tables

`{config.lake_root}`: `state/` (one row per live document), `changes/` (every event), `raw/`
(what the pulls landed). Each `state`/`changes` table is an Airflow Asset (Assets page).

## Failures

A wrong param, offset or config fails its task at once (no retries), its message the first
error line of the task log.

| message contains | what to do |
| --- | --- |
{failures}

More: docs/offsets.md (offsets, resets, stuck collections), docs/semantics.md (re-snapshots,
oplog window), docs/reading.md (tables, Assets), docs/deploying.md.
"""


def topology_doc(config: SourceConfig) -> str:
    cdc = cdc_dag_id(config.name)
    return f"""\
# Shard watch of `{config.name}`

Every 15 minutes its sensor `shards_changed` compares the cluster's shard ids with the Variable
`mongo_cdc.{config.name}.topology` (written by `{cdc}`'s `discover`), and `trigger_cdc` triggers
`{cdc}` when a shard was added or removed, so the new shard is snapshotted and a removed one
drained without waiting for the next scheduled run.

**It follows `{cdc}`'s pause switch:** this DAG is unpaused from the start and its sensor is
skipped while `{cdc}` is paused or has not run yet. Pause and unpause `{cdc}` only.

The sensor is deferrable: it waits in the **triggerer** (state *deferred*, no worker slot held),
which polls the cluster every 3 minutes; without a running triggerer it stays deferred. A skipped
sensor means nothing to do: no change within its 14 minutes, or `{cdc}` paused (its log says
which). A plain replica set's one shard never changes, so it never fires there.
"""
