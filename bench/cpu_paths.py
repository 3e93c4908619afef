"""The CPU paths against each other: the model's forward on W1 texts, float32 / bfloat16 / int8, whole processes.

What ``model.dtype: auto`` decides from (:mod:`lakescore.udfs.models.cpu_paths`) is measured here, on the CPU this
runs on: each path is one fresh process that tokenizes the first ``--rows`` W1 reviews, cuts them into lakescore's
batches (:func:`~lakescore.udfs.batching.plan_batches`, the CPU token budget) and runs the forward plus mean pooling
on one thread. The figure is the forward's CPU seconds (``time.process_time``), not wall time: on a shared, loaded
machine the CPU time of a single-threaded loop moves far less than its wall time. Paths alternate
(a, b, c, a, b, c, ...) ``--repeats`` times; the report is each path's median and its ratio to float32, and each
path's per-row cosine to float32 (1st percentile: the tolerance gate's figure).

Paths: ``float32`` (torch), ``bfloat16`` (torch, the model cast: what ``model.dtype: bfloat16`` runs), ``autocast``
(float32 weights under ``torch.autocast`` bfloat16, for the cast-or-autocast question), ``ort-int8`` (ONNX Runtime on
lakescore's int8 graph, :mod:`lakescore.udfs.models.quantize`), ``torch-int8`` (``torch.ao`` dynamic int8 on every
``Linear``: fbgemm, VNNI where the CPU has it). ``python -m bench.cpu_paths --cache-dir DIR`` (the ONNX graphs are
exported there once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PATHS = ("float32", "bfloat16", "autocast", "ort-int8", "torch-int8")


def _one(path: str, rows: int, budget: int, cache_dir: Path, out: Path) -> dict:
    """Run ``path`` once in this process; save its vectors to ``out`` and return its timings."""
    import torch

    from bench.data import review_bodies
    from bench.model import model_dir
    from lakescore.udfs.batching import BatchPolicy, plan_batches

    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    texts = list(review_bodies(rows))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir()))
    ids = tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    lengths = np.array([len(x) for x in ids])
    batches = plan_batches(lengths, BatchPolicy(budget, 256))
    features = []
    for rows_ in batches:
        width = int(lengths[rows_].max())
        tokens, mask = np.zeros((len(rows_), width), np.int64), np.zeros((len(rows_), width), np.int64)
        for j, r in enumerate(rows_):
            tokens[j, : len(ids[r])], mask[j, : len(ids[r])] = ids[r], 1
        batch = {"input_ids": tokens, "attention_mask": mask, "token_type_ids": np.zeros_like(tokens)}
        features.append({k: torch.from_numpy(v) for k, v in batch.items()})
    forward = _forward(path, cache_dir)
    vectors = np.zeros((rows, 384), np.float32)
    with torch.inference_mode():
        forward(features[0]), forward(features[-1])  # first calls build kernels and caches: not the steady state
        cpu, wall = time.process_time(), time.perf_counter()
        for rows_, batch in zip(batches, features):
            hidden = forward(batch).float()
            mask = batch["attention_mask"][..., None].float()
            pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
            vectors[rows_] = pooled.numpy()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    np.save(out, vectors)
    return {"path": path, "cpu_seconds": cpu, "wall_seconds": wall, "batches": len(batches)}


def _forward(path: str, cache_dir: Path):
    import torch
    from transformers import AutoModel

    from bench.model import model_dir

    if path == "ort-int8":
        from bench.peers.ort_loop import onnx_spec
        from lakescore.udfs.heads.embed import KIND
        from lakescore.udfs.heads.hf_models import load_tokenizer
        from lakescore.udfs.models.backends import onnx_session
        from lakescore.udfs.models.onnx_export import exported_model

        spec = onnx_spec("int8", cache_dir)
        graph = exported_model(spec, model_dir(), KIND, load_tokenizer(spec, model_dir()).model_input_names)
        session = onnx_session(graph, 1)
        names = [i.name for i in session.get_inputs()]
        return lambda batch: torch.from_numpy(session.run(None, {k: batch[k].numpy() for k in names})[0])
    model = AutoModel.from_pretrained(str(model_dir())).eval()
    if path == "bfloat16":
        model = model.to(torch.bfloat16)
    if path == "torch-int8":
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    if path == "autocast":

        def autocast(batch):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(**batch).last_hidden_state

        return autocast
    return lambda batch: model(**batch).last_hidden_state


def _cosines(reference: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(vectors, axis=1)
    return (reference * vectors).sum(axis=1) / norms


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.cpu_paths")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=int, default=1024, help="padded tokens per batch (lakescore's CPU default)")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--cache-dir", type=Path, required=True, help="where the ONNX graphs are exported once")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work = args.cache_dir / "cpu-paths"
    work.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(_one(args.one, args.rows, args.budget, args.cache_dir, work / f"{args.one}.npy")))
        return 0
    paths = args.paths.split(",")
    runs: dict[str, list[dict]] = {p: [] for p in paths}
    for round_ in range(args.repeats):
        for path in paths:
            command = [sys.executable, "-m", "bench.cpu_paths", "--one", path, "--rows", str(args.rows)]
            command += ["--budget", str(args.budget), "--cache-dir", str(args.cache_dir)]
            done = subprocess.run(command, capture_output=True, text=True, env=os.environ, check=True)
            runs[path].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1} {path}: {runs[path][-1]['cpu_seconds']:.2f} CPU s", flush=True)
    base = statistics.median(r["cpu_seconds"] for r in runs[paths[0]])
    reference = np.load(work / f"{paths[0]}.npy")
    print(
        f"{args.rows} W1 rows, token budget {args.budget}, 1 thread, median of {args.repeats}, load {os.getloadavg()}"
    )
    for path in paths:
        cpu = statistics.median(r["cpu_seconds"] for r in runs[path])
        cos = _cosines(reference, np.load(work / f"{path}.npy"))
        print(
            f"{path}: {args.rows / cpu:.0f} rows per CPU-second, {base / cpu:.2f}x {paths[0]}; cosine to "
            f"{paths[0]} min {cos.min():.5f}, 1st percentile {np.percentile(cos, 1):.5f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
