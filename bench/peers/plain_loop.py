"""Peer (a): one process, pandas + sentence-transformers, no Spark. The practical limit.

``SentenceTransformer.encode`` sorts all texts by length before batching, so
this is the plain length-sorted loop. The vectors are saved (``ids``,
``embeddings``) because every peer stores its output, and because the
equivalence check compares lakescore's Delta output against them.
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
    args = parser.parse_args(argv)

    frame = pd.read_parquet(args.input, columns=["review_id", "body"])
    vectors = load_model().encode(frame["body"].tolist(), batch_size=BATCH_SIZE, normalize_embeddings=True)
    np.savez(args.output, ids=frame["review_id"].to_numpy(), embeddings=np.asarray(vectors, dtype=np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
