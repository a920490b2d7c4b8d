"""Developer tooling, never shipped to Spark's executors: ``bench`` (``make bench``), ``testing``
(real local mongod replica sets for the tests and the demo) and ``spark_cluster`` (a real Spark
standalone cluster on this machine)."""
