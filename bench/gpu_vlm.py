"""W10-GPU (issue 60): images with prompts on a GPU, lakescore's worker against a plain batched loop.

Runs where there is CUDA and no Spark (the lent GPU machines have no JVM): lakescore's side is the function
``mapInArrow`` runs in a Python worker (:func:`lakescore.udfs.scoring_udf.score_batches` over Arrow batches of 4,096
rows, as Spark hands them) with W10's model (:func:`bench.vlm_generation.make_w10_model`) loaded on the GPU in
``--dtype``; the loop is :mod:`bench.peers.vlm_loop`'s processor + ``model.generate`` in batches of ``--batch`` on the
same device. Reading Parquet, the worker's socket and writing Delta are not in these figures (W10 measures the whole
job on CPU). Each side is timed from its first image's bytes to its last text (decode, processor, generate), after
a warm-up of 32 other rows; the loop's seconds inside ``generate`` alone are printed too. Also printed: the forward
batches lakescore plans at the device's token budget (rows and token cost each), greedy texts compared row by row
(float32 equality is expected; bfloat16 numerics change with the batch, so there equality is reported, not required).
Usage::

    bench/gpu_setup.sh fetch                                                           # here
    source bench/gpu_setup.sh install && cd /tmp/site && python3 -m bench.gpu_vlm --out /tmp/w10g.jsonl   # there
    python -m bench.gpu_vlm --device cpu --rows 24 --new-tokens 8                     # smoke, CPU
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.vlm_generation import PROMPT, W10_NEW_TOKENS, make_w10_data, make_w10_model

WARM_ROWS = 32
_OUT: Path | None = None


def emit(record: dict[str, Any]) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if _OUT is not None:
        with _OUT.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def spec_for(model: Path, new_tokens: int, device: str, dtype: str) -> Any:
    from lakescore.udfs.models.model_source import ModelSpec
    from lakescore.udfs.options.generate import GenerateOptions
    from lakescore.udfs.options.model import ModelOptions

    return ModelSpec.of(
        "generate",
        ModelOptions(source=str(model), device=device, dtype=dtype),
        (),
        input_kind="image",
        generate=GenerateOptions(max_new_tokens=new_tokens),
    )


def lakescore_worker(spec: Any, table: pa.Table, arrow_rows: int = 4096) -> dict:
    """lakescore's worker loop over ``table`` (``id``, ``image``, ``prompt``): seconds from the first batch to the last
    outcome, generated tokens, unscored rows, texts by id."""
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.scoring_udf import score_batches

    task = get_task(spec.task)
    options = task.options_of(spec)
    fields = [f.name for f in task.output_fields_for(options)]
    began = time.perf_counter()
    outcomes = list(
        score_batches(
            spec,
            ["image", "prompt"],
            table.to_batches(max_chunksize=arrow_rows),
            task.output_arrow_types_for(options),
            None,
            256,
            {"key_col": "id"},
        )
    )
    elapsed = time.perf_counter() - began
    ids = [i for batch, _ in outcomes for i in batch.column("id").to_pylist()]
    texts = [t for _, scored in outcomes for t in scored.predictions[fields.index("generated_text")].to_pylist()]
    return {
        "generate_seconds": elapsed,
        "rows": len(texts),
        "tokens_out": sum(s.tokens_out for _, s in outcomes),
        "tokens_in": sum(s.tokens_in for _, s in outcomes),
        "halvings": sum(s.halvings for _, s in outcomes),
        "unscored": sum(r is not None for _, s in outcomes for r in s.reasons),
        "texts": dict(zip(ids, texts)),
    }


def planned_batches(spec: Any, table: pa.Table) -> dict:
    """The forward batches lakescore plans for ``table`` on the spec's device: rows and token cost of each, the
    budget."""
    from lakescore.udfs.batching import plan_batches
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.scoring_udf import batch_policy, model_for_this_worker

    model, resolved, _ = model_for_this_worker(spec)
    runner = get_task(spec.task).input_kind_of(spec).runner(model.scorer, ("image", "prompt"), key_col="id")
    policy = batch_policy(model, resolved.device, None, 256)
    began = time.perf_counter()
    costs = runner.row_costs(runner.prepare(table.to_batches(max_chunksize=4096)[0]))
    prepare_seconds = time.perf_counter() - began  # decode and processor of every row, on the host
    batches = plan_batches(costs, policy)
    sizes = [len(b) for b in batches]
    tokens = [int(costs[b].sum()) for b in batches]
    return {
        "prepare_seconds": prepare_seconds,
        "budget_tokens": policy.max_tokens,
        "max_rows": policy.max_rows,
        "batches": len(batches),
        "rows_per_batch_max": max(sizes),
        "rows_per_batch_min": min(sizes),
        "tokens_per_batch_max": max(tokens),
        "within_budget": all(t <= policy.max_tokens or s == 1 for t, s in zip(tokens, sizes)),
        "row_cost_min": int(costs.min()),
        "row_cost_max": int(costs.max()),
    }


def plain_loop(model_dir: Path, frame: Any, device: str, dtype: str, new_tokens: int, batch: int) -> dict:
    """bench.peers.vlm_loop's loop on ``device``: processor, left padding, ``model.generate`` per batch of ``batch``."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.padding_side = "left"
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    eos, pad = processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id
    texts, tokens, inside = {}, 0, 0.0
    whole = time.perf_counter()
    for start in range(0, len(frame), batch):
        rows = frame.iloc[start : start + batch]
        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in rows["image"]]
        chats = [
            processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for p in rows["prompt"]
        ]
        inputs = processor(images=images, text=chats, padding=True, add_special_tokens=False, return_tensors="pt").to(
            device
        )
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(getattr(torch, dtype))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=new_tokens, pad_token_id=pad)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        inside += time.perf_counter() - began
        for key, new in zip(rows["id"], out[:, inputs["input_ids"].shape[1] :].tolist()):
            if eos in new:
                new = new[: new.index(eos) + 1]
            texts[int(key)] = processor.decode(new, skip_special_tokens=True)
            tokens += len(new)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {
        "generate_seconds": inside,
        "whole_seconds": time.perf_counter() - whole,
        "rows": len(texts),
        "tokens_out": tokens,
        "texts": texts,
    }


