PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
VENV_LOG := .local/venv-build.log
PYSPARK_VERSION := 4.3.0
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv pip install --python $(VENV)/bin/python --compile-bytecode
PYTEST_ARGS ?=
# make bench's options (python -m mongo_cdc_dev.bench --help), e.g. BENCH_ARGS="--only state-scale"
BENCH_ARGS ?=
# make test's pytest processes (pytest-xdist): each test file runs whole in one of them, the files in
# collection order (tests/conftest.py puts the slowest tiers first; xdist would put the files of
# most tests first, the unit tier)
TEST_WORKERS ?= 2

# Prerequisites build two at a time: on a fresh clone apt's chromium install (~50 s) overlaps the
# venv's build instead of following it.
MAKEFLAGS += --jobs=2

# spark-submit finds SPARK_HOME through the venv's bin, and the demo/tests spawn it.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: .venv test test-unit demo bench docs lint clean soak bytecode

.venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@mkdir -p .local
	@echo "== building $(VENV) from the pinned requirements (the installers' output: $(VENV_LOG))"
	@# uv installs the pins: it downloads and unpacks in parallel, about a minute faster than pip
	@# here. --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set (as on this project's machines)
	@# nothing else would write the packages' bytecode, and every process would compile them again.
	@# pyspark-client (required by the Spark provider) overwrites files of the full pyspark
	@# distribution and leaves spark-submit broken; installing pyspark again on top restores them
	@# (uninstalled first: uv's --reinstall-package would download its 450 MB again).
	@( set -e; \
	  $(PYTHON) -m venv $(VENV); \
	  $(VENV)/bin/pip install uv==$(UV_VERSION); \
	  $(UV) -r requirements-dev.txt; \
	  $(VENV)/bin/uv pip uninstall --python $(VENV)/bin/python pyspark; \
	  $(UV) --no-deps pyspark==$(PYSPARK_VERSION); \
	  $(UV) --no-deps -e . ) > $(VENV_LOG) 2>&1 || { \
		tail -n 40 $(VENV_LOG); \
		echo "ERROR: building $(VENV) failed (the whole log: $(VENV_LOG)); try: rm -rf $(VENV) && make .venv" >&2; \
		exit 1; }
	@# Without Java only the unit tier runs (make test-unit), so a venv for it needs no Java either.
	@if [ -z "$$JAVA_HOME" ] && ! command -v java >/dev/null 2>&1; then \
		echo "== no Java on PATH nor JAVA_HOME: spark-submit not checked; make test-unit runs, make test needs Java 17"; \
	else \
		out="$$($(VENV)/bin/spark-submit --version 2>&1)"; \
		if ! printf '%s\n' "$$out" | grep -q 'version $(PYSPARK_VERSION)'; then \
			printf '%s\n' "$$out" | tail -n 20; \
			echo "ERROR: '$(VENV)/bin/spark-submit --version' does not report Spark $(PYSPARK_VERSION)." >&2; \
			echo "       Needs Java 17 on PATH (or JAVA_HOME) and an intact pyspark==$(PYSPARK_VERSION)." >&2; \
			echo "       Try: rm -rf $(VENV) && make .venv" >&2; \
			exit 1; \
		fi; \
	fi
	touch $@

# The browser test drives Debian's chromium through Playwright (no browser download exists here):
# installed with apt when missing (as root, or through sudo), quietly.
CHROMIUM := /usr/bin/chromium
CHROMIUM_LOG := .local/chromium-install.log

$(CHROMIUM):
	@mkdir -p .local
	@echo "== installing Debian's chromium for the browser test (apt's output: $(CHROMIUM_LOG))"
	@sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	( $$sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q chromium ) \
		> $(CHROMIUM_LOG) 2>&1 || { \
		tail -n 20 $(CHROMIUM_LOG); \
		echo "ERROR: installing chromium failed (the whole log: $(CHROMIUM_LOG)); try: sudo apt-get install chromium" >&2; \
		exit 1; }

# The alerting rules' tests (tests/system/test_alert_rules.py) run Prometheus's promtool, from Debian's
# prometheus package: downloaded with apt (its lists refreshed as root, or through sudo) and unpacked
# under .local, quietly, as chromium is installed. Unpacked, not installed: installing the package
# would start a Prometheus service on the machine. promtool is one static binary.
PROMTOOL := .local/prometheus/usr/bin/promtool
PROMTOOL_LOG := .local/promtool-install.log

