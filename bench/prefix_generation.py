"""W11: prompts that share a prefix (issue 68), through one vLLM CPU server whose KV cache holds a few documents only.

:data:`W11_DOCS` documents of 300-400 tokens (W1 review texts joined, W4's tokenizer counting),
:data:`W11_QUESTIONS` questions each, one row per (document, question) with the prompt :data:`TEMPLATE` (the document
first: the part the rows share), stored in a shuffled order. :data:`W11_NEW_TOKENS` new tokens each,
greedy, W4's model (:func:`bench.generation.make_w4_model`) served by vLLM's CPU build (``make engine-vllm``) with
prefix caching on and its KV cache capped (``--num-gpu-blocks-override``) to :data:`KV_BLOCKS` blocks of
:data:`BLOCK_SIZE` tokens, so the table's order cannot hit the cache by chance. Four peers, each a whole process run
one after another against the one server (its prefix cache reset before each, ``/reset_prefix_cache``):

1. ``grouped``: ``lakescore score --task generate`` over ``generate.endpoint`` (``scoring.group_prefixes`` on, the
   default);
2. ``ungrouped``: the same with ``scoring.group_prefixes=false``;
3. ``table``: :mod:`bench.peers.endpoint_loop` over the prompts in the table's order;
4. ``sorted``: the same client over the prompts sorted (what grouping can reach at most).

Every peer keeps :data:`CONCURRENCY` requests in flight (lakescore: per task). Figures: each peer's wall time and
vLLM's prefix cache hit rate over its run (``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total``
on ``/metrics``, tokens). Targets (printed with met / NOT met, never enforced): grouped >= 1.3x ungrouped (whole
process); grouped's hit rate >= 0.9x the sorted client's; the texts equal across all four peers.

Run: ``python -m bench.prefix_generation --docs 200 [--out DIR]`` (``--docs``, ``--questions`` scale it down).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from bench import data
from bench.endpoint_generation import _pinned, split_cpus
from bench.equivalence import delta_files
from bench.generation import MODEL_SHAPE, make_w4_model

W11 = "W11"
W11_DOCS = 200
W11_QUESTIONS = 10
W11_NEW_TOKENS = 8
W11_SEED = 20261129
DOC_TOKENS = (300, 400)
CONCURRENCY = 16
BLOCK_SIZE = 32
KV_BLOCKS = 128
"""4,096 tokens of KV cache: about ten of W11's prompts, so a few documents at a time."""
TEMPLATE = "Document: {doc}\n\nQuestion: {question}\nAnswer:"
QUESTIONS = (
    "Who wrote this?",
    "Is the reviewer happy?",
    "What product is it about?",
    "Would they buy it again?",
    "What was the main problem?",
    "Summarise it in one sentence.",
    "What score would they give?",
    "Is it about delivery?",
    "Does it mention the price?",
    "What should the seller change?",
)
SPEED_TARGET, HIT_TARGET = 1.3, 0.9
PEERS = ("grouped", "ungrouped", "table", "sorted")


