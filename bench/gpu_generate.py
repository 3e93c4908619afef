"""W4-GPU (issue 48): generation through a served engine on a GPU, lakescore's worker against a plain client.

Runs on a machine with a CUDA GPU and no Spark (the lent GPU machines have no JVM): lakescore's side is the function
``mapInArrow`` runs in a Python worker (:func:`lakescore.udfs.scoring_udf.score_batches` over Arrow batches of 4,096
rows, as Spark hands them), so the engine is started by lakescore's own code as on an executor host and the rows go
through its endpoint client (concurrency, retries, dead-letter). Reading Parquet, the worker's socket and writing Delta
are not in these figures; W4E measures the whole job on CPU.

Model: a seeded 0.5B-class Llama shape (:data:`GPU_SHAPE`, W4's byte-level BPE tokenizer) saved in ``--dtype``;
W4's review prompts; greedy; ``--new-tokens`` each. Phases, each printing JSON lines (and appending them to
``--out``):

1. ``loop``: ``transformers serve MODEL --continuous-batching`` started standalone, a warm-up, then the plain client
   (:mod:`bench.peers.endpoint_loop`: a thread pool, ``--concurrency`` requests in flight) over N prompts;
2. ``served``: lakescore's worker with ``generate.server`` (engine ``transformers``, ``--continuous-batching``,
   ``concurrency`` the same), the engine started by lakescore, a warm-up, then the same N prompts;
3. ``inprocess``: lakescore's worker with the model loaded on the GPU in ``--dtype``, a warm-up, the same N prompts.

Each phase's figure is generated tokens (the server's ``usage``, the worker's ``tokens_out``) over the seconds from its
first request to its last answer, after a warm-up of 64 other prompts (and, for the loop and the served run, a probe
of 128 more). N is ``--prompts``, or fewer where the probe's rate says the loop would not end in ``--phase-seconds``;
the in-process phase stops after the Arrow batch of 256 that passes them. Target (printed, never enforced): served
>= 90% of the loop's tokens/s. Greedy texts are compared row by row (a continuous-batching server's bfloat16 numerics
change with the batch, so equality is reported, not required). Usage (``bench/gpu_setup.sh`` carries what the GPU
machine lacks)::

    bench/gpu_setup.sh fetch                                                          # here
    source bench/gpu_setup.sh install && cd /tmp/site && python3 -m bench.gpu_generate --out /tmp/w4g.jsonl   # there
    python -m bench.gpu_generate --shape w4 --device cpu --dtype float32 --prompts 24 --new-tokens 8   # smoke, CPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.endpoint_generation import serve_transformers, stop_server
from bench.generation import MODEL_SHAPE, make_w4_model, prompts

GPU_SHAPE = {
    "hidden_size": 1024,
    "intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 4096,
}
"""About 0.52 billion parameters with W4's small vocabulary: a 0.5B-class Llama shape."""
WARM_PROMPTS = 64
SERVE_ARGS = ("--continuous-batching",)
SERVED_TARGET = 0.9
_OUT: Path | None = None


