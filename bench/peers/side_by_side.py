"""``make bench-peers``: lakescore against Ray Data and Daft on the bench's workloads, whole processes, alternating.

Runs in lakescore's venv; the peers run as ``<peers python> -m bench.peers.ray_data`` / ``bench.peers.daft_df`` in
their own environment (``build/peers-env``), so neither engine is ever imported here. Per workload, the inputs and
models are the ones ``make bench`` builds (:mod:`bench.data`, :mod:`bench.generation`, :mod:`bench.images`,
:mod:`bench.topk`), lakescore's command is the one ``make bench`` times, and the peers read the same Parquet and write
Delta. Runs alternate (lakescore, ray, daft, lakescore, ...; :func:`bench.alternating.run_alternately`); each peer's
first good output is then compared with lakescore's (:mod:`bench.peers.compare`). The table gives, per workload and
peer, the median whole-process wall times, their ratio (peer over lakescore: above 1 means lakescore is faster) and
the target (>= 1.0x) met / NOT met; a peer whose output differs gets no verdict, since it did other work.

Knobs (flag, or the environment variable in brackets): ``--workloads`` [WORKLOADS] (W1, W1L, W4, W5, W6; default
W1), ``--engines`` [ENGINES] (default ``ray,daft``), ``--repeats`` [REPEATS] (rounds, default 2), ``--pause``
[PAUSE] (seconds between runs, default 0), sizes ``--rows`` [ROWS],
``--w1l-rows`` [W1L_ROWS], ``--w4-rows`` [W4_ROWS], ``--w5-rows`` [W5_ROWS], ``--w6-users`` [W6_USERS],
``--w6-candidates`` [W6_CANDIDATES], ``--w6-top-k`` [W6_TOP_K] (defaults: ``make bench``'s), ``--markdown``
[BENCH_MD] (``-`` to skip).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import data
from bench.alternating import PeerRun, run_alternately
from bench.fast_path import verdict
from bench.model import model_dir
from bench.peers.compare import compare_embeddings, compare_labels, compare_texts, compare_top
from bench.report import machine_facts
from bench.suite import PEERS
from bench.suite import peer_command as bench_command

__all__ = ["ENGINES", "TARGET", "Workload", "main", "ratio_rows", "render_table", "markdown_section", "replace_section"]

REPO = Path(__file__).resolve().parents[2]
ENGINES = {"ray": ("Ray Data", "bench.peers.ray_data"), "daft": ("Daft", "bench.peers.daft_df")}
TARGET = 1.0
"""lakescore's whole process at least as fast as each peer's (peer wall over lakescore wall >= this)."""
SECTION = "## Ray Data and Daft side by side (issue 49)"
SECTION_BEFORE = "## History"
"""The section lives among BENCHMARKS.md's kept sections (``make bench`` rewrites only what is above them)."""


@dataclass
class Workload:
    """One workload's inputs: the table and model both sides read, lakescore's command, the peers' extra flags and the
    output comparison."""

    name: str
    rows: int
    table: Path
    model: Path
    lakescore: Callable[[Path], list[str]]
    compare: Callable[[Path, Path], dict]
    extra: list[str] = field(default_factory=list)
    described: str = ""


def _w1(name: str, rows: int, data_dir: Path) -> Workload:
    table = data_dir / name.lower()
    data.write_table(data.review_bodies(rows), table)
    lakescore = next(p for p in PEERS if p.key == "d")
    return Workload(
        name,
        rows,
        table,
        model_dir(),
        lambda run_dir: bench_command(lakescore, table, run_dir),
        compare_embeddings,
        described=f"{rows:,} W1 reviews, all-MiniLM-L6-v2 embeddings",
    )


