"""Two peers of one workload run alternately as whole processes (W4, W5): each run's measurement, what it reported
and its rate, and each peer's medians over its good runs."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.fast_path import verdict
from bench.proctree import Measurement, run_measured

__all__ = ["PeerRun", "PeerRuns", "run_alternately", "first_good", "compare_first_good"]


@dataclass
class PeerRun:
    """One whole process of a peer: its measurement, what it wrote (lakescore's report, a loop's timings) and the
    workload's rate over it (``None`` when it failed)."""

    measured: Measurement
    report: dict | None
    rate: float | None = None

    @property
    def ok(self) -> bool:
        return self.measured.returncode == 0 and self.report is not None


class PeerRuns:
    """A workload's runs by peer, in run order (``self.runs``), and their medians."""

    runs: dict[str, list[PeerRun]]

    def good(self, peer: str) -> list[PeerRun]:
        return [r for r in self.runs.get(peer, []) if r.ok]

    def median(self, peer: str, what: str) -> float | None:
        """The median over ``peer``'s good runs of the whole process's seconds (``what`` ``"wall"``) or of the rate."""
        values = [r.measured.wall_seconds if what == "wall" else r.rate for r in self.good(peer)]
        return statistics.median(values) if values else None

    @property
    def ok(self) -> bool:
        return all(r.ok for runs in self.runs.values() for r in runs)

    def whole_line(self, workload: str, peer: str, their_name: str, target: float) -> str | None:
        """``peer``'s median whole-process seconds over lakescore's, with ``target`` met or not (``their_name``: how
        the line names ``peer``); ``None`` unless both have a good run."""
        ours, theirs = self.median("lakescore", "wall"), self.median(peer, "wall")
        if not (ours and theirs):
            return None
        return (
            f"{workload} whole process, {their_name} wall time over lakescore's: {theirs:.1f} / {ours:.1f} s = "
            f"{theirs / ours:.2f}x   target >= {target:g}x: {verdict(theirs / ours >= target)}"
        )

    def peer_line(self, workload: str, peer: str, rate_what: str, digits: int) -> str | None:
        """``peer``'s summary: whole-process seconds and ``rate_what`` (median, min, max over its good runs, the rate
        to ``digits`` decimals), peak RSS and failed runs; ``FAILED`` when none was good, ``None`` when it never ran."""
        runs, good = self.runs.get(peer, []), self.good(peer)
        if not good:
            return f"{workload} {peer}: FAILED" if runs else None
        walls, rates = [r.measured.wall_seconds for r in good], [r.rate for r in good]
        peak = max(r.measured.peak_rss_bytes for r in good) / 2**20
        return (
            f"{workload} {peer}: whole process median {statistics.median(walls):.1f} s (min {min(walls):.1f}, max "
            f"{max(walls):.1f}); {rate_what} median {statistics.median(rates):.{digits}f} (min "
            f"{min(rates):.{digits}f}, max {max(rates):.{digits}f}) over {len(good)} run(s); peak RSS {peak:.0f} MiB"
            + (f"; {len(runs) - len(good)} FAILED" if len(runs) > len(good) else "")
        )


def run_alternately(
    workload: str,
    commands: dict[str, Callable[[Path], list[str]]],
    written: dict[str, str],
    rate: Callable[[dict], float],
    rate_text: Callable[[str, float], str],
    runs_dir: Path,
    env: dict[str, str],
    peer_env: dict[str, dict[str, str]],
    repo: Path,
    repeats: int,
) -> dict[str, list[PeerRun]]:
    """Run each peer of ``commands`` (peer -> its command line for a run directory) in turn, ``repeats`` rounds, each in
    ``runs_dir/<workload>-<peer>-<round>`` with ``env`` plus ``peer_env[peer]``; read the JSON file ``written[peer]``
    it leaves there, rate it (``rate``) and print a line per run (``rate_text(peer, rate)``)."""
    runs: dict[str, list[PeerRun]] = {}
    for repeat in range(repeats):
        for peer, command in commands.items():
            run_dir = runs_dir / f"{workload}-{peer}-{repeat + 1}"
            run_dir.mkdir(parents=True)
            measured = run_measured(
                command(run_dir), env={**env, **peer_env.get(peer, {})}, cwd=repo, log_path=run_dir / "process.log"
            )
            path = run_dir / written[peer]
            run = PeerRun(measured, json.loads(path.read_text()) if path.is_file() else None)
            run.rate = rate(run.report) if run.ok else None
            runs.setdefault(peer, []).append(run)
            said = (
                rate_text(peer, run.rate)
                if run.ok
                else f"FAILED (exit {measured.returncode}, log {run_dir / 'process.log'})"
            )
            print(
                f"[{workload} {peer} {repeat + 1}/{repeats}] {measured.wall_seconds:.1f} s, peak RSS "
                f"{measured.peak_rss_bytes / 2**20:.0f} MiB: {said}",
                flush=True,
            )
    return runs


def first_good(runs_dir: Path, workload: str, runs: dict[str, list[PeerRun]], peer: str) -> Path | None:
    """The run directory of ``peer``'s first good run, or ``None``."""
    return next((runs_dir / f"{workload}-{peer}-{i + 1}" for i, r in enumerate(runs.get(peer, [])) if r.ok), None)


def compare_first_good(
    runs_dir: Path,
    workload: str,
    runs: dict[str, list[PeerRun]],
    outputs: dict[str, str],
    compare: Callable[[Path, Path], dict],
) -> dict | None:
    """``compare`` of the two peers' outputs (``outputs``: peer -> the output's name in its run directory, lakescore
    first) from each one's first good run; ``None`` when either has none or the comparison fails (said on stdout)."""
    (ours, our_output), (theirs, their_output) = outputs.items()
    first = {peer: first_good(runs_dir, workload, runs, peer) for peer in (ours, theirs)}
    if not (first[ours] and first[theirs]):
        return None
    try:
        return compare(first[ours] / our_output, first[theirs] / their_output)
    except (OSError, ValueError, KeyError) as exc:
        print(f"{workload} output comparison failed: {exc}", flush=True)
        return None
