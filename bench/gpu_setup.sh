#!/usr/bin/env bash
# The GPU figures (bench/gpu.py, bench/gpu_generate.py) run on a machine with torch and a GPU but no JVM and no
# package index. `fetch`, here: transformers[serving]'s server stack and py4j as Python 3.12 wheels into .whl/, and
# pyspark's Python files (no jars, tests or examples) into .gpu/; both are in .gitignore, to be carried. `install`,
# there (source it): the wheels into /tmp/site, lakescore importable from /tmp/site (its package files, udfs/ jobs/
# schemas/ linked); run from /tmp/site, so the checkout's bare lakescore/ folder does not shadow it.
# PY names the interpreter that installs (default python3: the GPU machine's, with torch).
case "$1" in
fetch)
  set -e
  pins() { .venv/bin/python -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" "$@"; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
    $(pins transformers pydantic pydantic-core annotated-types typing-inspection typing-extensions fastapi starlette uvicorn \
      openai jiter sniffio httpx2 httpcore2 truststore anyio opentelemetry-api py4j annotated-doc regex idna \
      importlib-metadata zipp)
  site=$(.venv/bin/python -c "import pyspark, os; print(os.path.dirname(os.path.dirname(pyspark.__file__)))")
  rm -rf .gpu/pyspark && mkdir -p .gpu
  skip=(-not -name "*.pyc" -not -path "*/tests/*")
  for d in work examples jars pandas ml mllib testing data; do skip+=(-not -path "pyspark/$d/*"); done
  (cd "$site" && find pyspark -type f "${skip[@]}" | tar cf - -T -) | tar xf - -C .gpu
  du -sh .whl .gpu ;;
install)
  # sourced: no `set -e`, which would stay on in the caller's shell
  "${PY:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    cp -r .gpu/pyspark /tmp/site/ && mkdir -p /tmp/site/lakescore && cp lakescore/*.py /tmp/site/lakescore/ &&
    for d in udfs jobs schemas; do ln -sfn "$PWD/$d" "/tmp/site/lakescore/$d"; done &&
    export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH" ;;
*) echo "usage: bench/gpu_setup.sh fetch   |   source bench/gpu_setup.sh install" >&2; exit 2 ;;
esac
