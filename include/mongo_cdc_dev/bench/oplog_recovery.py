"""The bench's lost-oplog section (``run.SECTIONS["oplog-recovery"]``): the healing recovery of the
``--small`` collection (``oplog.lost.recovery: heal``) against the full re-snapshot it replaces
(``resnapshot``), measured in the same run.

The lake missed ``MISSED_SHARE`` of the collection's documents' changes: the state the recovery
compares with has every ``1 / MISSED_SHARE``-th document different (``verification.write_state``,
spread over the key range). The recovery is ``verify_replica_set`` with ``recovery`` (what the run's
``verify`` does after a loss: every document compared, the differing ones read again and landed);
the re-snapshot is ``run_snapshot`` of the collection. Bytes are those each adds to its lake (raw
files and logs); time is each one's wall time. The capture side only: the transform that follows
(a MERGE of the healed rows; a rewrite of the state and a read row per document after a copy) is
not in either figure, so the time budget, meant for the whole recovery, is missed here: the heal
reads MongoDB and the whole state (about twice a bare read), the copy MongoDB only.
"""

from __future__ import annotations

import os

from mongo_cdc_dev.bench import data
from mongo_cdc_dev.bench.context import DB, RS, Bench, best
from mongo_cdc_dev.bench.table import Row
from mongo_cdc_dev.bench.verification import write_state

MISSED_SHARE = 0.01  # of the documents, whose changes the lake missed
# issue 50 item 4: the recovery writes at most this share of the re-snapshot's bytes, in at most
# this share of its time
RECOVERY_BYTES_MAX = 0.05
RECOVERY_TIME_MAX = 0.6


def lake_bytes(lake: str) -> int:
    """The bytes of every file under ``lake``."""
    return sum(
        os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(lake) for name in names
    )


def oplog_recovery(bench: Bench) -> list[Row]:
    """The heal of the small collection, twice (each from a fresh copy of the same lake), against
    its full re-snapshot, twice; the faster of each counts."""
    collection, count = "small", bench.args.small
    bench.loaded(collection, count, data.small_documents)
    every = max(round(1 / MISSED_SHARE), 1)
    missed = len(range(0, count, every))
    heals, copies = [], []
    written = {"heal": 0, "resnapshot": 0}
    for again in range(2):
        lake = bench.lake(f"recovery-{again}")
        offsets = write_state(bench.client, DB, RS, collection, lake, every)
        before = lake_bytes(lake)
        task = dict(lake=lake, offsets=offsets, expected_drift=missed, recovery=True)
        heals.append(bench.worker("verify", collection, **task))
        written["heal"] = lake_bytes(lake) - before
        copy = bench.lake(f"recovery-resnapshot-{again}")
        copies.append(bench.worker("snapshot", collection, lake=copy))
        written["resnapshot"] = lake_bytes(copy)
    heal, copy = best(*heals), best(*copies)
    if heal.count != count or copy.count != count:
        raise AssertionError(f"the recovery read {heal.count}, the re-snapshot {copy.count} of {count}")
    section = f"lost oplog, {count:,} docs, {missed:,} missed"
    mb = {name: size / 1e6 for name, size in written.items()}
    return [
        Row(section, "full re-snapshot (run_snapshot), time", copy.seconds, "s"),
        Row(section, "heal (verify, recovery), time", heal.seconds, "s", heal.seconds / copy.seconds,
            "re-snapshot", max_ratio=RECOVERY_TIME_MAX),
        Row(section, "full re-snapshot, bytes to the lake", mb["resnapshot"], "MB"),
        Row(section, "heal, bytes to the lake", mb["heal"], "MB", mb["heal"] / mb["resnapshot"],
            "re-snapshot", max_ratio=RECOVERY_BYTES_MAX),
    ]  # fmt: skip
