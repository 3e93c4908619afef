"""W8's peer: long documents chunked and embedded by hand, one process, no Spark: the practical limit.

Each document is cut into windows the usual way, the tokenizer's own overflowing windows
(``return_overflowing_tokens`` with ``stride`` tokens shared, ``max_length`` counting the special tokens), each window's
text taken by its character offsets, and every chunk of the table embedded by one ``SentenceTransformer.encode`` call
(which sorts by length and batches). The vectors are saved (``ids``, ``chunk_index``, ``embeddings``) because every
peer stores its output.
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


def chunk_spans(tokenizer, text: str, max_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """``text``'s windows of ``max_tokens`` tokens (special tokens counted), ``overlap`` shared, as character spans."""
    encoded = tokenizer(
        text,
        max_length=max_tokens,
        truncation=True,
        stride=overlap,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        add_special_tokens=True,
    )
    spans = []
    for offsets in encoded["offset_mapping"]:
        real = [(s, e) for s, e in offsets if e > s]
        spans.append((real[0][0], real[-1][1]) if real else (0, len(text)))
    return spans


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.chunk_loop")
    parser.add_argument("--input", required=True, help="Parquet file or directory with review_id, body")
    parser.add_argument("--output", required=True, help=".npz to write (ids, chunk_index, embeddings)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--overlap", type=int, default=32)
    parser.add_argument("--report", help="JSON file to write the loop's timings and chunk count to")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    frame = pd.read_parquet(args.input, columns=["review_id", "body"])
    model = load_model()
    ids, index, chunks = [], [], []
    chunked = time.perf_counter()
    for review_id, text in zip(frame.review_id, frame.body):
        for k, (start, end) in enumerate(chunk_spans(model.tokenizer, text, args.max_tokens, args.overlap)):
            ids.append(review_id), index.append(k), chunks.append(text[start:end])
    encoding = time.perf_counter()
    vectors = model.encode(chunks, batch_size=BATCH_SIZE, normalize_embeddings=True, convert_to_numpy=True)
    encoded = time.perf_counter()
    np.savez(args.output, ids=np.asarray(ids), chunk_index=np.asarray(index), embeddings=vectors)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "chunks": len(chunks),
                    "seconds": time.perf_counter() - started,
                    "step_seconds": {"chunk": encoding - chunked, "score_stage": encoded - encoding},
                },
                out,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
