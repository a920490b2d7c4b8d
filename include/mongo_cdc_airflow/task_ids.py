"""The CDC DAG's task ids and XCom keys: the DAG builder names its tasks with these, and every task
that reads another task's XCom pulls it by these, so a renamed task cannot leave a reader behind."""

DISCOVER = "discover"
SNAPSHOT_START = "snapshot_start"
SHARD_SYNC = "shard_sync"  # the per-shard mapped task group
PULL = "pull"
SHARD_PULL = f"{SHARD_SYNC}.{PULL}"  # the pull's id outside its group
SNAPSHOT = "snapshot"
# the snapshot's commit, the group's task after the pull: its XCom is the shard's sync in the run
SHARD_SNAPSHOT = f"{SHARD_SYNC}.{SNAPSHOT}"
VERIFY = "verify"
SHARD_VERIFY = f"{SHARD_SYNC}.{VERIFY}"
VERIFICATION_FAILED = "verification_failed"
PLAN_TRANSFORM = "plan_transform"
TRANSFORM = "transform"

# discover: the last batch the lake had committed of each replica set when the run began
COMMITTED_KEY = "committed"
# plan_transform: the collections that may be behind the committed batches before the transform ran
PENDING_KEY = "pending"
# plan_transform: the first collection the transform has work for, in a list (empty: it starts no Spark)
WORK_KEY = "work"
# verify: what the verification found (pushed before a verify.on.drift: fail fails the task)
VERIFICATION_KEY = "verification"
# discover: each collection the filters match -> what the source does with it (``collection_kinds``)
KINDS_KEY = "kinds"
# discover: the collections the filters match that the source does not capture -> why
NOT_CAPTURED_KEY = "not_captured"