def _w4(rows: int, data_dir: Path) -> Workload:
    from bench.generation import LOOP_BATCH, W4_NEW_TOKENS, make_w4_data, make_w4_model, peer_commands

    model, table = make_w4_model(data_dir / "w4_model"), make_w4_data(data_dir, rows)
    return Workload(
        "W4",
        rows,
        table,
        model,
        lambda run_dir: peer_commands(table, model, run_dir)["lakescore"],
        compare_texts,
        ["--batch", str(LOOP_BATCH), "--max-new-tokens", str(W4_NEW_TOKENS)],
        f"{rows:,} review prompts, seeded Llama-shaped decoder, {W4_NEW_TOKENS} new tokens, greedy",
    )


def _w5(rows: int, data_dir: Path) -> Workload:
    from bench.images import LOOP_BATCH, make_w5_data, make_w5_model, peer_commands

    model, table = make_w5_model(data_dir / "w5_model"), make_w5_data(data_dir, rows)["table"]
    return Workload(
        "W5",
        rows,
        table,
        model,
        lambda run_dir: peer_commands(table, "table", model, run_dir)["lakescore"],
        compare_labels,
        ["--batch", str(LOOP_BATCH)],
        f"{rows:,} images of mixed formats and sizes (Parquet, binary column), seeded ViT-base classifier",
    )


def _w6(users: int, candidates: int, top_k: int, data_dir: Path) -> Workload:
    from bench.topk import FEATURES, make_w6_data, make_w6_model, peer_commands

    model, table = make_w6_model(data_dir / "w6_model"), data_dir / "w6"
    rows = make_w6_data(table, users, candidates)
    return Workload(
        "W6",
        rows,
        table,
        model,
        lambda run_dir: peer_commands(table, model, run_dir, top_k)["lakescore"],
        compare_top,
        ["--features", ",".join(FEATURES), "--top-k", str(top_k)],
        f"{users:,} users x {candidates} candidates, seeded TorchScript MLP, top {top_k} per user",
    )


def workload(name: str, args: argparse.Namespace, data_dir: Path) -> Workload:
    """Write ``name``'s inputs (and model) under ``data_dir``; return what its runs need."""
    if name == "W1":
        return _w1("W1", args.rows, data_dir)
    if name == "W1L":
        return _w1("W1L", args.w1l_rows, data_dir)
    if name == "W4":
        return _w4(args.w4_rows, data_dir)
    if name == "W5":
        return _w5(args.w5_rows, data_dir)
    if name == "W6":
        return _w6(args.w6_users, args.w6_candidates, args.w6_top_k, data_dir)
    raise SystemExit(f"unknown workload {name!r} (W1, W1L, W4, W5, W6)")


def peer_command(python: str, engine: str, work: Workload, run_dir: Path) -> list[str]:
    """``engine``'s program on ``work`` in the peers' interpreter ``python``; its files go under ``run_dir``."""
    return [
        python,
        "-m",
        ENGINES[engine][1],
        "--workload",
        work.name,
        "--input",
        str(work.table),
        "--model",
        str(work.model),
        "--output",
        str(run_dir / "delta"),
        "--timings",
        str(run_dir / "timings.json"),
        *work.extra,
    ]


def _rows_out(report: dict) -> float:
    """Rows in the written table: the peers' ``rows``, lakescore's ``output_rows``."""
    return float(report["rows"] if "rows" in report else report.get("output_rows") or 0)