def make_w11_data(out: Path, model: Path, docs: int, questions: int) -> tuple[Path, Path, int]:
    """The table (``id``, ``prompt``; rows shuffled) and the same rows sorted by prompt, each one Parquet file under
    ``out``; and the prompts' tokens in all (W4's tokenizer)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rng = random.Random(W11_SEED)
    bodies = data.review_bodies(docs * 60, seed=W11_SEED)
    rows, tokens = [], 0
    for d in range(docs):
        target, parts = rng.randint(*DOC_TOKENS), []
        while len(tokenizer(" ".join(parts))["input_ids"]) < target:
            parts.append(next(bodies))
        doc = " ".join(parts)
        for q in range(questions):
            prompt = TEMPLATE.format(doc=doc, question=QUESTIONS[q % len(QUESTIONS)])
            tokens += len(tokenizer(prompt)["input_ids"])
            rows.append((d * questions + q, prompt))
    rng.shuffle(rows)
    frame = pd.DataFrame(rows, columns=["id", "prompt"])
    table, ordered = out / "table", out / "sorted"
    for path, part in ((table, frame), (ordered, frame.sort_values("prompt"))):
        path.mkdir(parents=True, exist_ok=True)
        part.to_parquet(path / "part-00000.parquet", index=False)
    return table, ordered, tokens


def serve(model: Path, log: Path, cpus: set[int] | None, python: Path) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server for ``model``, prefix caching on, :data:`KV_BLOCKS` blocks of KV cache, on ``cpus``; the
    process and its base URL once ``/health`` answers."""
    from lakescore.udfs.remote.engine import HOST, free_port, healthy

    port = free_port()
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", str(model), "--served-model-name", str(model), "--host", HOST, "--port", str(port)),
        *("--dtype", "float32", "--max-model-len", "1024", "--gpu-memory-utilization", "0.1"),
        *("--enable-prefix-caching", "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(KV_BLOCKS)),
        "--enable-prompt-tokens-details",
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache, between peers
        **({"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cpus)))} if cpus else {}),
    }
    with open(log, "ab") as out:
        process = subprocess.Popen(
            _pinned(command, cpus), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    deadline = time.monotonic() + 1800
    while not healthy(port):
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError(f"vLLM did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(1.0)
    return process, f"http://{HOST}:{port}/v1"


def counters(url: str) -> dict[str, float]:
    """vLLM's prefix cache and prompt token counters from ``/metrics`` (summed over their labels)."""
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30).read().decode()
    found: dict[str, float] = {}
    for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens"):
        values = re.findall(rf"^vllm:{name}_total(?:{{[^}}]*}})? ([0-9.eE+]+)$", text, re.M)
        found[name] = sum(float(v) for v in values)
    return found


def reset_cache(url: str) -> None:
    request = urllib.request.Request(url.removesuffix("/v1") + "/reset_prefix_cache", method="POST", data=b"")
    urllib.request.urlopen(request, timeout=60).read()


def commands(peer: str, table: Path, ordered: Path, model: Path, url: str, run: Path) -> list[str]:
    if peer in ("grouped", "ungrouped"):
        settings = {
            "generate.max_new_tokens": W11_NEW_TOKENS,
            "generate.endpoint.url": url,
            "generate.endpoint.model": model,
            "generate.endpoint.concurrency": CONCURRENCY,
            "scoring.group_prefixes": str(peer == "grouped").lower(),
            "spark.warehouse_dir": run / "warehouse",
            "spark.metastore_dir": run / "metastore_db",
        }
        return [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            *("--input", str(table), "--output", str(run / "delta"), "--task", "generate"),
            *("--id-col", "id", "--text-col", "prompt", "--report", str(run / "report.json")),
            *[arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")],
        ]
    return [
        sys.executable,
        "-m",
        "bench.peers.endpoint_loop",
        *("--input", str(table if peer == "table" else ordered), "--url", url, "--model", str(model)),
        *("--output", str(run / "generated.parquet"), "--timings", str(run / "timings.json")),
        *("--max-new-tokens", str(W11_NEW_TOKENS), "--concurrency", str(CONCURRENCY)),
    ]


def texts(peer: str, run: Path) -> pd.DataFrame:
    if peer in ("grouped", "ungrouped"):
        return pq.read_table(delta_files(run / "delta"), columns=["id", "generated_text"]).to_pandas()
    return pd.read_parquet(run / "generated.parquet", columns=["id", "generated_text"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.prefix_generation")
    parser.add_argument("--docs", type=int, default=W11_DOCS)
    parser.add_argument("--questions", type=int, default=W11_QUESTIONS)
    parser.add_argument("--out", type=Path, default=Path("build/bench/w11"))
    parser.add_argument("--peers", default=",".join(PEERS))
    args = parser.parse_args(argv)
    python = Path(
        os.environ.get("VLLM_PYTHON") or Path(__file__).resolve().parents[1] / "build/engines/vllm/bin/python"
    )
    if not python.exists():
        raise SystemExit(f"W11 needs vLLM: {python} is absent (make engine-vllm builds it)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = out / "model"
    if not (model / "config.json").exists():
        make_w4_model(model)
    table, ordered, tokens = make_w11_data(out, model, args.docs, args.questions)
    rows = args.docs * args.questions
    print(f"W11 data: {args.docs} documents x {args.questions} questions = {rows:,} rows, {tokens:,} prompt tokens")
    server_cpus, peer_cpus = split_cpus()
    started = time.monotonic()
    server, url = serve(model, out / "vllm.log", server_cpus, python)
    print(f"W11: vLLM answered /health after {time.monotonic() - started:.0f} s at {url}", flush=True)
    results: dict[str, dict] = {}
    try:
        for peer in args.peers.split(","):
            run = out / "runs" / peer
            subprocess.run(["rm", "-rf", str(run)], check=True)
            run.mkdir(parents=True)
            reset_cache(url)
            before = counters(url)
            began = time.monotonic()
            with open(run / "log.txt", "wb") as log:
                done = subprocess.run(
                    _pinned(commands(peer, table, ordered, model, url, run), peer_cpus), stdout=log, stderr=log
                )
            seconds = time.monotonic() - began
            after = counters(url)
            delta = {k: after[k] - before[k] for k in after}
            hit = delta["prefix_cache_hits"] / delta["prefix_cache_queries"] if delta["prefix_cache_queries"] else 0.0
            results[peer] = {"seconds": seconds, "rc": done.returncode, "hit_rate": hit, **delta}
            if peer in ("grouped", "ungrouped") and (run / "report.json").exists():
                report = json.loads((run / "report.json").read_text())
                results[peer]["score_stage_s"] = report["step_seconds"].get("score_stage")
                results[peer]["workers"] = {
                    k: v for k, v in report.get("workers", {}).items() if k.startswith("tokens") or "cached" in k
                }
            print(
                f"W11 {peer}: {seconds:.1f} s whole process (rc {done.returncode}); prefix cache hit rate {hit:.1%} "
                f"({delta['prefix_cache_hits']:,.0f} of {delta['prefix_cache_queries']:,.0f} tokens queried; "
                f"{delta['prompt_tokens']:,.0f} prompt tokens)",
                flush=True,
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    outputs = {peer: texts(peer, out / "runs" / peer) for peer in results if results[peer]["rc"] == 0}
    first = next(iter(outputs.values()), None)
    for peer, frame in outputs.items():
        both = first.merge(frame, on="id")
        results[peer]["equal_texts"] = int((both["generated_text_x"] == both["generated_text_y"]).sum())
        results[peer]["rows"] = len(frame)
    if "grouped" in results and "ungrouped" in results:
        speed = results["ungrouped"]["seconds"] / results["grouped"]["seconds"]
        print(
            f"W11 grouped vs ungrouped, whole process: {speed:.2f}x   "
            f"target >= {SPEED_TARGET:g}x: {speed >= SPEED_TARGET}"
        )
    if "grouped" in results and "sorted" in results and results["sorted"]["hit_rate"]:
        share = results["grouped"]["hit_rate"] / results["sorted"]["hit_rate"]
        print(f"W11 grouped hit rate / sorted client's: {share:.2f}   target >= {HIT_TARGET:g}: {share >= HIT_TARGET}")
    shape = MODEL_SHAPE
    equal = ", ".join(f"{p} {r.get('equal_texts')}/{r.get('rows')}" for p, r in results.items())
    print(
        f"W11 texts equal to the first peer's: {equal}; model: {shape['num_hidden_layers']} layers, "
        f"hidden {shape['hidden_size']}"
    )
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
