"""W4E's plain peer: one process, no Spark, a pool of threads sending every prompt to an OpenAI-compatible server.

The prompts (``id``, ``prompt`` Parquet) go to ``<url>/completions`` as they are, ``--concurrency`` requests in flight,
greedy (``temperature`` 0), ``max_tokens`` ``--max-new-tokens``; no retries, no rate limit: what a hand-written job
does. Outputs go to Parquet (``id``, ``generated_text``, ``completion_tokens``), the timings to JSON:
``generate_seconds`` (from the first request to the last answer), ``tokens_out``, ``tokens_in`` (the server's
``usage``), ``concurrency``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pandas as pd


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.endpoint_loop")
    parser.add_argument("--input", required=True, help="Parquet file or directory with id, prompt")
    parser.add_argument("--url", required=True, help="the server's OpenAI base URL, ending /v1")
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument("--output", required=True, help="Parquet file to write (id, generated_text, completion_tokens)")
    parser.add_argument("--timings", required=True, help="JSON file to write the timings to")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)

    import httpx2

    frame = pd.read_parquet(args.input, columns=["id", "prompt"])
    client = httpx2.Client(timeout=600, limits=httpx2.Limits(max_connections=args.concurrency))

    def complete(prompt: str) -> dict:
        response = client.post(
            f"{args.url}/completions",
            json={"model": args.model, "prompt": prompt, "max_tokens": args.max_new_tokens, "temperature": 0.0},
        )
        response.raise_for_status()
        return response.json()

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        answers = list(pool.map(complete, frame["prompt"].tolist()))
    seconds = time.perf_counter() - began
    usage = [a.get("usage") or {} for a in answers]
    counts = [int(u.get("completion_tokens") or 0) for u in usage]
    pd.DataFrame(
        {"id": frame["id"], "generated_text": [a["choices"][0]["text"] for a in answers], "completion_tokens": counts}
    ).to_parquet(args.output, index=False)
    with open(args.timings, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "generate_seconds": seconds,
                "tokens_out": sum(counts),
                "tokens_in": sum(int(u.get("prompt_tokens") or 0) for u in usage),
                "concurrency": args.concurrency,
            },
            handle,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
