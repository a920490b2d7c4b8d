"""Developer tooling, never shipped to Spark's executors: ``bench`` (``make bench``) and ``testing``
(real local mongod replica sets for the tests and the demo)."""
