# lakescore developer commands. README.md explains each one.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LAKESCORE := $(VENV)/bin/lakescore

.PHONY: setup test test-unit test-integration demo clean

# Create .venv, install the pinned stack (constraints.txt) and fetch the Delta jars once.
setup:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[spark,dev]'
	$(LAKESCORE) fetch-jars

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
