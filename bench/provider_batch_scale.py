"""W4B: generation through a provider's Batch API at scale (issue 67, item 8): the same ``lakescore score --task
generate`` with ``generate.endpoint.batch`` over a table of ``W4B_ROWS`` rows (default 1,000,000) and over one of
:data:`SMALL_ROWS`, each against the test suite's Batch API provider in cheap mode
(:mod:`tests.providers.batch_provider`: every line answered in-process, the prompt's first words back with ``usage``),
started in a process of its own for each run; and the small table once through the per-row endpoint path against the
same provider, for the cost at equal outputs.

Per run, one whole process (:func:`run_sampled`): its wall time; the driver's peak RSS (the ``lakescore`` Python
process alone, which holds batch ids and states and never a row); the JVM's peak heap in use and its old generation's
(from the JVM's own ``hsperfdata`` counters; in ``local[*]`` the one JVM is the driver and the executors); the tree's
peak RSS. Checked from the outside: every row exactly once in the published table (rows = distinct ids = input rows,
each with a text), every file the provider received within ``max_requests_per_file`` / ``max_bytes_per_file`` (its
batches' request counts, its files' sizes), and the per-row run's texts equal to the small batch run's. Targets
(printed with met / NOT met, never enforced): the driver's peak RSS at the large size over the small's <=
:data:`FLAT_TARGET`; the batch run's token cost over the per-row run's at equal outputs = :data:`COST_TARGET`
(the provider's batch price, ``price.batch``; the preflight's probe is a per-row request at the full price).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import data
from bench.fast_path import verdict
from bench.proctree import tree_pids, wait_until_gone

__all__ = [
    "W4B",
    "W4B_ROWS",
    "SMALL_ROWS",
    "W4BResult",
    "Sampled",
    "run_w4b",
    "w4b_lines",
    "jvm_heap",
    "run_sampled",
]

W4B = "W4B"
W4B_ROWS = 1_000_000
SMALL_ROWS = 10_000
"""The small table's rows (or ``W4B_ROWS`` when fewer)."""
NEW_TOKENS = 8
MAX_REQUESTS_PER_FILE = 50_000
MAX_BYTES_PER_FILE = 200 * 1024 * 1024
PRICE = {"input": 2.0, "output": 10.0}
FLAT_TARGET = 1.2
COST_TARGET = 0.5
KEY_ENV = "LAKESCORE_BENCH_BATCH_KEY"
KEY = "sk-bench-batch-key"
_SEED = 20261129


@dataclass(frozen=True)
class Sampled:
    """One whole process: exit status, wall seconds, and the peaks sampled while it ran (bytes)."""

    returncode: int
    wall_seconds: float
    driver_rss: int
    tree_rss: int
    jvm_rss: int
    jvm_heap_used: int
    jvm_old_used: int
    cpu_seconds: float = 0.0
    """CPU seconds (user + system) of the process tree: each process's last sample, summed (a process that lived less
    than a poll is missed; Spark's Python workers live as long as the run)."""


@dataclass
class W4BRun:
    """One W4B run: what it is (``batch`` or ``per_row``, its rows), how it went, what it reported and the checks."""

    kind: str
    rows: int
    sampled: Sampled | None = None
    report: dict | None = None
    published: dict | None = None
    files: dict | None = None

    @property
    def ok(self) -> bool:
        return self.sampled is not None and self.sampled.returncode == 0 and self.report is not None


@dataclass
class W4BResult:
    """W4B's runs by name (``small``, ``large``, ``per_row``) and the per-row run's texts against the small batch's."""

    runs: dict[str, W4BRun] = field(default_factory=dict)
    texts: dict | None = None

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs.values())


def jvm_heap(pid: int) -> tuple[int, int] | None:
    """``(heap in use, old generation in use)`` of the JVM ``pid`` now, in bytes, from its performance counters
    (``/tmp/hsperfdata_<user>/<pid>``, the file ``jstat`` reads); ``None`` when it has none."""
    import getpass
    import tempfile

    path = Path(tempfile.gettempdir()) / f"hsperfdata_{getpass.getuser()}" / str(pid)
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < 32 or struct.unpack_from(">I", raw, 0)[0] != 0xCAFEC0C0:
        return None
    order = "<" if raw[4] == 1 else ">"
    offset, entries = struct.unpack_from(order + "ii", raw, 24)
    used: dict[str, int] = {}
    try:
        for _ in range(entries):
            length, name_at, vector, kind, _flags, _units, _variability, data_at = struct.unpack_from(
                order + "iiiBBBBi", raw, offset
            )
            name = raw[offset + name_at : raw.index(b"\0", offset + name_at)].decode("ascii", "replace")
            if name.startswith("sun.gc.generation.") and name.endswith(".used") and kind == ord("J") and not vector:
                used[name] = struct.unpack_from(order + "q", raw, offset + data_at)[0]
            offset += length
    except (struct.error, ValueError):  # the JVM rewrote its counters while we read them
        return None
    old = sum(v for k, v in used.items() if k.startswith("sun.gc.generation.1."))
    return sum(used.values()), old


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return 0