def run_workload(
    work: Workload,
    engines: Sequence[str],
    python: str,
    runs_dir: Path,
    env: dict[str, str],
    repeats: int,
    pause: float = 0.0,
) -> tuple[dict[str, list[PeerRun]], dict[str, dict | None]]:
    """Every side's runs of ``work`` in ``repeats`` rounds (lakescore, then each peer; ``pause`` seconds between runs,
    so a shared machine gets its cores back) and each peer's output compared with lakescore's (``None`` when either
    side had no good run)."""
    commands: dict[str, Callable[[Path], list[str]]] = {"lakescore": work.lakescore}
    commands.update({e: (lambda run_dir, e=e: peer_command(python, e, work, run_dir)) for e in engines})
    written = {side: "report.json" if side == "lakescore" else "timings.json" for side in commands}
    runs: dict[str, list[PeerRun]] = {}
    for round_ in range(repeats):
        print(f"{work.name} round {round_ + 1}/{repeats}", flush=True)
        for side, command in commands.items():
            if pause and runs:
                time.sleep(pause)
            got = run_alternately(
                work.name,
                {side: command},
                written,
                _rows_out,
                lambda side, rows: f"{rows:,.0f} rows written",
                _round_dir(runs_dir, round_),
                env,
                {},
                REPO,
                1,
            )
            runs.setdefault(side, []).extend(got[side])
    ours = _first_good(runs_dir, work.name, runs, "lakescore")
    compared: dict[str, dict | None] = {}
    for engine in engines:
        theirs = _first_good(runs_dir, work.name, runs, engine)
        try:
            compared[engine] = work.compare(ours / "delta", theirs / "delta") if ours and theirs else None
        except (OSError, ValueError, KeyError) as exc:
            compared[engine] = {"same": False, "why": f"comparison failed: {exc}"}
    return runs, compared


def _round_dir(runs_dir: Path, round_: int) -> Path:
    return runs_dir / f"round-{round_ + 1}"


def _first_good(runs_dir: Path, name: str, runs: dict[str, list[PeerRun]], side: str) -> Path | None:
    """The run directory of ``side``'s first good run (one run per side per round), or ``None``."""
    return next((_round_dir(runs_dir, i) / f"{name}-{side}-1" for i, r in enumerate(runs.get(side, [])) if r.ok), None)


def run_walls(name: str, runs: dict[str, list[PeerRun]]) -> str:
    """Every run's whole-process seconds per side, in run order (``FAILED`` for a failed run): the noise behind a
    median."""
    walls = lambda rs: ", ".join(f"{r.measured.wall_seconds:.1f}" if r.ok else "FAILED" for r in rs)  # noqa: E731
    return f"{name} runs, wall seconds in run order: " + "; ".join(f"{side} {walls(rs)}" for side, rs in runs.items())


def _median_wall(runs: list[PeerRun]) -> float | None:
    walls = [r.measured.wall_seconds for r in runs if r.ok]
    return statistics.median(walls) if walls else None


def ratio_rows(
    name: str, rows: int, runs: dict[str, list[PeerRun]], compared: dict[str, dict | None]
) -> list[list[str]]:
    """The table's rows for one workload: per peer, both median walls (and run counts), peer / lakescore, what the
    output comparison found and the target's verdict, given only when both ran and did the same work."""
    ours, out = _median_wall(runs.get("lakescore", [])), []
    for engine, found in compared.items():
        theirs = _median_wall(runs.get(engine, []))
        ratio = theirs / ours if ours and theirs else None
        if ratio is None:
            outputs, said = (
                "-",
                "FAILED: " + ", ".join(s for s in ("lakescore", engine) if not _median_wall(runs.get(s, []))),
            )
        elif found is None or not found["same"]:
            outputs, said = f"differ: {(found or {}).get('why') or 'not compared'}", "no verdict (not the same work)"
        else:
            outputs, said = "same", verdict(ratio >= TARGET)
        count = lambda side: sum(r.ok for r in runs.get(side, []))  # noqa: E731
        out.append(
            [
                name,
                f"{rows:,}",
                ENGINES[engine][0],
                _seconds(ours, count("lakescore")),
                _seconds(theirs, count(engine)),
                "-" if ratio is None else f"{ratio:.2f}x",
                outputs,
                said,
            ]
        )
    return out


def _seconds(value: float | None, runs: int) -> str:
    return "-" if value is None else f"{value:.1f} ({runs})"


HEADER = [
    "workload",
    "rows",
    "peer",
    "lakescore s (runs)",
    "peer s (runs)",
    "peer / lakescore",
    "outputs vs lakescore's",
    f"target >= {TARGET:g}x",
]


def render_table(rows: list[list[str]], markdown: bool) -> str:
    """``rows`` under :data:`HEADER`, as a Markdown table or aligned plain text."""
    if markdown:
        return "\n".join(
            ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER), *["| " + " | ".join(r) + " |" for r in rows]]
        )
    widths = [max(len(c) for c in column) for column in zip(HEADER, *rows)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in [HEADER, *rows])


