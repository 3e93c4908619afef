"""The ``lakescore plan`` target: on W1 and W2, the predicted total within 0.67-1.5x of the measured run.

Before (d)'s first run of W1 and of W2, ``lakescore plan`` runs once with (d)'s own flags (a fresh output, so the
prediction comes from its calibration forward, not from history). The measured figure is the median of (d)'s runs'
report ``seconds``, the run's own clock, which is what the plan predicts. Printed with ``met`` / ``NOT met``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.fast_path import verdict
from bench.suite import Job, peer_command

__all__ = ["PLAN_WORKLOADS", "PLAN_BOUNDS", "run_plans", "plan_lines"]

PLAN_WORKLOADS = ("W1", "W2")
PLAN_BOUNDS = (0.67, 1.5)
"""Measured total over predicted total, inclusive."""


def plan_command(job: Job, run_dir: Path) -> list[str]:
    """(d)'s command line as ``lakescore plan --json``: the same flags, less the report."""
    command = peer_command(job.peer, job.input, run_dir)
    at = command.index("--report")
    return [command[0], "plan", *command[2:at], *command[at + 2 :], "--json"]


def run_plans(jobs: Sequence[Job], runs_dir: Path, env: Mapping[str, str], cwd: Path) -> dict[str, dict | None]:
    """``lakescore plan`` once for (d) on each of :data:`PLAN_WORKLOADS` among ``jobs``: workload -> the plan's JSON
    (``None``: the plan failed; its output is in ``<runs_dir>/plan-<workload>/plan.log``)."""
    plans: dict[str, dict | None] = {}
    for job in jobs:
        if job.workload not in PLAN_WORKLOADS or job.peer.key != "d":
            continue
        run_dir = runs_dir / f"plan-{job.workload}"
        run_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(plan_command(job, run_dir), env=dict(env), cwd=cwd, capture_output=True, text=True)
        (run_dir / "plan.log").write_text(done.stdout + done.stderr)
        plans[job.workload] = json.loads(done.stdout) if done.returncode == 0 else None
        predicted = plans[job.workload]
        print(
            f"[plan {job.workload}] "
            + (
                f"predicted {predicted['predicted_seconds']['total']:.1f} s ({predicted['cost_from']})"
                if predicted
                else f"FAILED (log {run_dir / 'plan.log'})"
            ),
            flush=True,
        )
    return plans


def plan_lines(plans: Mapping[str, dict | None], results: Sequence) -> list[str]:
    """One line per planned workload: predicted total, (d)'s measured median, their ratio and the target's verdict."""
    lines = []
    low, high = PLAN_BOUNDS
    for workload, plan in plans.items():
        seconds = [
            r.report["seconds"]
            for r in results
            if r.job.workload == workload and r.job.peer.key == "d" and r.ok and r.report and r.report.get("seconds")
        ]
        if plan is None or not seconds:
            lines.append(
                f"{workload} lakescore plan: predicted total vs measured (d): -   target {low}-{high}x: {verdict(None)}"
            )
            continue
        predicted, measured = plan["predicted_seconds"]["total"], statistics.median(seconds)
        ratio = measured / predicted
        lines.append(
            f"{workload} lakescore plan ({plan['cost_from']}): predicted total {predicted:.1f} s (scoring stage "
            f"{plan['predicted_seconds']['score_stage']:.1f} s), measured (d) median {measured:.1f} s, measured / "
            f"predicted {ratio:.2f}   target {low}-{high}x: {verdict(low <= ratio <= high)}"
        )
    return lines
