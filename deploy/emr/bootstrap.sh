#!/usr/bin/env bash
# EMR on EC2 bootstrap action (every node, at cluster start) for lakescore steps:
#   1. the Python that dist/lakescore-env.tar.gz links to (built with ENV_PYTHON=/usr/bin/python3.11
#      or ENV_PACK_ARGS="--python-prefix /usr"; see README.md);
#   2. the model directory at the same local path on every node, for `--model`.
# Usage: bootstrap.sh s3://bucket/models/<model-dir> [local models dir, default /mnt/lakescore/models]
set -euo pipefail
model_uri=${1:?usage: bootstrap.sh s3://bucket/models/<model-dir> [local models dir]}
models_dir=${2:-/mnt/lakescore/models}

sudo dnf install -y python3.11
sudo mkdir -p "$models_dir"
sudo aws s3 sync --only-show-errors "$model_uri" "$models_dir/$(basename "$model_uri")"
sudo chmod -R a+rX "$models_dir"