def markdown_section(facts: dict[str, str], described: list[str], table: str) -> str:
    """BENCHMARKS.md's section for this run: how it was run, on what, and the table."""
    return "\n".join(
        [
            SECTION,
            "",
            "Written by `make bench-peers` (`bench/peers/side_by_side.py`). lakescore's command is `make bench`'s; the "
            "peers run in their own environment (`build/peers-env`, `bench/peers/constraints.txt`, torch / "
            "transformers / sentence-transformers at constraints.txt's pins) as their documentation writes them, "
            "reading the same Parquet and writing Delta: Ray Data (`bench/peers/ray_data.py`: `read_parquet`, "
            "`map_batches` over a class in an actor pool of up to one actor per core, `write_delta`) and Daft "
            "(`bench/peers/daft_df.py`: `embed_text` / `prompt` with the transformers provider, a class UDF for "
            "images, a UDF + `row_number()` window for top-K, `write_deltalake`). Whole processes, alternating "
            "(lakescore, Ray, Daft, ...), medians; the ratio is the peer's median wall over lakescore's (above 1: "
            "lakescore faster). A peer whose output differs from lakescore's (embeddings: cosine < 0.9999; labels, "
            "greedy texts or top-K rows not equal) gets no verdict.",
            "",
            *[f"- {k}: {v}" for k, v in facts.items()],
            *[f"- {line}" for line in described],
            *[f"- {n}" for n in NOTES],
            "",
            table,
            "",
        ]
    )


NOTES = (
    "Ray Data's pool autoscales from one actor to one per core (`ActorPoolStrategy(min_size=1, max_size=cores)`): "
    "the guide's fixed pool of one per core takes both CPUs of a 2-core machine before Ray 2.60's Parquet read "
    '(its `ListFiles` task) gets one, and the job hangs (Ray warns "Cluster resources are not enough to run any '
    "task\"). `--fixed-pool` runs the fixed pool. Ray's W4 and W5 batches and Daft's W5 batches are 32 rows (the "
    "bench's "
    "loops'); Daft's `prompt` calls the transformers pipeline one row at a time, as its provider is written.",
    "Daft's `classify_image` with the transformers provider builds a zero-shot (CLIP-style) pipeline that cannot load "
    "W5's fixed-label ViT classifier, so Daft's W5 is a `@daft.cls` class UDF as Daft documents for a custom model.",
    "Daft 0.7.26's `transformers` extra caps transformers below 5.10 and sentence-transformers below 5.6: the peers' "
    "environment runs lakescore's pins (transformers 5.23, sentence-transformers 6.2) instead, so both sides run the "
    "same model code; its writer imports pyiceberg even for `write_deltalake`, so the `iceberg` extra is installed.",
)
"""How the peer programs depart from the documented form, and why: printed with every table."""


