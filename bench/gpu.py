"""GPU figures (issue 13, item 5): lakescore's scoring stage against the bare forward pass over the same batches.

Runs on a machine with a CUDA GPU and no Spark: the stage measured is the function ``mapInArrow`` runs in a
worker (:func:`lakescore.udfs.scoring_udf.score_batches` plus the output record batches), fed the Arrow batches
Spark would hand it (``scoring.arrow_max_records_per_batch`` rows each, W1's texts). The JVM's side of the
stage (reading Parquet, moving Arrow batches through the worker's socket, writing Delta) is not in these figures.

For each model and dtype it prints, as JSON lines:

* ``stage``: rows/s of the worker's loop, model loaded (one warm-up batch first), GPU synchronized at the end;
* ``bare``: rows/s of the model's forward alone over the same batches (the same plan, :func:`plan_batches`):
  inputs already on the GPU, mean pooling and normalization on the GPU, nothing copied back;
* ``parts``: the same work done step by step, each step timed alone: Arrow -> Python strings, tokenizing,
  lakescore's forward (inputs to the GPU, forward, token states back, pooling), output Arrow arrays;
* ``cosine``: per-row cosine of float16 / bfloat16 outputs to float32 (1st percentile, minimum).

``--null-forward`` needs no GPU: the same stage on the CPU with the model's forward replaced by one that returns
zeros at once, one CPU (one torch thread, the tokenizer's pool bounded to one thread, as a one-CPU Spark task runs):
the host pipeline's ceiling in rows/s per core (decoding, tokenizing, planning batches, output Arrow arrays). A
GPU stage cannot run faster per host core than this.

``--oom`` runs an oversized token budget on a BERT-large-shaped seeded model and records the back-off:
halvings, seconds, and the outputs against a run at the default budget.

Nothing here asserts; the figures go to BENCHMARKS.md by hand, with the device named. Usage, on a machine with
torch, transformers, pyarrow and the pyspark Python package (no JVM needed) and ``lakescore`` importable::

    python -m bench.gpu --minilm DIR [--rows 30000] [--oom-rows 16384]
    python -m bench.gpu --minilm DIR --null-forward     # any machine: the host pipeline's ceiling per core
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.data import review_bodies
from lakescore.udfs.heads.embed import SentenceEmbedder

ID, TEXT = "review_id", "body"


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def _arrow_batches(texts: list[str], rows_per_batch: int) -> list[pa.RecordBatch]:
    ids = pa.array(np.arange(len(texts), dtype=np.int64))
    table = pa.table({ID: ids, TEXT: pa.array(texts, type=pa.string())})
    return table.to_batches(max_chunksize=rows_per_batch)


DEVICE = "cuda"


def _sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _vectors(outcomes) -> np.ndarray:
    """The embeddings of a list of ScoredBatch, stacked (every row scored)."""
    rows = [row for outcome in outcomes for row in outcome.predictions[0].to_pylist()]
    width = max((len(row) for row in rows if row is not None), default=1)
    return np.array([row if row is not None else [np.nan] * width for row in rows], dtype=np.float32)


def run_stage(
    spec, batches: list[pa.RecordBatch], max_tokens: int | None, max_rows: int, warm_up: bool = True
) -> tuple[float, list]:
    """Seconds of the worker's loop over ``batches`` (the model loaded first; ``warm_up``: one batch run first),
    and its outcomes."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import LongType, StructField

    from lakescore.schemas.output import scored_schema
    from lakescore.udfs.models.model_cache import get_model
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.scoring_udf import score_batches

    schema = to_arrow_schema(scored_schema(spec.task, StructField(ID, LongType())))
    types = get_task(spec.task).output_arrow_types
    get_model(spec)
    for _batch, _scored in score_batches(spec, [TEXT], batches[:1] if warm_up else [], types, max_tokens, max_rows):
        pass
    _sync()
    started = time.perf_counter()
    outcomes = []
    for batch, scored in score_batches(spec, [TEXT], batches, types, max_tokens, max_rows):
        scored.record_batch([batch.column(ID)], schema)
        outcomes.append(scored)
    _sync()
    return time.perf_counter() - started, outcomes


