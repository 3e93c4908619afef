"""Peer (a): one process, pandas + sentence-transformers, no Spark. The practical limit.

``SentenceTransformer.encode`` sorts all texts by length before batching, so
this is the plain length-sorted loop. The vectors are saved (``ids``,
``embeddings``) because every peer stores its output, and because the
equivalence check compares lakescore's Delta output against them.

``--dtype bfloat16`` is peer (f): the same loop with the model cast to bfloat16, the like-for-like peer
of lakescore's bfloat16 runs (k).

``--report`` writes the loop's own clock as JSON, under the keys of lakescore's report so the bench reads both
alike: ``step_seconds.score_stage`` (inside ``encode``: tokenizing, forward, pooling), ``step_seconds.load`` (the
table and the model), ``step_seconds.save`` and ``seconds`` (all of ``main``); the process's wall time less
``score_stage`` is the loop's fixed cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from bench.model import BATCH_SIZE, load_model


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.plain_loop")
    parser.add_argument("--input", required=True, help="Parquet file or directory with review_id, body")
    parser.add_argument("--output", required=True, help=".npz to write (ids, embeddings)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the model's precision")
    parser.add_argument("--report", help="JSON file to write the loop's timings to")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    frame = pd.read_parquet(args.input, columns=["review_id", "body"])
    model = load_model()
    if args.dtype == "bfloat16":
        import torch

        model = model.to(torch.bfloat16)
    loaded = time.perf_counter()
    vectors = model.encode(frame["body"].tolist(), batch_size=BATCH_SIZE, normalize_embeddings=True)
    encoded = time.perf_counter()
    np.savez(args.output, ids=frame["review_id"].to_numpy(), embeddings=np.asarray(vectors, dtype=np.float32))
    if args.report:
        done = time.perf_counter()
        steps = {"load": loaded - started, "score_stage": encoded - loaded, "save": done - encoded}
        with open(args.report, "w", encoding="utf-8") as handle:
            json.dump({"step_seconds": steps, "seconds": done - started, "rows": len(frame)}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
