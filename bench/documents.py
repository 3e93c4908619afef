"""W8: long documents embedded in chunks (issue 59), lakescore against the same chunks embedded by hand.

``documents`` seeded texts of 500-5,000 tokens (:func:`make_w8_data`: W1's review prose, a uniform token count each)
are chunked at ``max_tokens`` with ``overlap`` tokens shared and every chunk embedded with all-MiniLM-L6-v2:

1. ``lakescore``: ``lakescore score --chunk-tokens 256 --chunk-overlap 32``, whole process, Delta out, every
   guarantee on;
2. ``loop``: :mod:`bench.peers.chunk_loop`, the tokenizer's overflowing windows and one ``SentenceTransformer.encode``
   over every chunk, in one process (no Spark), a ``.npz`` out.

Wall time and the peak resident memory of each process tree (:func:`bench.proctree.run_measured`). Target: the loop's
wall time over lakescore's >= :data:`WALL_TARGET`. Run by hand: ``python -m bench.documents --documents 2000``
(``--documents 50`` for a quick look); the figures go to BENCHMARKS.md by whoever runs it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.data import _words, write_table
from bench.model import model_dir
from bench.proctree import run_measured

__all__ = ["W8", "WALL_TARGET", "make_w8_data", "main"]

W8 = "W8"
W8_SEED = 20261128
WALL_TARGET = 1.0
TOKENS_PER_WORD = 1.25
"""MiniLM's word pieces per word of the generated prose, about: the word count a document of a token count gets."""


def make_w8_data(path: Path, documents: int, low: int = 500, high: int = 5000, seed: int = W8_SEED) -> int:
    """Write ``documents`` seeded texts of ``low``-``high`` tokens (uniform) under ``path``; return the rows written."""
    rng = random.Random(seed)
    bodies = (_words(rng, int(rng.randint(low, high) / TOKENS_PER_WORD)) for _ in range(documents))
    return write_table(bodies, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.documents", description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--overlap", type=int, default=32)
    parser.add_argument("--work", type=Path, default=Path("build/bench-w8"))
    args = parser.parse_args(argv)

    shutil.rmtree(args.work, ignore_errors=True)
    source = args.work / "documents"
    make_w8_data(source, args.documents)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    runs = {}
    lakescore_dir, loop_dir = args.work / "lakescore", args.work / "loop"
    loop_dir.mkdir(parents=True)
    commands = {
        "lakescore": [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            "--input",
            str(source),
            "--output",
            str(lakescore_dir / "delta"),
            "--model",
            str(model_dir()),
            "--task",
            "embed",
            "--id-col",
            "review_id",
            "--text-col",
            "body",
            "--chunk-tokens",
            str(args.max_tokens),
            "--chunk-overlap",
            str(args.overlap),
            "--report",
            str(lakescore_dir / "report.json"),
            "--set",
            f"spark.warehouse_dir={lakescore_dir / 'warehouse'}",
            "--set",
            f"spark.metastore_dir={lakescore_dir / 'metastore_db'}",
        ],
        "loop": [
            sys.executable,
            "-m",
            "bench.peers.chunk_loop",
            "--input",
            str(source),
            "--output",
            str(loop_dir / "vectors.npz"),
            "--max-tokens",
            str(args.max_tokens),
            "--overlap",
            str(args.overlap),
            "--report",
            str(loop_dir / "report.json"),
        ],
    }
    for name, command in commands.items():
        measured = run_measured(command, env=env, cwd=Path.cwd(), log_path=args.work / f"{name}.log")
        if measured.returncode != 0:
            print(f"{name} failed ({measured.returncode}): see {args.work / f'{name}.log'}", file=sys.stderr)
            return 1
        report = json.loads(((lakescore_dir if name == "lakescore" else loop_dir) / "report.json").read_text())
        chunks = report.get("output_chunks", report.get("chunks"))
        runs[name] = {
            "wall_s": round(measured.wall_seconds, 2),
            "peak_mib": round(measured.peak_rss_bytes / 2**20),
            "chunks": chunks,
        }
    ratio = runs["loop"]["wall_s"] / runs["lakescore"]["wall_s"]
    summary = {
        "workload": W8,
        "documents": args.documents,
        **runs,
        "loop_over_lakescore": round(ratio, 2),
        "target": WALL_TARGET,
        "met": ratio >= WALL_TARGET,
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