def run_stage_twice(
    spec, batches: list[pa.RecordBatch], max_tokens: int | None, max_rows: int
) -> tuple[float, float, list]:
    """The stage's seconds on its first pass (each batch shape new to the GPU's kernels) and on a second pass."""
    first, _ = run_stage(spec, batches, max_tokens, max_rows)
    second, outcomes = run_stage(spec, batches, max_tokens, max_rows, warm_up=False)
    return first, second, outcomes


def run_parts(
    spec, batches: list[pa.RecordBatch], max_tokens: int, max_rows: int, with_transformers: bool
) -> dict[str, float]:
    """The stage's steps one after another, each timed alone (seconds over all batches): Arrow -> Python strings,
    tokenizing, the head's forward over the planned batches (inputs to the GPU, forward, pooling, vectors back,
    normalizing), output Arrow arrays; with ``with_transformers``, also tokenizing through transformers' own call."""
    from lakescore.udfs.batching import BatchPolicy, score_texts
    from lakescore.udfs.models.model_cache import get_model
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.scoring_udf import ScoredBatch, _prediction_arrays

    model, _ = get_model(spec)
    head = model.scorer
    policy = BatchPolicy(max_tokens, max_rows)
    parts = {"decode": 0.0, "tokenize": 0.0, "head_forward": 0.0, "output_arrow": 0.0}
    types = get_task(spec.task).output_arrow_types
    for batch in batches:
        t = time.perf_counter()
        texts = batch.column(TEXT).to_pylist()
        parts["decode"] += time.perf_counter() - t
        if with_transformers:
            t = time.perf_counter()
            head._encode._tokenizer(
                texts, padding=True, truncation="longest_first", max_length=head.max_seq_length, return_tensors="np"
            )
            parts["tokenize_through_transformers"] = (
                parts.get("tokenize_through_transformers", 0.0) + time.perf_counter() - t
            )
        t = time.perf_counter()
        features = head.tokenize(texts)
        parts["tokenize"] += time.perf_counter() - t
        t = time.perf_counter()
        scored = score_texts(texts, head, policy, features)
        parts["head_forward"] += time.perf_counter() - t
        t = time.perf_counter()
        ScoredBatch(
            _prediction_arrays(model, scored, types), model.sha256, scored.reasons, scored.errors, [None] * len(texts)
        )
        parts["output_arrow"] += time.perf_counter() - t
    return parts