def main(argv: list[str] | None = None) -> int:
    global _OUT
    parser = argparse.ArgumentParser(prog="bench.gpu_vlm")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=W10_NEW_TOKENS)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batch", type=int, default=64, help="the plain loop's batch")
    parser.add_argument("--dir", default="/tmp/w10g")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    _OUT = Path(args.out) if args.out else None
    import pandas as pd
    import torch

    root = Path(args.dir)
    model = root / "model"
    if not (model / "config.json").is_file():
        make_w10_model(model)
    data = make_w10_data(root / f"images_{args.rows + WARM_ROWS}", args.rows + WARM_ROWS)
    frame = pd.read_parquet(data)
    frame["prompt"] = [PROMPT.format(category=c) for c in frame["category"]]
    warm, rows = frame.iloc[:WARM_ROWS], frame.iloc[WARM_ROWS:].reset_index(drop=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    emit(
        {
            "phase": "setup",
            "device": args.device,
            "gpu": gpu,
            "torch": torch.__version__,
            "rows": len(rows),
            "new_tokens": args.new_tokens,
            "loop_batch": args.batch,
        }
    )
    table = pa.Table.from_pandas(rows[["id", "image", "prompt"]], preserve_index=False)
    warm_table = pa.Table.from_pandas(warm[["id", "image", "prompt"]], preserve_index=False)
    for dtype in args.dtypes.split(","):
        spec = spec_for(model, args.new_tokens, args.device, dtype)
        lakescore_worker(spec, warm_table)
        emit({"phase": "plan", "dtype": dtype, **planned_batches(spec, table)})
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        ours = lakescore_worker(spec, table)
        peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
        emit(
            {
                "phase": "lakescore",
                "dtype": dtype,
                "peak_gpu_gib": peak,
                "tokens_per_s": ours["tokens_out"] / ours["generate_seconds"],
                **{k: v for k, v in ours.items() if k != "texts"},
            }
        )
        from lakescore.udfs.models.model_cache import clear

        clear()
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
        plain_loop(model, warm, args.device, dtype, args.new_tokens, args.batch)
        theirs = plain_loop(model, rows, args.device, dtype, args.new_tokens, args.batch)
        equal = sum(ours["texts"].get(k) == v for k, v in theirs["texts"].items())
        emit(
            {
                "phase": "loop",
                "dtype": dtype,
                "tokens_per_s": theirs["tokens_out"] / theirs["generate_seconds"],
                **{k: v for k, v in theirs.items() if k != "texts"},
            }
        )
        emit(
            {
                "phase": "compare",
                "dtype": dtype,
                "texts_equal": equal,
                "rows": len(theirs["texts"]),
                "ratio_decode_to_text": theirs["whole_seconds"] / ours["generate_seconds"],
                "ratio_inside_generate": (ours["tokens_out"] / ours["generate_seconds"])
                / (theirs["tokens_out"] / theirs["generate_seconds"]),
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
