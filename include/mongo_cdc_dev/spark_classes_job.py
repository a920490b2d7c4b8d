"""A tiny PySpark job run once by ``make`` with ``-XX:ArchiveClassesAtExit``: the classes a local
driver JVM loads to start a SparkContext and run Python tasks, written to Java's class-data archive
(``local_env.SPARK_CLASS_ARCHIVE``), which every later local ``spark-submit`` maps instead of loading
the same ~7,800 classes from Spark's jars again."""

from __future__ import annotations

from pyspark import SparkConf, SparkContext

if __name__ == "__main__":
    context = SparkContext.getOrCreate(
        SparkConf().setAppName("mongo-cdc-class-archive").set("spark.ui.enabled", "false")
    )
    # a shuffle and a collect, as the transform's jobs do
    context.parallelize(range(100), 2).map(lambda n: (n % 3, n)).reduceByKey(lambda a, b: a + b).collect()
    context.stop()
