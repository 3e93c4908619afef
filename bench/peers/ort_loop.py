"""Peer (e): one process, pandas + ONNX Runtime, no Spark: peer (a) on lakescore's fast-path backend.

The same loop as (a) (all texts sorted by length, batches of 64, mean pooling, L2
normalisation: what ``SentenceTransformer.encode`` does for all-MiniLM-L6-v2) with the forward on
an ONNX Runtime session over the very graph lakescore runs (``--quantize int8``: its int8 graph),
using all cores, as (a)'s torch does. sentence-transformers' own ``backend="onnx"`` needs
optimum, which pins transformers < 5, so the loop is written out here. Vectors are saved to .npz
for the cosine check against (a).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bench.model import BATCH_SIZE, model_dir


def onnx_spec(quantize: str, cache_dir: Path):
    """lakescore's spec of the bench model on the ONNX backend (its graph, its tokenizer)."""
    from lakescore.udfs.models.model_source import ModelSpec

    return ModelSpec("embed", str(model_dir()), backend="onnx", quantize=quantize, cache_dir=str(cache_dir))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.ort_loop")
    parser.add_argument("--input", required=True, help="Parquet file or directory with review_id, body")
    parser.add_argument("--output", required=True, help=".npz to write (ids, embeddings)")
    parser.add_argument("--quantize", default="int8", choices=("none", "int8"))
    parser.add_argument(
        "--cache-dir", type=Path, required=True, help="lakescore's model.cache_dir (the exported graph)"
    )
    args = parser.parse_args(argv)

    from lakescore.udfs.heads.embed import KIND, l2_normalize, pool
    from lakescore.udfs.heads.hf_models import load_tokenizer
    from lakescore.udfs.models.backends import onnx_session
    from lakescore.udfs.models.onnx_export import exported_model

    spec = onnx_spec(args.quantize, args.cache_dir)
    tokenizer = load_tokenizer(spec, model_dir())
    session = onnx_session(exported_model(spec, model_dir(), KIND, tokenizer.model_input_names), os.cpu_count() or 1)
    names = [i.name for i in session.get_inputs()]
    frame = pd.read_parquet(args.input, columns=["review_id", "body"])
    texts = frame["body"].tolist()
    order = np.argsort([-len(t) for t in texts], kind="stable")  # as encode sorts: by characters, longest first
    vectors = np.zeros((len(texts), 384), dtype=np.float32)
    for start in range(0, len(texts), BATCH_SIZE):
        rows = order[start : start + BATCH_SIZE]
        batch = tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=256, return_tensors="np")
        tokens = session.run(None, {k: batch[k].astype(np.int64) for k in names})[0]
        vectors[rows] = l2_normalize(pool(tokens, batch["attention_mask"], ("mean",)))
    np.savez(args.output, ids=frame["review_id"].to_numpy(), embeddings=vectors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
