# Two commands for a newcomer: `make demo` (the main job) and `make test` (the tests).
# Both are self-contained on a fresh machine with Python 3.11+, Java 17 and Maven.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TXN := $(VENV)/bin/txnstream
STAMP := $(VENV)/.installed
BOOTSTRAP ?= $(or $(TXNSTREAM_BOOTSTRAP),127.0.0.1:9092)
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: demo test chaos-test compose-test venv bench chaos lint clean

venv: $(STAMP)

# pip's and the build backend's output goes to .venv/install.log, shown if the install fails.
$(STAMP): pyproject.toml setup.py txnstream/_native.c txnstream/_native_send.c
	@echo "installing txnstream and its dependencies into $(VENV) (log: $(VENV)/install.log)"
	$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --upgrade pip > $(VENV)/install.log 2>&1 || \
		{ cat $(VENV)/install.log; exit 1; }
	@$(PY) -m pip install -e '.[spark,test,dev]' >> $(VENV)/install.log 2>&1 || \
		{ cat $(VENV)/install.log; exit 1; }
	@# Spark's Python workers import pyspark from a zip, compiling it at every start:
	@# bytecode in the zip halves that (spark/precompile.py, docs/spark.md)
	$(PY) -m txnstream_spark.precompile
	touch $(STAMP)

# Start a local broker unless one answers, create the topics, run the demo round trip,
# then the Spark example: committed-only read -> windowed count -> exactly-once write.
demo: $(STAMP)
	@$(PY) -m txnstream.demo.ensure_broker $(BOOTSTRAP)
	$(TXN) --bootstrap $(BOOTSTRAP) init
	$(TXN) --bootstrap $(BOOTSTRAP) demo
	$(PY) -m txnstream_spark.example_pipeline --bootstrap $(BOOTSTRAP) --input txnstream-demo \
		--output txnstream-demo-windows --checkpoint .txnstream/ckpt-demo-windows \
		--mode windowed --window "500 milliseconds" --watermark "0 seconds" --with-worker --check

# The test session starts (and stops) its own broker unless TXNSTREAM_BOOTSTRAP is set.
# TEST_WORKERS pytest-xdist workers sharing one broker, which the run starts, and one
# Spark session, on the worker that runs the Spark tests (tests/conftest.py orders the
# run). Most tests wait on timeouts and processes rather than compute, so 4 fit 2 cores.
# TEST_WORKERS=0 runs the suite in this one process. Tests marked `alone` need the machine
# to themselves (a latency bound, killed Spark drivers): they run after, by themselves.
TEST_WORKERS ?= 4
test: $(STAMP)
	tools/fetch-prometheus
	tools/fetch-postgres
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "not chaos and not alone" -n $(TEST_WORKERS) \
		--dist loadgroup --durations=25 tests
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "alone and not chaos" tests

# The nemesis harness's hostile profile, short length, as a test (asserts 0 anomalies and
# that every intruder was refused); CI runs it after `make test`.
chaos-test: $(STAMP)
	tools/fetch-prometheus
	tools/fetch-postgres
	$(VENV)/bin/pytest -q -p no:cacheprovider -m chaos tests/fault/test_chaos.py

# The compose stack for real, on stand-ins for the public images (docs/compose.md):
# a Docker engine (installed and started if none answers), images, `docker compose up`,
# the demo's and the pipeline's checks, Prometheus, a worker killed, `down -v`. Root.
compose-test:
	tools/compose-test

BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	@$(PY) -m pip install -e '.[spark,test,dev,bench]' >> $(VENV)/install.log 2>&1 || \
		{ cat $(VENV)/install.log; exit 1; }
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench

# The nemesis harness (3-4 min): its own 3-broker cluster, faults at random, intruders on
# the line, then the checks (docs/chaos.md). CHAOS_PROFILE=short leaves the intruders out.
# Soak: $(PY) -m chaos --profile hostile-soak --minutes 30
CHAOS_PROFILE ?= hostile
chaos: $(STAMP)
	tools/fetch-postgres
	$(PY) -m chaos --profile $(CHAOS_PROFILE)

lint: $(STAMP)
	$(VENV)/bin/ruff check txnstream spark bench chaos tests
	$(VENV)/bin/mypy

clean:
	-$(TXN) cluster down
	rm -rf $(VENV) .txnstream build *.egg-info