def run_bare(spec, batches: list[pa.RecordBatch], max_tokens: int, max_rows: int) -> float:
    """Seconds of the plain transformers forward over the stage's own batches: inputs on the GPU beforehand,
    mean pooling and normalization on the GPU, nothing copied back."""
    import torch
    import transformers

    from lakescore.udfs.batching import BatchPolicy, plan_batches, take_rows
    from lakescore.udfs.models.devices import torch_dtype
    from lakescore.udfs.models.model_cache import get_model

    head = get_model(spec)[0].scorer
    directory = Path(spec.source)
    model = transformers.AutoModel.from_pretrained(str(directory), dtype=torch_dtype(spec.dtype)).to(DEVICE).eval()
    policy = BatchPolicy(max_tokens, max_rows)
    planned = []
    for batch in batches:
        features = head.tokenize(batch.column(TEXT).to_pylist())
        lengths = np.asarray(features["attention_mask"].sum(1), dtype=np.int64)
        for rows in plan_batches(lengths, policy):
            chunk = take_rows(features, rows, int(lengths[rows].max()), head.padding_side)
            planned.append({k: torch.as_tensor(v).to(DEVICE) for k, v in chunk.items()})

    def forward(inputs):
        states = model(**inputs).last_hidden_state  # noqa: F821 (called before the `del model` below)
        mask = inputs["attention_mask"].unsqueeze(-1).to(states.dtype)
        vectors = (states * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.nn.functional.normalize(vectors.float(), dim=1)

    with torch.inference_mode():
        for inputs in planned[:3]:
            forward(inputs)
        _sync()
        started = time.perf_counter()
        for inputs in planned:
            forward(inputs)
        _sync()
        seconds = time.perf_counter() - started
    del model
    torch.cuda.empty_cache()
    return seconds


def measure(
    model_dir: Path,
    label: str,
    texts: list[str],
    dtypes: list[str],
    max_rows_options: list[int],
    rows_per_batch: int,
    pooling: str | None,
) -> None:
    import torch

    from lakescore.udfs.batching import default_max_tokens
    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.model_source import ModelSpec

    batches = _arrow_batches(texts, rows_per_batch)
    reference: np.ndarray | None = None
    max_tokens = default_max_tokens("cuda")
    for dtype in dtypes:
        spec = ModelSpec(task="embed", source=str(model_dir), device=DEVICE, dtype=dtype, pooling=pooling)
        for max_rows in max_rows_options:
            torch.cuda.reset_peak_memory_stats()
            first, seconds, outcomes = run_stage_twice(spec, batches, max_tokens, max_rows)
            vectors = _vectors(outcomes)
            if dtype == "float32" and reference is None:
                reference = vectors
            bare = run_bare(spec, batches, max_tokens, max_rows)
            parts = run_parts(spec, batches, max_tokens, max_rows, with_transformers=reference is vectors)
            record = {
                "model": label,
                "dtype": dtype,
                "rows": len(texts),
                "max_batch_tokens": max_tokens,
                "max_batch_rows": max_rows,
                "stage_rows_per_s": len(texts) / seconds,
                "bare_rows_per_s": len(texts) / bare,
                "stage_over_bare": bare / seconds,
                "stage_s": seconds,
                "bare_s": bare,
                "stage_first_pass_s": first,
                "parts_s": parts,
                "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20,
            }
            if reference is not None and dtype != "float32":
                record["vs_float32"] = SentenceEmbedder.fidelity(reference, vectors)
            _emit(record)
        model_cache.clear()
        torch.cuda.empty_cache()


def host_ceiling(model_dir: Path, label: str, texts: list[str], rows_per_batch: int, pooling: str | None) -> None:
    """The stage on one CPU with a forward that returns zeros at once: rows/s per core of everything but the model."""
    import torch

    from lakescore.udfs.batching import default_max_tokens
    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.model_source import ModelSpec

    global DEVICE
    DEVICE = "cpu"
    torch.set_num_threads(1)
    batches = _arrow_batches(texts, rows_per_batch)
    spec = ModelSpec(task="embed", source=str(model_dir), device="cpu", pooling=pooling)
    model, _ = model_cache.get_model(spec)
    width = model.scorer.score(["a"]).shape[1]
    model.scorer._forward = lambda features, reduce=None: np.zeros((len(features["input_ids"]), width), np.float32)
    max_tokens = default_max_tokens("cuda")  # the batches a GPU stage plans
    for max_rows in (256, 4096):
        seconds, outcomes = run_stage(spec, batches, max_tokens, max_rows)
        parts = run_parts(spec, batches, max_tokens, max_rows, with_transformers=False)
        _emit(
            {
                "model": label,
                "null_forward": True,
                "rows": len(texts),
                "max_batch_tokens": max_tokens,
                "max_batch_rows": max_rows,
                "host_rows_per_s_per_core": len(texts) / seconds,
                "stage_s": seconds,
                "parts_s": parts,
                "unscored": sum(r is not None for o in outcomes for r in o.reasons),
            }
        )
    model_cache.clear()


def oom_backoff(model_dir: Path, texts: list[str], rows: int) -> None:
    """An oversized budget on one Arrow batch of long rows: the halvings, the seconds, and the outputs against the
    default budget's."""
    import torch

    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.model_source import ModelSpec

    long_texts = [" ".join(texts[i : i + 60]) for i in range(rows)]
    batches = _arrow_batches(long_texts, rows)
    spec = ModelSpec(
        task="embed", source=str(model_dir), device=DEVICE, dtype="float16", pooling="mean", max_seq_length=512
    )
    figures: dict[str, Any] = {
        "model": model_dir.name,
        "rows": rows,
        "dtype": "float16",
        "gpu_total_mib": torch.cuda.get_device_properties(0).total_memory / 2**20,
    }
    for name, max_tokens, max_rows in (("oversized", 1 << 26, rows), ("default", None, 256)):
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            seconds, outcomes = run_stage(spec, batches, max_tokens, max_rows, warm_up=False)
        except Exception as exc:  # recorded: the figure is whether it backs off
            figures[name] = {
                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "seconds": time.perf_counter() - started,
            }
            continue
        reasons = Counter(r for o in outcomes for r in o.reasons if r is not None)
        first_error = next((e for o in outcomes for e in o.errors if e), None)
        figures[name] = {
            "max_batch_tokens": max_tokens,
            "seconds": seconds,
            "halvings": sum(o.halvings for o in outcomes),
            "unscored_rows": dict(reasons),
            "first_error": first_error and first_error[:400],
            "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20,
        }
        figures.setdefault("vectors", {})[name] = _vectors(outcomes)
    vectors = figures.pop("vectors", {})
    if len(vectors) == 2:
        figures["oversized_vs_default"] = SentenceEmbedder.fidelity(vectors["default"], vectors["oversized"])
    _emit(figures)
    model_cache.clear()


def seeded_model(directory: Path, tokenizer_dir: Path, **config: Any) -> Path:
    """A BERT of the given shape with seeded random weights and ``tokenizer_dir``'s tokenizer, saved in
    ``directory``."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(vocab_size=30522, **config))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, directory / name)
    return directory


def environment() -> dict[str, Any]:
    import torch
    import transformers

    props = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {
        "tokenizer_threads": os.environ.get("RAYON_NUM_THREADS", "all"),
        "gpu": props and props.name,
        "gpu_mib": props and props.total_memory / 2**20,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minilm", type=Path, required=True, help="the all-MiniLM-L6-v2 directory")
    parser.add_argument("--rows", type=int, default=30000)
    parser.add_argument("--arrow-rows", type=int, default=4096, help="rows per Arrow batch (the job's default)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lakescore-gpu"))
    parser.add_argument(
        "--dtypes", default="float32,float16,bfloat16", help="comma-separated (bert-base: float32 and float16 of these)"
    )
    parser.add_argument("--max-rows", default="256,4096", help="comma-separated scoring.max_batch_rows values")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--skip-base", action="store_true")
    parser.add_argument("--oom-rows", type=int, default=0, help="rows of the back-off run (0: skip)")
    parser.add_argument("--null-forward", action="store_true", help="no GPU: the host pipeline's ceiling per CPU core")
    args = parser.parse_args(argv)
    if args.null_forward:
        os.environ["RAYON_NUM_THREADS"] = "1"  # before the first tokenization: the pool of a one-CPU task

    import transformers

    transformers.utils.logging.disable_progress_bar()
    _emit({"environment": environment()})
    texts = list(review_bodies(args.rows))
    dtypes = args.dtypes.split(",")
    max_rows = [int(v) for v in args.max_rows.split(",")]
    if args.null_forward:
        args.work.mkdir(parents=True, exist_ok=True)
        host_ceiling(args.minilm, "all-MiniLM-L6-v2", texts, args.arrow_rows, None)
        base = seeded_model(
            args.work / "bert-base-seeded",
            args.minilm,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
        )
        host_ceiling(base, "bert-base shape, seeded", texts, args.arrow_rows, "mean")
        return
    if not args.skip_minilm:
        measure(args.minilm, "all-MiniLM-L6-v2", texts, dtypes, max_rows, args.arrow_rows, None)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.oom_rows:
        large = seeded_model(
            args.work / "bert-large-seeded",
            args.minilm,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
        )
        oom_backoff(large, texts, args.oom_rows)
    if not args.skip_base:
        base = seeded_model(
            args.work / "bert-base-seeded",
            args.minilm,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
        )
        measure(
            base,
            "bert-base shape, seeded",
            texts,
            [d for d in dtypes if d in ("float32", "float16")],
            max_rows,
            args.arrow_rows,
            "mean",
        )


if __name__ == "__main__":
    main()
