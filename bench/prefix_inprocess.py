"""W11P: in-process generation of rows that share a prefix (issue 68, item 4): the prefix computed once per batch
(``generate.share_prefix_tokens``, on by default) against every prompt computed whole (``share_prefix_tokens: 0``).

W11's rows (:func:`bench.prefix_generation.make_w11_data`: documents of 300-400 tokens, ten questions each, the
document first, rows shuffled) through W4's model (:func:`bench.generation.make_w4_model`, float32) loaded once by
the task registry, scored by the generate head's :func:`~lakescore.udfs.heads.generate.score_prompts` (the worker's
batching: the CPU token budget, rows in one Arrow batch) on one torch thread, as a Spark task with one CPU runs it.
Both paths alternate in one process, ``--repeats`` times for each ``--new-tokens``; the figure is the process's CPU
seconds per call (``time.process_time``, steadier than wall time on a shared host), median per path. Greedy token
ids are compared row by row. No Spark: the scoring stage's own work is what changes.

Run: ``python -m bench.prefix_inprocess --docs 4 --repeats 3 --new-tokens 8 32 [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from bench.generation import make_w4_model
from bench.prefix_generation import make_w11_data

W11P = "W11P"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    from lakescore.udfs.batching import BatchPolicy
    from lakescore.udfs.heads.generate import GenerateOptions, score_prompts, token_traffic
    from lakescore.udfs.models.model_source import ModelSpec
    from lakescore.udfs.registry import get_task

    torch.set_num_threads(1)
    out = args.out or Path(tempfile.mkdtemp(prefix="w11p-"))
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "w4-model"
    if not (model_dir / "config.json").exists():
        make_w4_model(model_dir)
    table, _, tokens = make_w11_data(out / "data", model_dir, args.docs, args.questions)
    prompts = pq.read_table(table).column("prompt").to_pylist()
    print(f"{W11P}: {len(prompts)} rows ({args.docs} documents x {args.questions} questions), {tokens} prompt tokens")
    results = []
    for new_tokens in args.new_tokens:
        heads = {
            name: get_task("generate").load(
                ModelSpec(
                    "generate",
                    str(model_dir),
                    generate=GenerateOptions(max_new_tokens=new_tokens, share_prefix_tokens=least),
                ),
                model_dir,
            )
            for name, least in (("shared", 32), ("whole", 0))
        }
        policy = BatchPolicy(heads["whole"].default_max_tokens("cpu"), 256)
        seconds: dict[str, list[float]] = {name: [] for name in heads}
        ids: dict[str, list] = {}
        skipped = 0
        for repeat in range(args.repeats):
            for name in ("shared", "whole") if repeat % 2 == 0 else ("whole", "shared"):
                started = time.process_time()
                scored = score_prompts(prompts, heads[name], policy)
                seconds[name].append(time.process_time() - started)
                assert scored.ok.all(), [e for e in scored.errors if e][:3]
                ids[name] = [o.token_ids for o in scored.outputs]
                if name == "shared":
                    skipped = token_traffic(scored.outputs, scored.ok).tokens_in_cached
        same = sum(a == b for a, b in zip(ids["shared"], ids["whole"]))
        shared, whole = statistics.median(seconds["shared"]), statistics.median(seconds["whole"])
        result = {
            "new_tokens": new_tokens,
            "rows": len(prompts),
            "prompt_tokens": tokens,
            "skipped_tokens": skipped,
            "cpu_seconds": seconds,
            "median_shared": shared,
            "median_whole": whole,
            "speedup": whole / shared,
            "same_ids": same,
        }
        results.append(result)
        print(
            f"{W11P} {new_tokens} new tokens: shared prefix {shared:.1f} CPU s, whole prompts {whole:.1f} CPU s "
            f"(medians of {args.repeats}): {whole / shared:.2f}x; {skipped} of {tokens} prompt tokens skipped; "
            f"token ids equal {same} of {len(prompts)}"
        )
    (out / "w11p.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