def _is_java(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as handle:
            return handle.read().strip() == "java"
    except OSError:
        return False


def run_sampled(cmd: Sequence[str], env: dict[str, str], cwd: Path, log_path: Path, poll_s: float = 0.2) -> Sampled:
    """Run ``cmd`` to its end (output in ``log_path``), sampling every ``poll_s`` the RSS of the process itself (the
    driver), of its JVM and of its whole tree, and every ten polls the JVM's heap (:func:`jvm_heap`); the peaks."""
    peaks = dict.fromkeys(("driver", "tree", "jvm", "heap", "old"), 0)
    polls, seen = 0, set()
    ticks: dict[int, int] = {}
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        child = subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            pids = tree_pids(child.pid)
            seen.update(pids)
            sizes = {pid: _rss(pid) for pid in pids}
            for pid in pids:
                ticks[pid] = max(ticks.get(pid, 0), _cpu_ticks(pid))
            javas = [pid for pid in pids if _is_java(pid)]
            peaks["driver"] = max(peaks["driver"], sizes.get(child.pid, 0))
            peaks["tree"] = max(peaks["tree"], sum(sizes.values()))
            peaks["jvm"] = max([peaks["jvm"], *(sizes[pid] for pid in javas)])
            if polls % 10 == 0:
                for pid in javas:
                    heap = jvm_heap(pid)
                    if heap is not None:
                        peaks["heap"], peaks["old"] = max(peaks["heap"], heap[0]), max(peaks["old"], heap[1])
            polls += 1
            try:
                child.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                continue
        wall = time.perf_counter() - started
    wait_until_gone(seen - {child.pid}, timeout_s=60)
    cpu = sum(ticks.values()) / os.sysconf("SC_CLK_TCK")
    return Sampled(
        child.returncode, wall, peaks["driver"], peaks["tree"], peaks["jvm"], peaks["heap"], peaks["old"], cpu
    )


def make_table(path: Path, rows: int) -> Path:
    """``rows`` short review texts (W2's generator: 8-16 words each), ``review_id`` 1..rows, as bench tables are."""
    if not (path / "_rows").is_file() or (path / "_rows").read_text() != str(rows):
        data.write_table(data.short_bodies(rows, seed=_SEED), path, files=8)
        (path / "_rows").write_text(str(rows))
    return path


def start_provider(log: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """The cheap Batch API provider in a process (and group) of its own on a free loopback port: it and its URL."""
    from lakescore.udfs.remote.engine import free_port

    port = free_port()
    command = [sys.executable, "-m", "tests.providers.batch_provider", "--cheap", "--port", str(port), "--key", KEY]
    command += ["--max-requests-per-file", str(MAX_REQUESTS_PER_FILE), "--max-bytes-per-file", str(MAX_BYTES_PER_FILE)]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while "batch provider at" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise RuntimeError(f"the batch provider did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    return process, f"http://127.0.0.1:{port}/v1"


def _stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def command(table: Path, url: str, run_dir: Path, batch: bool) -> list[str]:
    """The run's ``lakescore score`` command line: greedy generation of :data:`NEW_TOKENS` tokens per row through
    the provider at ``url``, as files (``batch``) or one request per row."""
    sets = {
        "generate.max_new_tokens": NEW_TOKENS,
        "generate.endpoint.url": url,
        "generate.endpoint.model": "cheap-echo",
        "generate.endpoint.api_key_env": KEY_ENV,
        "generate.endpoint.price": json.dumps(PRICE),
        "spark.warehouse_dir": run_dir / "warehouse",
        "spark.metastore_dir": run_dir / "metastore_db",
    }
    if batch:
        settings = {"max_requests_per_file": MAX_REQUESTS_PER_FILE, "max_bytes_per_file": MAX_BYTES_PER_FILE}
        sets["generate.endpoint.batch"] = json.dumps({**settings, "poll_interval_s": 1})
    else:
        sets["generate.endpoint.concurrency"] = 16
    return [
        str(Path(sys.prefix) / "bin" / "lakescore"),
        "score",
        "--input",
        str(table),
        "--output",
        str(run_dir / "delta"),
        "--task",
        "generate",
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--report",
        str(run_dir / "report.json"),
        *[arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")],
    ]


def provider_files(url: str) -> dict:
    """What the provider holds: its batches' request counts and its uploaded files' sizes (the run's files)."""
    import httpx2

    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx2.Client(headers=headers, timeout=60) as http:
        files = http.get(url + "/files").json()["data"]
        batches, after = [], None
        while True:
            page = http.get(url + "/batches", params={"limit": 100, **({"after": after} if after else {})}).json()
            batches += page["data"]
            if not page.get("has_more") or not page["data"]:
                break
            after = page["data"][-1]["id"]
    uploaded = [f["bytes"] for f in files if f.get("purpose") == "batch"]
    lines = [int((b.get("request_counts") or {}).get("total") or 0) for b in batches]
    return {
        "batches": len(batches),
        "files": len(uploaded),
        "max_lines": max(lines, default=0),
        "max_bytes": max(uploaded, default=0),
        "lines": sum(lines),
        "statuses": sorted({str(b.get("status")) for b in batches}),
    }


def published(output: Path) -> tuple[dict, dict[int, str]]:
    """The published table's rows, distinct ids and rows with a text; and its texts by id."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from bench.equivalence import delta_files

    table = pq.read_table(delta_files(output), columns=["review_id", "generated_text"])
    ids = table.column("review_id")
    counts = {
        "rows": table.num_rows,
        "ids": len(pc.unique(ids)),
        "texts": table.num_rows - table.column("generated_text").null_count,
    }
    return counts, dict(zip(ids.to_pylist(), table.column("generated_text").to_pylist()))


def _one(name: str, kind: str, table: Path, rows: int, runs_dir: Path, env: dict[str, str], repo: Path) -> W4BRun:
    """One run against a provider of its own: measured, then checked from the outside; a line printed."""
    run_dir = runs_dir / f"{W4B}-{name}"
    run_dir.mkdir(parents=True)
    run = W4BRun(kind, rows)
    provider, url = start_provider(run_dir / "provider.log", env)
    try:
        cmd = command(table, url, run_dir, batch=kind == "batch")
        run.sampled = run_sampled(cmd, {**env, KEY_ENV: KEY}, repo, run_dir / "process.log")
        report = run_dir / "report.json"
        run.report = json.loads(report.read_text()) if report.is_file() else None
        if run.ok:
            run.files = provider_files(url)
            run.published, texts = published(run_dir / "delta")
            (run_dir / "texts.json").write_text(json.dumps(texts))
    finally:
        _stop(provider)
    s = run.sampled
    print(
        f"[{W4B} {name}] {rows:,} rows, {kind}: "
        + (
            f"{s.wall_seconds:.1f} s, {s.cpu_seconds:.1f} CPU s (process tree); "
            f"driver peak RSS {s.driver_rss / 2**20:.0f} MiB, "
            f"JVM heap {s.jvm_heap_used / 2**20:.0f}"
            f" MiB (old {s.jvm_old_used / 2**20:.0f}), tree {s.tree_rss / 2**20:.0f} MiB; published {run.published}; "
            f"provider {run.files}"
            if run.ok and s is not None
            else f"FAILED (log {run_dir / 'process.log'})"
        ),
        flush=True,
    )
    return run


def run_w4b(
    data_dir: Path,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    rows: int = W4B_ROWS,
    small_rows: int = SMALL_ROWS,
    per_row: bool = True,
) -> W4BResult:
    """The small table through the per-row path (unless not ``per_row``) and as batches, then the large as batches;
    the per-row texts compared with the small batch run's."""
    small = min(small_rows, rows)
    tables = {n: make_table(data_dir / "w4b" / f"rows_{n}", n) for n in {small, rows}}
    result = W4BResult()
    runs_dir.mkdir(parents=True, exist_ok=True)
    planned = [("per_row", "per_row", small)] if per_row else []
    larger = [("large", "batch", rows)] if rows > small else []  # one batch run where the sizes are the same
    for name, kind, n in [*planned, ("small", "batch", small), *larger]:
        result.runs[name] = _one(name, kind, tables[n], n, runs_dir, env, repo)
    if per_row and result.runs["per_row"].ok and result.runs["small"].ok:
        ours = json.loads((runs_dir / f"{W4B}-small" / "texts.json").read_text())
        theirs = json.loads((runs_dir / f"{W4B}-per_row" / "texts.json").read_text())
        result.texts = {"rows": len(theirs), "equal": sum(ours.get(k) == v for k, v in theirs.items())}
    return result


def _cost(run: W4BRun) -> float | None:
    return (run.report or {}).get("cost", {}).get("token_cost") if run.ok else None


def w4b_lines(result: W4BResult) -> list[str]:
    """Each run's figures and checks, and the two targets with met / NOT met."""
    lines = []
    for name, run in result.runs.items():
        s = run.sampled
        if not run.ok or s is None:
            lines.append(f"{W4B} {name} ({run.rows:,} rows, {run.kind}): FAILED")
            continue
        pub, files = run.published or {}, run.files or {}
        once = pub.get("rows") == pub.get("ids") == pub.get("texts") == run.rows
        within = files.get("max_lines", 0) <= MAX_REQUESTS_PER_FILE and files.get("max_bytes", 0) <= MAX_BYTES_PER_FILE
        batch = run.report.get("provider_batch") or {}
        lines.append(
            f"{W4B} {name} ({run.rows:,} rows, {run.kind.replace('_', '-')}): {s.wall_seconds:.1f} s whole process, "
            f"{s.cpu_seconds:.1f} CPU s of its process tree "
            f"(score stage {(run.report.get('step_seconds') or {}).get('score_stage', 0):.1f} s); driver peak RSS "
            f"{s.driver_rss / 2**20:.0f} MiB; JVM peak heap in use {s.jvm_heap_used / 2**20:.0f} MiB (old generation "
            f"{s.jvm_old_used / 2**20:.0f} MiB), JVM peak RSS {s.jvm_rss / 2**20:.0f} MiB; "
            f"tree {s.tree_rss / 2**20:.0f} "
            f"MiB; published {pub.get('rows', 0):,} rows, {pub.get('ids', 0):,} distinct ids, {pub.get('texts', 0):,} "
            f"with a text (every row once: {verdict(once)})"
            + (
                f"; {files.get('batches')} batch(es) of {files.get('files')} file(s), at most "
                f"{files.get('max_lines', 0):,} lines and {files.get('max_bytes', 0):,} bytes a file (limits "
                f"{MAX_REQUESTS_PER_FILE:,} / {MAX_BYTES_PER_FILE:,}: {verdict(within)}); "
                f"{batch.get('lines_submitted', 0):,} lines submitted, "
                f"{batch.get('lines_resubmitted', 0):,} resubmitted"
                if run.kind == "batch"
                else ""
            )
            + f"; token cost {_cost(run)}"
        )
    small, large = result.runs.get("small"), result.runs.get("large")
    if small and large and small.ok and large.ok and small.sampled and large.sampled and large.rows > small.rows:
        ratio = large.sampled.driver_rss / small.sampled.driver_rss
        heap = large.sampled.jvm_old_used / max(1, small.sampled.jvm_old_used)
        lines.append(
            f"{W4B} driver peak RSS, {large.rows:,} rows over {small.rows:,}: {large.sampled.driver_rss / 2**20:.0f} / "
            f"{small.sampled.driver_rss / 2**20:.0f} MiB = {ratio:.2f}x   target <= {FLAT_TARGET:g}x: "
            f"{verdict(ratio <= FLAT_TARGET)} (the JVM's old generation, driver and executors in one local JVM: "
            f"{heap:.2f}x)"
        )
    per_row = result.runs.get("per_row")
    ours, theirs = (_cost(small) if small else None), (_cost(per_row) if per_row else None)
    if ours and theirs and result.texts:
        equal = result.texts["equal"] == result.texts["rows"] == small.rows
        lines.append(
            f"{W4B} token cost at equal outputs ({result.texts['equal']:,} of {result.texts['rows']:,} texts "
            "the same), "
            f"batch over per-row: {ours:.6f} / {theirs:.6f} = {ours / theirs:.4f}   target {COST_TARGET:g} (the "
            f"preflight's probe at the full price aside): {verdict(equal and abs(ours / theirs - COST_TARGET) < 0.01)}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.provider_batch_scale [--rows N]``: W4B alone, its lines on stdout."""
    import argparse

    from bench.run import REPO, _child_env

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=W4B_ROWS, help=f"the large table's rows (default {W4B_ROWS:,})")
    parser.add_argument("--small-rows", type=int, default=SMALL_ROWS, help=f"the small's (default {SMALL_ROWS:,})")
    parser.add_argument("--no-per-row", action="store_true", help="leave out the per-row run (the cost comparison)")
    parser.add_argument("--out", type=Path, default=REPO / ".lakescore" / "bench")
    args = parser.parse_args(argv)
    runs_dir = args.out / "runs"
    for stale in runs_dir.glob(f"{W4B}-*"):
        import shutil

        shutil.rmtree(stale)
    result = run_w4b(args.out / "data", runs_dir, _child_env(), REPO, args.rows, args.small_rows, not args.no_per_row)
    print("\n".join(["", *w4b_lines(result)]), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
