"""An empty PySpark job, the bench's measure of what Spark's start costs: a ``SparkContext`` and two
tasks that do nothing, submitted like the transform (``spark-submit --master local[*]``)."""

from __future__ import annotations

from pyspark import SparkContext


def main() -> None:
    context = SparkContext(appName="mongo-cdc-bench-empty-job")
    try:
        context.parallelize([0, 1], 2).count()
    finally:
        context.stop()


if __name__ == "__main__":
    main()