def replace_section(document: str, section: str) -> str:
    """``document`` with its :data:`SECTION` replaced by ``section`` (up to the next ``## `` heading), or ``section``
    inserted before :data:`SECTION_BEFORE` (appended when that heading is missing)."""
    start = document.find(SECTION)
    if start >= 0:
        end = document.find("\n## ", start + len(SECTION))
        return document[:start] + section + ("\n" + document[end + 1 :] if end >= 0 else "")
    at = document.find(SECTION_BEFORE)
    return document[:at] + section + "\n" + document[at:] if at >= 0 else document.rstrip("\n") + "\n\n" + section


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    from bench.generation import W4_ROWS
    from bench.images import W5_ROWS
    from bench.topk import W6_CANDIDATES, W6_TOP_K, W6_USERS

    parser = argparse.ArgumentParser(prog="python -m bench.peers.side_by_side", description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers-python", required=True, help="the peers' interpreter (build/peers-env/bin/python)")
    parser.add_argument("--workloads", default=os.environ.get("WORKLOADS") or "W1", help="[WORKLOADS]")
    parser.add_argument("--engines", default=os.environ.get("ENGINES") or "ray,daft", help="[ENGINES]")
    parser.add_argument("--repeats", type=int, default=_env_int("REPEATS", 2), help="runs per side [REPEATS]")
    parser.add_argument(
        "--pause", type=float, default=float(os.environ.get("PAUSE") or 0), help="seconds to wait between runs [PAUSE]"
    )
    parser.add_argument("--rows", type=int, default=_env_int("ROWS", 12_000), help="W1 rows [ROWS]")
    parser.add_argument("--w1l-rows", type=int, default=_env_int("W1L_ROWS", 60_000), help="[W1L_ROWS]")
    parser.add_argument("--w4-rows", type=int, default=_env_int("W4_ROWS", W4_ROWS), help="[W4_ROWS]")
    parser.add_argument("--w5-rows", type=int, default=_env_int("W5_ROWS", W5_ROWS), help="[W5_ROWS]")
    parser.add_argument("--w6-users", type=int, default=_env_int("W6_USERS", W6_USERS), help="[W6_USERS]")
    parser.add_argument(
        "--w6-candidates", type=int, default=_env_int("W6_CANDIDATES", W6_CANDIDATES), help="[W6_CANDIDATES]"
    )
    parser.add_argument("--w6-top-k", type=int, default=_env_int("W6_TOP_K", W6_TOP_K), help="[W6_TOP_K]")
    parser.add_argument(
        "--note",
        default=os.environ.get("NOTE") or "",
        help="the conditions of this run, one line in the section (e.g. a shared, loaded machine) [NOTE]",
    )
    parser.add_argument("--out", type=Path, default=REPO / ".lakescore" / "bench-peers", help="data, runs, results")
    parser.add_argument(
        "--markdown",
        default=os.environ.get("BENCH_MD") or str(REPO / "BENCHMARKS.md"),
        help="BENCHMARKS.md to update, '-' for none [BENCH_MD]",
    )
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not args.engines or set(args.engines) - set(ENGINES):
        parser.error(f"--engines: a subset of {', '.join(ENGINES)}")
    return args


def _versions(runs: dict[str, list[PeerRun]]) -> dict[str, str]:
    """Each peer's engine version, from what its good runs wrote."""
    return {
        ENGINES[side][0]: r.report["version"]
        for side, rs in runs.items()
        for r in rs
        if side in ENGINES and r.ok and "version" in r.report
    }


def main(argv: Sequence[str] | None = None) -> int:
    import shutil

    from bench.run import _child_env

    args = _args(argv)
    runs_dir, data_dir = args.out / "runs", args.out / "data"
    shutil.rmtree(runs_dir, ignore_errors=True)
    facts, env = machine_facts(REPO), _child_env()
    print("\n".join(f"{k}: {v}" for k, v in facts.items()), flush=True)
    rows, described, ok, versions = [], [], True, {}
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        work = workload(name, args, data_dir)
        described.append(f"{name}: {work.described}")
        print(f"{name}: {work.described}; {args.repeats} run(s) per side", flush=True)
        runs, compared = run_workload(work, args.engines, args.peers_python, runs_dir, env, args.repeats, args.pause)
        ok = ok and all(r.ok for rs in runs.values() for r in rs)
        versions.update(_versions(runs))
        print(f"{name} outputs vs lakescore's: {json.dumps(compared)}", flush=True)
        described.append(run_walls(name, runs))
        rows += ratio_rows(name, work.rows, runs, compared)
    facts.update({f"{engine} version": v for engine, v in versions.items()})
    facts["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.note:
        facts["conditions"] = args.note
    print("\n" + render_table(rows, markdown=False), flush=True)
    section = markdown_section(facts, described, render_table(rows, markdown=True))
    (args.out / "results.md").write_text(section)
    if args.markdown != "-":
        path = Path(args.markdown)
        path.write_text(replace_section(path.read_text() if path.exists() else "", section))
        print(f"\nwritten: {path}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
