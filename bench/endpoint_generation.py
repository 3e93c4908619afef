"""W4E: generation through an endpoint (issue 48): ``lakescore score --task generate`` with ``generate.endpoint``
against a plain loop of concurrent requests (:mod:`bench.peers.endpoint_loop`), both to one ``transformers serve``
running W4's seeded model on this machine's CPUs.

The server is started once for the workload (``transformers serve <model>`` on a free loopback port, offline) and
serves both peers, alternately (``repeats`` rounds); each sends :data:`W4E_ROWS` of W4's prompts, greedy,
:data:`W4E_NEW_TOKENS` new tokens each, :data:`CONCURRENCY` requests in flight per task (lakescore) or in all (the
loop). Target (printed with met / NOT met, never enforced): generated tokens/s while generating (lakescore's
``workers.tokens_out`` over its scoring stage's seconds; the loop's over its first request to its last answer) >=
1.0x the loop's, i.e. what lakescore adds per row (Spark, staging, dead-letter, retries) costs no throughput against
the server; greedy texts equal on every row.

An endpoint runs on hosts of its own. On a machine of two CPUs or more the server is pinned to the first half of them
(:func:`split_cpus`) and both peers to the rest, so the Spark JVM and Python workers of lakescore (or the loop's
threads) do not take the server's CPUs; with one CPU they share it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.alternating import PeerRun, PeerRuns, compare_first_good, run_alternately
from bench.fast_path import verdict
from bench.generation import compare_texts, make_w4_data, make_w4_model, tokens_per_second

__all__ = [
    "W4E",
    "W4E_ROWS",
    "W4E_REPEATS",
    "W4E_NEW_TOKENS",
    "W4EResult",
    "run_w4e",
    "w4e_lines",
    "peer_commands",
    "serve_transformers",
    "stop_server",
    "split_cpus",
]

W4E = "W4E"
W4E_ROWS = 200
W4E_REPEATS = 2
W4E_NEW_TOKENS = 16
CONCURRENCY = 16
RATE_TARGET = 1.0


@dataclass
class W4EResult(PeerRuns):
    """Every W4E run by peer (``lakescore``, ``loop``), in run order, and the greedy comparison of their outputs."""

    rows: int
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)
    equal: dict | None = None
    cpus: tuple[set[int] | None, set[int] | None] = (None, None)
    """The server's CPUs and the peers' (``None``: not pinned)."""


def _cpus_text(cpus: tuple[set[int] | None, set[int] | None]) -> str:
    server, peers = cpus
    if server is None:
        return "server and peers share every CPU"
    return (
        f"server on CPU(s) {','.join(map(str, sorted(server)))}, "
        f"each peer on CPU(s) {','.join(map(str, sorted(peers)))}"
    )


def split_cpus(cpus: set[int] | None = None) -> tuple[set[int] | None, set[int] | None]:
    """``(server's CPUs, the peers')``: the first half of this process's CPUs and the rest; ``(None, None)`` (no
    pinning) with a single CPU."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def _pinned(command: list[str], cpus: set[int] | None) -> list[str]:
    """``command`` run on ``cpus`` only (``taskset``; the JVM and Python workers it starts inherit them)."""
    return command if cpus is None else ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]