def emit(record: dict[str, Any]) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if _OUT is not None:
        with open(_OUT, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def build_model(target: Path, shape: dict, dtype: str, device: str) -> dict[str, Any]:
    """:func:`~bench.generation.make_w4_model` of ``shape`` in ``dtype`` under ``target``: its parameters (from the
    saved files' headers), vocabulary and seconds."""
    from safetensors import safe_open

    began = time.perf_counter()
    make_w4_model(target, shape, dtype, device)
    if device.startswith("cuda"):  # the engine and the in-process run need the memory the build held
        import torch

        torch.cuda.empty_cache()
    parameters = 0
    for path in target.glob("*.safetensors"):
        with safe_open(path, "np") as weights:
            parameters += sum(int(np.prod(weights.get_slice(k).get_shape())) for k in weights)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    return {"parameters": parameters, "vocab": vocab, "seconds": time.perf_counter() - began}


def write_prompts(path: Path, texts: list[str]) -> Path:
    pq.write_table(
        pa.table({"id": pa.array(range(len(texts)), pa.int64()), "prompt": pa.array(texts, pa.string())}), path
    )
    return path


def plain_loop(work: Path, table: Path, url: str, model: Path, new_tokens: int, concurrency: int, name: str) -> dict:
    """:mod:`bench.peers.endpoint_loop` over ``table``: its timings, and its texts by id."""
    from bench.peers import endpoint_loop

    output, timings = work / f"{name}.parquet", work / f"{name}.json"
    endpoint_loop.main(
        [
            "--input",
            str(table),
            "--url",
            url,
            "--model",
            str(model),
            "--output",
            str(output),
            "--timings",
            str(timings),
            "--max-new-tokens",
            str(new_tokens),
            "--concurrency",
            str(concurrency),
        ]
    )
    figures = json.loads(timings.read_text())
    frame = pq.read_table(output).to_pydict()
    figures["texts"] = dict(zip(frame["id"], frame["generated_text"]))
    return figures


def lakescore_worker(spec: Any, texts: list[str], arrow_rows: int = 4096, seconds: float | None = None) -> dict:
    """lakescore's worker loop (:func:`score_batches`) over ``texts`` in Arrow batches of ``arrow_rows`` (Spark's
    default 4,096), stopping after the batch that passes ``seconds``: seconds from the first batch to the last outcome,
    rows scored, tokens in / out, unscored rows and the texts by row."""
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.scoring_udf import score_batches

    task = get_task(spec.task)
    options = task.options_of(spec)
    fields = [f.name for f in task.output_fields_for(options)]
    table = pa.table({"id": pa.array(range(len(texts)), pa.int64()), "prompt": pa.array(texts, pa.string())})
    began = time.perf_counter()
    outcomes = []
    for outcome in score_batches(
        spec, ["prompt"], table.to_batches(max_chunksize=arrow_rows), task.output_arrow_types_for(options), None, 256
    ):
        outcomes.append(outcome)
        if seconds is not None and time.perf_counter() - began > seconds:
            break
    elapsed = time.perf_counter() - began
    generated = [t for _, scored in outcomes for t in scored.predictions[fields.index("generated_text")].to_pylist()]
    return {
        "generate_seconds": elapsed,
        "rows_done": len(generated),
        "tokens_out": sum(s.tokens_out for _, s in outcomes),
        "tokens_in": sum(s.tokens_in for _, s in outcomes),
        "unscored": sum(r is not None for _, s in outcomes for r in s.reasons),
        "retries": sum(s.retries for _, s in outcomes),
        "texts": dict(enumerate(generated)),
    }


def spec_for(model: Path, new_tokens: int, device: str, dtype: str, concurrency: int | None) -> Any:
    """The worker's model spec: served by ``transformers serve`` (``concurrency`` given) or loaded in-process."""
    from lakescore.udfs.models.model_source import ModelSpec
    from lakescore.udfs.options.generate import GenerateOptions
    from lakescore.udfs.options.model import ModelOptions
    from lakescore.udfs.options.remote import ServerOptions

    server = (
        None if concurrency is None else ServerOptions(engine="transformers", args=SERVE_ARGS, concurrency=concurrency)
    )
    options = GenerateOptions(max_new_tokens=new_tokens, server=server)
    return ModelSpec.of("generate", ModelOptions(source=str(model), device=device, dtype=dtype), (), generate=options)


def rate(figures: dict) -> float:
    return figures["tokens_out"] / figures["generate_seconds"]


def agreement(ours: dict, theirs: dict) -> dict:
    matched = [i for i in theirs if i in ours]
    return {"equal": sum(ours[i] == theirs[i] for i in matched), "matched": len(matched)}


def summary(name: str, figures: dict, rows: int, **extra: Any) -> dict:
    return {
        "phase": name,
        "rows": rows,
        "tokens_per_s": round(rate(figures), 1),
        **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in figures.items() if k != "texts"},
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    global _OUT
    parser = argparse.ArgumentParser(prog="bench.gpu_generate")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lakescore-w4g"))
    parser.add_argument("--out", type=Path, help="JSON lines appended here too")
    parser.add_argument("--shape", choices=("gpu", "w4"), default="gpu", help="gpu: the 0.5B-class shape; w4: W4's")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--phase-seconds", type=float, default=100.0, help="N is cut so the loop ends in about this")
    parser.add_argument("--skip", action="append", default=[], choices=("inprocess",))
    args = parser.parse_args(argv)
    _OUT = args.out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.work.mkdir(parents=True, exist_ok=True)

    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    emit(
        {
            "phase": "env",
            "gpu": gpu,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
            "host_cpus": os.cpu_count(),
        }
    )
    model = args.work / "model"
    emit(
        {
            "phase": "model",
            "shape": args.shape,
            "dtype": args.dtype,
            **build_model(model, GPU_SHAPE if args.shape == "gpu" else MODEL_SHAPE, args.dtype, args.device),
        }
    )
    texts = prompts(args.prompts + 3 * WARM_PROMPTS)  # a warm-up, the prompts, a probe
    warm, probe_texts, texts = texts[:WARM_PROMPTS], texts[-2 * WARM_PROMPTS :], texts[WARM_PROMPTS : -2 * WARM_PROMPTS]
    warm_table = write_prompts(args.work / "warm.parquet", warm)

    # 1. the plain client against the server started standalone: a warm-up, a probe whose rate sizes N, N prompts
    server, url = serve_transformers(model, args.work / "serve.log", dict(os.environ), args=SERVE_ARGS, timeout_s=600)
    try:
        began = time.perf_counter()
        warmed = plain_loop(args.work, warm_table, url, model, args.new_tokens, args.concurrency, "loop-warm")
        emit(summary("loop_warm_up", warmed, WARM_PROMPTS, start_to_end_s=round(time.perf_counter() - began, 2)))
        probe = plain_loop(
            args.work,
            write_prompts(args.work / "probe.parquet", probe_texts),
            url,
            model,
            args.new_tokens,
            args.concurrency,
            "loop-probe",
        )  # warm: its rate sizes N
        emit(summary("loop_probe", probe, 2 * WARM_PROMPTS))
        per_prompt = probe["generate_seconds"] / (2 * WARM_PROMPTS)
        rows = min(len(texts), max(WARM_PROMPTS, int(args.phase_seconds / per_prompt) // 64 * 64))
        texts = texts[:rows]
        loop = plain_loop(
            args.work,
            write_prompts(args.work / "prompts.parquet", texts),
            url,
            model,
            args.new_tokens,
            args.concurrency,
            "loop",
        )
        emit(summary("loop", loop, rows, concurrency=args.concurrency))
    finally:
        stop_server(server)

    # 2. lakescore's worker, the engine started by lakescore
    from lakescore.udfs.remote.engine import stop_engines

    served_spec = spec_for(model, args.new_tokens, args.device, args.dtype, args.concurrency)
    try:
        began = time.perf_counter()
        warmed = lakescore_worker(served_spec, warm)
        emit(summary("served_warm_up", warmed, WARM_PROMPTS, start_to_end_s=round(time.perf_counter() - began, 2)))
        emit(
            summary("served_probe", lakescore_worker(served_spec, probe_texts), 2 * WARM_PROMPTS)
        )  # as warm as the loop
        served = lakescore_worker(served_spec, texts)
    finally:
        stopped = stop_engines()
    emit(
        summary(
            "served",
            served,
            rows,
            concurrency=args.concurrency,
            engines_stopped=stopped,
            equal_to_loop=agreement(served["texts"], loop["texts"]),
        )
    )
    ratio = rate(served) / rate(loop)
    emit({"phase": "target", "served_vs_loop": round(ratio, 3), "target": SERVED_TARGET, "met": ratio >= SERVED_TARGET})

    # 3. lakescore's in-process backend on the same device
    if "inprocess" not in args.skip:
        from lakescore.udfs.models.model_cache import clear as clear_models

        clear_models()
        in_spec = spec_for(model, args.new_tokens, args.device, args.dtype, None)
        lakescore_worker(in_spec, warm)
        # Arrow batches of 256 (its default forward batch's rows) so a slow backend stops near the phase's seconds
        inprocess = lakescore_worker(in_spec, texts, arrow_rows=256, seconds=args.phase_seconds)
        emit(
            summary(
                "inprocess",
                inprocess,
                inprocess["rows_done"],
                equal_to_loop=agreement(inprocess["texts"], loop["texts"]),
                served_vs_inprocess=round(rate(served) / rate(inprocess), 3),
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
