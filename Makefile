# lakescore developer commands. README.md explains each one.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LAKESCORE := $(VENV)/bin/lakescore

.PHONY: setup test test-unit test-integration demo clean

# Fetch the S3A connector for s3a:// paths too (~620 MiB, once; make test uses it). S3A=0 skips it:
# sessions that need it then resolve it from Maven at start-up.
S3A ?= 1

# Create .venv, install the pinned stack (constraints.txt) and fetch the Delta (and S3A) jars once.
setup:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[spark,dev]'
	$(LAKESCORE) fetch-jars $(if $(filter 1,$(S3A)),--s3a)

test:
	$(PY) -m pytest tests

test-unit:
	$(PY) -m pytest tests/unit

test-integration:
	$(PY) -m pytest tests/integration

# Score a generated review table with the bundled all-MiniLM-L6-v2 into the local metastore.
demo:
	$(LAKESCORE) demo --conf conf/local.yaml

clean:
	rm -rf .lakescore spark-warehouse metastore_db derby.log .pytest_cache

# Benchmark lakescore against a plain loop, a naive pandas UDF and predict_batch_udf; writes BENCHMARKS.md.
# Knobs (env or make variables): ROWS NAIVE_ROWS W2_ROWS REPEATS W2_REPEATS PEERS WORKLOADS BENCH_MD,
# e.g. a smoke run: make bench REPEATS=1 W2_REPEATS=1 ROWS=2000 NAIVE_ROWS=500 W2_ROWS=1000 BENCH_MD=-
.PHONY: bench
bench:
	$(PY) -m bench
