"""Peer (a): one process, pandas + sentence-transformers, no Spark. The practical limit.

``SentenceTransformer.encode`` sorts all texts by length before batching, so
this is the plain length-sorted loop. The vectors are saved (``ids``,
``embeddings``) because every peer stores its output, and because the
equivalence check compares lakescore's Delta output against them.

``--dtype bfloat16`` is peer (f): the same loop with the model cast to bfloat16, the like-for-like peer
of lakescore's bfloat16 runs (k).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from bench.model import BATCH_SIZE, load_model


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.plain_loop")
    parser.add_argument("--input", required=True, help="Parquet file or directory with review_id, body")
    parser.add_argument("--output", required=True, help=".npz to write (ids, embeddings)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the model's precision")
    args = parser.parse_args(argv)

    frame = pd.read_parquet(args.input, columns=["review_id", "body"])
    model = load_model()
    if args.dtype == "bfloat16":
        import torch

        model = model.to(torch.bfloat16)
    vectors = model.encode(frame["body"].tolist(), batch_size=BATCH_SIZE, normalize_embeddings=True)
    np.savez(args.output, ids=frame["review_id"].to_numpy(), embeddings=np.asarray(vectors, dtype=np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