def stop_server(server: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM the process group of a server :func:`serve_transformers` started; SIGKILL it after ``grace_s``."""
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def peer_commands(table: Path, model: Path, url: str, run_dir: Path) -> dict[str, list[str]]:
    """Each W4E peer's command line against the server at ``url``; its files go under ``run_dir``."""
    return {
        "lakescore": [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            "--input",
            str(table),
            "--output",
            str(run_dir / "delta"),
            "--task",
            "generate",
            "--id-col",
            "id",
            "--text-col",
            "prompt",
            "--set",
            f"generate.max_new_tokens={W4E_NEW_TOKENS}",
            "--set",
            f"generate.endpoint.url={url}",
            "--set",
            f"generate.endpoint.model={model}",
            "--set",
            f"generate.endpoint.concurrency={CONCURRENCY}",
            "--report",
            str(run_dir / "report.json"),
            "--set",
            f"spark.warehouse_dir={run_dir / 'warehouse'}",
            "--set",
            f"spark.metastore_dir={run_dir / 'metastore_db'}",
        ],
        "loop": [
            sys.executable,
            "-m",
            "bench.peers.endpoint_loop",
            "--input",
            str(table),
            "--url",
            url,
            "--model",
            str(model),
            "--output",
            str(run_dir / "generated.parquet"),
            "--timings",
            str(run_dir / "timings.json"),
            "--max-new-tokens",
            str(W4E_NEW_TOKENS),
            "--concurrency",
            str(CONCURRENCY),
        ],
    }


def serve_transformers(
    model: Path,
    log: Path,
    env: dict[str, str],
    cpus: set[int] | None = None,
    args: Sequence[str] = (),
    timeout_s: float = 300,
) -> tuple[subprocess.Popen, str]:
    """``transformers serve <model> <args>`` on a free loopback port, offline, on ``cpus`` (all: ``None``), in a
    process group of its own, once it answers ``/health``: the process and its OpenAI base URL."""
    from lakescore.udfs.remote.engine import HOST, engine_command, free_port, healthy

    port = free_port()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            _pinned(engine_command("transformers", str(model), str(model), port, args), cpus),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "HF_HUB_OFFLINE": "1"},
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while not healthy(port):
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError(f"transformers serve did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)
    return process, f"http://{HOST}:{port}/v1"


def run_w4e(
    data_dir: Path, runs_dir: Path, env: dict[str, str], repo: Path, repeats: int, rows: int = W4E_ROWS
) -> W4EResult:
    """Build W4's model and ``rows`` prompts, start the server, run both peers alternately against it ``repeats``
    times each (a line per run), compare the first good outputs row by row; the server is stopped at the end."""
    model = make_w4_model(data_dir / "w4e_model")
    table = make_w4_data(data_dir / "w4e", rows)
    result = W4EResult(rows=rows)
    runs_dir.mkdir(parents=True, exist_ok=True)
    server_cpus, peer_cpus = split_cpus()
    result.cpus = (server_cpus, peer_cpus)
    server, url = serve_transformers(model, runs_dir / f"{W4E}-serve.log", env, server_cpus)
    print(
        f"W4E: {rows:,} prompts, {W4E_NEW_TOKENS} new tokens, greedy, through transformers serve at {url}; "
        f"{_cpus_text(result.cpus)}",
        flush=True,
    )
    return run_against_server(W4E, result, table, model, server, url, runs_dir, env, repo, repeats, peer_cpus)


def run_against_server(
    name: str,
    result: W4EResult,
    table: Path,
    model: Path,
    server: subprocess.Popen,
    url: str,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    repeats: int,
    peer_cpus: set[int] | None,
) -> W4EResult:
    """``result`` with both peers run alternately against the started ``server`` at ``url`` (``repeats`` times each, on
    ``peer_cpus``) and their first good outputs compared row by row; the server is stopped at the end."""
    try:
        commands = {
            peer: (lambda run_dir, peer=peer: _pinned(peer_commands(table, model, url, run_dir)[peer], peer_cpus))
            for peer in ("lakescore", "loop")
        }
        result.runs = run_alternately(
            name,
            commands,
            {"lakescore": "report.json", "loop": "timings.json"},
            tokens_per_second,
            lambda peer, rate: f"{rate:.1f} generated tokens/s while generating",
            runs_dir,
            env,
            {},
            repo,
            repeats,
        )
    finally:
        stop_server(server)
    result.equal = compare_first_good(
        runs_dir, name, result.runs, {"lakescore": "delta", "loop": "generated.parquet"}, compare_texts
    )
    return result


def w4e_lines(result: W4EResult) -> list[str]:
    """The W4E figures and its targets with met / NOT met."""
    lines = [
        f"W4E data: {result.rows:,} of W4's review prompts, {W4E_NEW_TOKENS} new tokens each, greedy, through one "
        f"`transformers serve` (W4's model, CPU); {CONCURRENCY} requests in flight per lakescore task and in the loop; "
        f"{_cpus_text(result.cpus)}"
    ]
    for peer in ("lakescore", "loop"):
        line = result.peer_line(W4E, peer, "generated tokens/s while generating", 1)
        lines += [line] if line else []
    ours, theirs = result.median("lakescore", "rate"), result.median("loop", "rate")
    if ours and theirs:
        lines.append(
            f"W4E generated tokens/s, lakescore's scoring stage vs the request loop: {ours:.1f} vs {theirs:.1f} = "
            f"{ours / theirs:.2f}x   target >= {RATE_TARGET:g}x: {verdict(ours / theirs >= RATE_TARGET)}"
        )
    eq = result.equal
    if eq:
        complete = eq["missing_in_lakescore"] == 0 and eq["extra_in_lakescore"] == 0
        lines.append(
            f"W4E greedy outputs, lakescore vs the loop: {eq['equal']:,} of {eq['matched']:,} rows the same text; "
            f"{eq['missing_in_lakescore']} missing, {eq['extra_in_lakescore']} extra   target all equal: "
            f"{verdict(eq['equal'] == eq['matched'] and complete)}"
        )
    return lines
