"""W4V: generation through vLLM (issue 58): ``lakescore score --task generate`` with ``generate.endpoint`` against a
plain loop of concurrent requests (:mod:`bench.peers.endpoint_loop`) at the same concurrency, both to one vLLM server
(the CPU build ``make engine-vllm`` builds) running W4's seeded model. On request only (``WORKLOADS=W4V``, or
``W4,W4V`` for in-process generate of the same model and prompts beside it).

W4E's harness (:mod:`bench.endpoint_generation`) with vLLM in place of ``transformers serve``: the server is started
once (its start, minutes of compile warm-up, is in no figure), pinned to half the CPUs, the peers to the rest; alternate
runs, medians. lakescore reaches the engine as ``generate.endpoint``: a served engine (``generate.server``) is the same
client and the same engine, started by the first task instead of by the bench. Targets (printed with met / NOT met,
never enforced): lakescore's generated tokens/s >= 0.9x the loop's; greedy texts equal on every row.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from bench.endpoint_generation import CONCURRENCY, W4EResult, _cpus_text, _pinned, run_against_server, split_cpus
from bench.fast_path import verdict
from bench.generation import MODEL_SHAPE, make_w4_data, make_w4_model

__all__ = ["W4V", "W4V_ROWS", "W4V_REPEATS", "run_w4v", "w4v_lines", "serve_vllm", "VLLM_PYTHON"]

W4V = "W4V"
W4V_ROWS = 200
W4V_REPEATS = 2
RATE_TARGET = 0.9
VLLM_PYTHON = Path(__file__).resolve().parents[1] / "build" / "engines" / "vllm" / "bin" / "python"
"""Where ``make engine-vllm`` puts vLLM's CPU build (``VLLM_PYTHON`` in the environment names another)."""
KV_CACHE_GIB = "2"
"""``VLLM_CPU_KVCACHE_SPACE``: enough for :data:`CONCURRENCY` sequences of W4's length; vLLM's default takes several
GiB."""


def serve_vllm(
    model: Path,
    log: Path,
    env: dict[str, str],
    cpus: set[int] | None = None,
    python: Path | None = None,
    timeout_s: float = 1800,
) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server for ``model`` (served under its path, as the peers name it), float32, offline, on ``cpus``,
    in a process group of its own, once it answers ``/health``: the process and its base URL."""
    from lakescore.udfs.remote.engine import HOST, free_port, healthy

    python = Path(os.environ.get("VLLM_PYTHON") or python or VLLM_PYTHON)
    if not python.exists():
        raise SystemExit(f"W4V needs vLLM: {python} is absent (make engine-vllm builds it)")
    port = free_port()
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--gpu-memory-utilization",
        "0.2",
    ]  # vLLM CPU checks this share of memory is free at start
    with open(log, "ab") as out:
        process = subprocess.Popen(
            _pinned(command, cpus),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **env,
                "HF_HUB_OFFLINE": "1",
                "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
                "VLLM_NO_USAGE_STATS": "1",
                **_bind(cpus),
            },
        )
    deadline = time.monotonic() + timeout_s
    while not healthy(port):
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError(f"vLLM did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(1.0)
    return process, f"http://{HOST}:{port}/v1"


def _bind(cpus: set[int] | None) -> dict[str, str]:
    """vLLM's CPU backend binds its OpenMP threads to cores itself (and keeps one back) unless told which: the pinned
    ones, so it neither leaves them nor reaches past them."""
    return {} if cpus is None else {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cpus)))}


def run_w4v(
    data_dir: Path, runs_dir: Path, env: dict[str, str], repo: Path, repeats: int, rows: int = W4V_ROWS
) -> W4EResult:
    """Build W4's model and ``rows`` prompts, start vLLM, run both peers alternately against it ``repeats`` times each,
    compare the first good outputs row by row; the server is stopped at the end."""
    model = make_w4_model(data_dir / "w4v_model")
    table = make_w4_data(data_dir / "w4v", rows)
    result = W4EResult(rows=rows)
    runs_dir.mkdir(parents=True, exist_ok=True)
    server_cpus, peer_cpus = split_cpus()
    result.cpus = (server_cpus, peer_cpus)
    started = time.monotonic()
    server, url = serve_vllm(model, runs_dir / f"{W4V}-serve.log", env, server_cpus)
    print(
        f"W4V: vLLM answered /health after {time.monotonic() - started:.0f} s; {rows:,} prompts through it at {url}; "
        f"{_cpus_text(result.cpus)}",
        flush=True,
    )
    return run_against_server(W4V, result, table, model, server, url, runs_dir, env, repo, repeats, peer_cpus)


def w4v_lines(result: W4EResult) -> list[str]:
    """The W4V figures and its targets with met / NOT met."""
    shape = MODEL_SHAPE
    lines = [
        f"W4V data: {result.rows:,} of W4's review prompts, greedy, through one vLLM server (CPU build, float32; W4's "
        f"model: {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, {shape['num_attention_heads']} "
        f"heads); {CONCURRENCY} requests in flight per lakescore task and in the loop; {_cpus_text(result.cpus)}"
    ]
    for peer in ("lakescore", "loop"):
        line = result.peer_line(W4V, peer, "generated tokens/s while generating", 1)
        lines += [line] if line else []
    ours, theirs = result.median("lakescore", "rate"), result.median("loop", "rate")
    if ours and theirs:
        lines.append(
            f"W4V generated tokens/s, lakescore's scoring stage vs the request loop: {ours:.1f} vs {theirs:.1f} = "
            f"{ours / theirs:.2f}x   target >= {RATE_TARGET:g}x: {verdict(ours / theirs >= RATE_TARGET)}"
        )
    eq = result.equal
    if eq:
        complete = eq["missing_in_lakescore"] == 0 and eq["extra_in_lakescore"] == 0
        lines.append(
            f"W4V greedy outputs, lakescore vs the loop: {eq['equal']:,} of {eq['matched']:,} rows the same text; "
            f"{eq['missing_in_lakescore']} missing, {eq['extra_in_lakescore']} extra   target all equal: "
            f"{verdict(eq['equal'] == eq['matched'] and complete)}"
        )
    return lines