$(PROMTOOL):
	@mkdir -p .local/prometheus
	@echo "== fetching Debian's prometheus package for promtool, the alert rules' tests (apt's output: $(PROMTOOL_LOG))"
	@sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	( set -e; $$sudo apt-get update -q; cd .local/prometheus; rm -f prometheus_*.deb; \
	  apt-get download -q prometheus; dpkg-deb -x prometheus_*.deb .; rm -f prometheus_*.deb ) \
		> $(PROMTOOL_LOG) 2>&1 || { \
		tail -n 20 $(PROMTOOL_LOG); \
		echo "ERROR: fetching promtool failed (the whole log: $(PROMTOOL_LOG)); try: sudo apt-get update && make $(PROMTOOL)" >&2; \
		exit 1; }

# Java's class-data archive of a local Spark driver's classes (mongo_cdc_airflow.local_env maps it
# into the tests' and the demo's spark-submit runs): made once per venv by a tiny job; a failure
# only leaves those runs slower, so it warns and goes on.
SPARK_CLASSES := .local/spark-classes.jsa
SPARK_CLASSES_LOG := .local/spark-classes.log
# Java maps the archive only while every jar it was made from is unchanged (size and mtime): a jar
# written again (pyspark reinstalled by hand, say) makes it stale, and Spark silently starts slower.
SPARK_JARS := $(wildcard $(VENV)/lib/python3*/site-packages/pyspark/jars/*.jar)

$(SPARK_CLASSES): $(STAMP) $(SPARK_JARS)
	@if [ -z "$$JAVA_HOME" ] && ! command -v java >/dev/null 2>&1; then exit 0; fi; \
	rm -f $@; \
	SPARK_SUBMIT_OPTS=-XX:ArchiveClassesAtExit=$@ $(VENV)/bin/spark-submit --master 'local[2]' \
		include/mongo_cdc_dev/spark_classes_job.py > $(SPARK_CLASSES_LOG) 2>&1 \
		|| echo "== WARNING: no Spark class archive (see $(SPARK_CLASSES_LOG)): local Spark runs start slower"

# Bytecode beside the sources in Spark's Python zips, which spark-submit's drivers and Spark's Python
# workers import pyspark from (mongo_cdc_dev/pyspark_bytecode.py): each compiled them again.
PYSPARK_BYTECODE := $(VENV)/.pyspark-bytecode

$(PYSPARK_BYTECODE): $(STAMP)
	$(VENV)/bin/python include/mongo_cdc_dev/pyspark_bytecode.py
	touch $@

# The project's own bytecode, brought up to date before each run (compileall rewrites only what
# changed): this environment sets PYTHONDONTWRITEBYTECODE, so without it every Python process of a
# run (each Spark driver and worker, each task) compiled the modules it imports again.
bytecode: $(STAMP)
	@$(VENV)/bin/python -m compileall -q include dags plugins > /dev/null

# MAKEFLAGS emptied: the demo's test runs `make demo`, which would find this make's jobserver in
# its environment without the pipe it names and warn "jobserver unavailable".
test: $(STAMP) $(PYSPARK_BYTECODE) $(CHROMIUM) $(PROMTOOL) $(SPARK_CLASSES) bytecode
	MAKEFLAGS= $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The unit tier alone (tests/unit): no mongod, no Java, no Airflow metadata DB; well under 2 minutes.
test-unit: $(STAMP) $(PYSPARK_BYTECODE)
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

demo: $(STAMP) $(PYSPARK_BYTECODE) $(SPARK_CLASSES) bytecode
	$(VENV)/bin/python -m mongo_cdc_airflow.demo

bench: $(STAMP) $(PYSPARK_BYTECODE) bytecode
	$(VENV)/bin/python -m mongo_cdc_dev.bench $(BENCH_ARGS)

# The configuration reference page, rendered from the key declarations (mongo_cdc.config.reference).
docs: $(STAMP)
	@mkdir -p docs
	$(VENV)/bin/python -m mongo_cdc.config.reference > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf .local .pytest_cache .ruff_cache spark-warehouse metastore_db derby.log
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

# Model-based tests with fresh random sequences until SOAK_MINUTES are up; a failure prints the
# minimal failing sequence as a ready test (docs/development.md, "Model-based tests and make soak").
SOAK_MINUTES ?= 30
soak: $(STAMP) $(PYSPARK_BYTECODE) bytecode
	MODEL_SOAK_MINUTES=$(SOAK_MINUTES) $(VENV)/bin/pytest tests/e2e/test_model_based.py -k test_soak -x
