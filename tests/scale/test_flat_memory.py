"""Flat memory at scale: 2,000,000 tabular rows through the real CLI on ``local-cluster[2,1,1024]``.

The model is a tiny seeded MLP, so the run measures the pipeline (read, stage, validate, publish),
not the model. While the run goes, a thread samples the resident memory of every process the run
starts (driver Python, driver JVM, both executor JVMs, their Python workers) from ``/proc``. The
test asserts:

- every id is published exactly once, with the model's scores (spot-checked against torch);
- each process's memory is flat while rows stream through it; a per-row leak or a driver-side buffer
  grows linearly across the stage and fails this:
  - a Python process (driver, workers): its resident peak in the last third of the scoring stage is
    within :data:`FLAT_SLACK_MIB` (or :data:`FLAT_SLACK_SHARE`) of its peak in the first third;
  - a JVM (driver, executors): its live heap, what a full GC leaves (forced with ``jcmd GC.run``
    every :data:`HEAP_PROBE_SECONDS` while scoring, read from the JVM's own GC log), is as flat.
    A JVM's resident size says nothing about retention: G1 grows the committed heap in steps
    towards ``-Xmx`` as it likes (an executor went 768 -> 929 MiB in CI with nothing kept);
- no per-row work happens on the driver: no stage sends the driver more than
  :data:`MAX_STAGE_RESULT_BYTES` of task results (Spark's event log, ``Result Size``; collecting just
  the 2M int64 ids would be 16 MB), and the driver Python process spends almost no CPU while the
  executors score.

It prints a table (process → peak MiB, flatness) and the run's rows/s; ``$LAKESCORE_SCALE_OUT``
names a file to write it to (README's reliability section records it). ``make test-scale`` runs
this module alone; ``make test`` runs it with everything else (about two minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakescore.jobs.platform.spark.local import python_daemon
from tests.cluster.processes import CliRun, cpu_seconds, descendants, procs_now
from tests.conftest import TinyTabular

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="samples Spark's processes through /proc")

ROWS = 2_000_000
MASTER = "local-cluster[2,1,1024]"
SAMPLE_SECONDS = 0.25
# Task results a stage may send the driver: task metrics and accumulators are ~4 KiB a task (the
# Delta log's state reconstruction stages sent ~240 KiB at Delta's default 50 partitions); rows would be megabytes.
MAX_STAGE_RESULT_BYTES = 1024 * 1024
# A process is flat when its peak in the scoring stage's last third exceeds its peak in the first
# third by at most this much (resident size for Python processes, live heap for JVMs). Arrow buffers get
# reused and a GC'd heap settles; keeping rows does not settle: each executor sees ~330k
# rows a third, so anything that keeps more than ~400 bytes a row (a Python row object alone is more)
# in one process fails this.
FLAT_SLACK_MIB = 128
FLAT_SLACK_SHARE = 0.10
# While scoring, every this many seconds each JVM is made to run a full GC; what it leaves is the live heap.
HEAP_PROBE_SECONDS = 2.0
# A full GC's line in the JVM's unified GC log (``-Xlog:gc:file=...:time``): wall time, heap before -> after
# (``jcmd GC.run`` logs as ``Pause Full (Diagnostic Command)``).
FULL_GC_LINE = re.compile(
    r"^\[(?P<time>[^\]]+)\] GC\(\d+\) Pause Full \([^)]*\) "
    r"\d+(?:\.\d+)?[KMG]->(?P<after>\d+(?:\.\d+)?)(?P<unit>[KMG])"
)
JVM_ROLES = ("driver JVM", "executor JVM")
# The log lines that open and close the scoring stage (jobs/steps/prepare.py, jobs/steps/score.py).
SCORING_STARTS = "lakescore.jobs.steps.prepare: scoring "
SCORING_ENDS = "chunk 1/1 staged"


def role(pid: int, root: int, procs: dict) -> str:
    """What a process of the run is, from its command line (``other``: the shell scripts that start the JVM).

    ``procs`` is :func:`~tests.cluster.processes.procs_now`'s map. A process with its parent's command line is
    that parent's child between fork and exec (a JVM starting the Python daemon or a shell command): it shows the
    parent's memory for a moment, and is ``other``, not a second JVM (CI once counted three executor JVMs so)."""
    ppid, cmdline = procs.get(pid, (0, ""))[:2]
    program = Path(cmdline.split(" ", 1)[0]).name
    if pid == root:
        return "driver Python"
    if ppid in procs and procs[ppid][1] == cmdline:
        return "other"
    if program == "java" and "org.apache.spark.launcher.Main" in cmdline:
        return "other"  # spark-class's launcher: it prints the driver's command line and exits
    if program == "java" and "org.apache.spark.deploy.SparkSubmit" in cmdline:
        return "driver JVM"
    if program == "java" and "CoarseGrainedExecutorBackend" in cmdline:
        return "executor JVM"
    if program.startswith("python") and ("pyspark.daemon" in cmdline or python_daemon.runs_daemon(cmdline.split())):
        return "Python worker"  # the daemon an executor starts, and the workers it forks
    return "other"


def rss_mib(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB (``VmRSS``), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def jcmd() -> str:
    """The ``jcmd`` of the JDK whose ``java`` is on the path (it forces the probes' full GCs)."""
    java = shutil.which("java")
    assert java, "no java on the path"
    found = Path(java).resolve().with_name("jcmd")
    assert found.exists(), f"no jcmd beside {java}: the heap probes need the JDK's jcmd"
    return str(found)


def live_heap_mib(gc_log_dir: Path) -> dict[int, list[tuple[float, float]]]:
    """JVM pid -> [(wall time, heap MiB after a full GC)], from the ``gc-<pid>.log`` files."""
    scale = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}
    out: dict[int, list[tuple[float, float]]] = {}
    for log in gc_log_dir.glob("gc-*.log"):
        pid = int(log.stem.split("-", 1)[1])
        for line in log.read_text().splitlines():
            m = FULL_GC_LINE.match(line)
            if m:
                at = datetime.strptime(m["time"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
                out.setdefault(pid, []).append((at, float(m["after"]) * scale[m["unit"]]))
    return out


class MemorySampler(threading.Thread):
    """Every :data:`SAMPLE_SECONDS`, the RSS of each process under ``run``'s CLI process, and the times
    the scoring stage opened and closed in its log (with the driver Python's CPU seconds then). While
    the stage runs, a second thread forces each JVM's full GC every :data:`HEAP_PROBE_SECONDS`."""

    def __init__(self, run: CliRun, gc_log_dir: Path):
        super().__init__(daemon=True)
        self.cli = run
        self.gc_log_dir = gc_log_dir
        self.series: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        self.marks: dict[str, tuple[float, float]] = {}
        self._done = threading.Event()
        self._prober = threading.Thread(target=self._probe_heaps, daemon=True)
        self._jcmd = jcmd()

    def _probe_heaps(self) -> None:
        """While scoring: ``jcmd <pid> GC.run`` on every JVM of the run (each logs its full GC)."""
        while not self._done.is_set() and "end" not in self.marks:
            if "start" in self.marks:
                jvms = [pid for (name, pid) in list(self.series) if name in JVM_ROLES]
                probes = [
                    subprocess.Popen(
                        [self._jcmd, str(pid), "GC.run"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                    for pid in jvms
                ]
                for probe in probes:
                    probe.wait(timeout=60)
            self._done.wait(HEAP_PROBE_SECONDS)

    def run(self) -> None:
        self._prober.start()
        root = self.cli.proc.pid
        while not self._done.is_set() and self.cli.proc.poll() is None:
            now, procs = time.time(), procs_now()
            for pid in {root} | descendants(root, procs):
                rss = rss_mib(pid)
                if rss is not None:
                    self.series[(role(pid, root, procs), pid)].append((now, rss))
            text = self.cli.text()
            for name, line in (("start", SCORING_STARTS), ("end", SCORING_ENDS)):
                if name not in self.marks and line in text:
                    self.marks[name] = (now, cpu_seconds(root))
            self._done.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self._done.set()
        self.join()
        self._prober.join()

    def rows(self) -> list[dict]:
        """Per process: role, pid, whether it was alive at any time during the scoring stage (``in_stage``),
        peak MiB over the run, and peaks in the scoring stage's first and last thirds: of the resident size
        for Python processes, of the live heap (full GCs) for JVMs."""
        start, end = self.marks["start"][0], self.marks["end"][0]
        third = (end - start) / 3
        live = live_heap_mib(self.gc_log_dir)
        out = []
        for (name, pid), samples in sorted(self.series.items()):
            if name in JVM_ROLES:
                samples = live.get(pid, [])
            first = [r for t, r in samples if start <= t < start + third]
            last = [r for t, r in samples if end - third <= t <= end]
            seen = [t for t, _ in self.series[(name, pid)]]
            out.append(
                {
                    "process": name,
                    "pid": pid,
                    "in_stage": min(seen) <= end and max(seen) >= start,
                    "peak_mib": round(max(r for _, r in self.series[(name, pid)])),
                    "measure": "live heap" if name in JVM_ROLES else "resident",
                    "first_third_mib": round(max(first)) if first else None,
                    "last_third_mib": round(max(last)) if last else None,
                }
            )
        return out


def task_result_bytes(event_log_dir: Path) -> dict[int, int]:
    """Stage id -> the total ``Result Size`` of its finished tasks, from the event log under
    ``event_log_dir`` (Spark 4 writes a directory of rolled ``events_*`` files; the run turns compression
    off): the bytes the executors sent back to the driver as task results."""
    files = sorted(event_log_dir.glob("*/events_*"))
    assert files, f"no event log under {event_log_dir}"
    by_stage: dict[int, int] = defaultdict(int)
    for file in files:
        for line in file.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskEnd":
                by_stage[event["Stage ID"]] += (event.get("Task Metrics") or {}).get("Result Size", 0)
    return dict(by_stage)


@pytest.fixture(scope="module")
def scale_input(module_tmp_path):
    """2M rows of four float features and an int64 id (row groups of 250k), and the TorchScript MLP."""
    import torch

    root = module_tmp_path
    rng = np.random.default_rng(11)
    table = pa.table(
        {
            "account_id": np.arange(ROWS, dtype=np.int64),
            **{name: rng.normal(size=ROWS) for name in TinyTabular.FEATURES},
        }
    )
    source = root / "accounts.parquet"
    pq.write_table(table, source, row_group_size=250_000)
    module = TinyTabular.module()
    model = root / "model.pt"
    torch.jit.save(torch.jit.script(module), str(model))
    return root, source, table, module, model


@pytest.fixture(scope="module")
def scale_run(scale_input):
    """The CLI run, sampled: ``(exit code, run, sampler, report, output path, event log dir)``."""
    root, source, _, _, model = scale_input
    output, report, events = root / "scores", root / "report.json", root / "events"
    events.mkdir()
    gc_logs = root / "gc"
    gc_logs.mkdir()
    gc_log = f"-Xlog:gc:file={gc_logs}/gc-%p.log:time"
    cmd = [
        str(Path(sys.executable).with_name("lakescore")),
        "score",
        "--input",
        str(source),
        "--output",
        str(output),
        "--task",
        "tabular",
        "--model",
        str(model),
        "--id-col",
        "account_id",
        "--feature-prefix",
        "feature_",
        "--report",
        str(report),
        "--set",
        f"spark.master={MASTER}",
        "--set",
        f"spark.warehouse_dir={root / 'wh'}",
        "--set",
        "spark.conf.spark.ui.enabled=false",
        "--set",
        "spark.conf.spark.eventLog.enabled=true",
        "--set",
        f"spark.conf.spark.eventLog.dir={events.as_uri()}",
        "--set",
        "spark.conf.spark.eventLog.compress=false",
        "--set",
        f"spark.conf.spark.driver.extraJavaOptions={gc_log}",
        "--set",
        f"spark.conf.spark.executor.extraJavaOptions={gc_log}",
    ]
    run = CliRun(cmd, root, root / "scale.log")
    sampler = MemorySampler(run, gc_logs)
    sampler.start()
    code = run.wait()
    sampler.stop()
    return code, run, sampler, json.loads(report.read_text()) if report.exists() else None, output, events


def _published(output: Path) -> pd.DataFrame:
    """The output's current rows, from its Delta log (one commit: a fresh table's publish)."""
    (commit,) = sorted((output / "_delta_log").glob("*.json"))
    files = [json.loads(line)["add"]["path"] for line in commit.read_text().splitlines() if '"add"' in line]
    return pd.concat(
        [pd.read_parquet(output / f, columns=["account_id", "prediction", "scores"]) for f in files], ignore_index=True
    )


def test_two_million_rows_publish_exactly_with_flat_memory_and_no_driver_rows(scale_run, scale_input):
    import torch

    code, run, sampler, report, output, events = scale_run
    _, _, table, module, _ = scale_input
    assert code == 0, run.text()[-4000:]
    assert (report["input_rows"], report["output_rows"], report["error_rows"]) == (ROWS, ROWS, 0)

    out = _published(output)
    assert len(out) == ROWS and out["account_id"].is_unique and out["account_id"].min() == 0
    assert out["account_id"].max() == ROWS - 1
    sample = out.sample(1000, random_state=3).sort_values("account_id")
    features = table.select(list(TinyTabular.FEATURES)).take(pa.array(sample["account_id"])).to_pandas().to_numpy()
    with torch.no_grad():
        expected = module(torch.as_tensor(features, dtype=torch.float32)).double().numpy()
    assert np.allclose(np.stack(sample["scores"].to_list()), expected, atol=1e-5)
    assert sample["prediction"].tolist() == expected.argmax(axis=1).astype(float).tolist()

    assert set(sampler.marks) == {"start", "end"}, f"the scoring stage's log lines never appeared: {sampler.marks}"
    rows = sampler.rows()
    roles = {r["process"] for r in rows}
    assert {"driver Python", "driver JVM", "executor JVM", "Python worker"} <= roles, rows
    # The executors that scored: exactly the cluster's two, none lost and replaced while scoring. An
    # executor JVM that starts only after the stage (the standalone master can replace an executor that
    # exits at sc.stop before the application is unregistered: SPARK-937) scored nothing: it is listed, not
    # measured.
    scoring_jvms = [r for r in rows if r["process"] in JVM_ROLES and r["in_stage"]]
    assert sum(r["process"] == "executor JVM" for r in scoring_jvms) == 2, rows
    unprobed = [r for r in scoring_jvms if r["first_third_mib"] is None or r["last_third_mib"] is None]
    assert not unprobed, f"no full GC logged in a third of the scoring stage: {unprobed}"
    grew = [
        r
        for r in rows
        if r["first_third_mib"] is not None
        and r["last_third_mib"] is not None
        and r["last_third_mib"] > r["first_third_mib"] + max(FLAT_SLACK_MIB, FLAT_SLACK_SHARE * r["first_third_mib"])
    ]
    result_bytes = task_result_bytes(events)
    largest_stage = max(result_bytes, key=result_bytes.get)
    driver_cpu = sampler.marks["end"][1] - sampler.marks["start"][1]
    scoring_seconds = report["step_seconds"]["score_stage"]
    summary = _summary(rows, report, result_bytes, driver_cpu, scoring_seconds)
    print("\n" + summary)
    if os.environ.get("LAKESCORE_SCALE_OUT"):
        Path(os.environ["LAKESCORE_SCALE_OUT"]).write_text(summary + "\n")

    assert not grew, f"memory grew while rows streamed through:\n{summary}"
    assert result_bytes[largest_stage] < MAX_STAGE_RESULT_BYTES, (
        f"stage {largest_stage} sent the driver rows:\n{summary}"
    )
    assert driver_cpu < 0.1 * scoring_seconds, f"the driver Python worked {driver_cpu:.1f} CPU s while scoring"


def _summary(
    rows: list[dict], report: dict, result_bytes: dict[int, int], driver_cpu: float, scoring_seconds: float
) -> str:
    """The figures as a Markdown table and a line of totals."""
    lines = [
        "| process | pid | peak resident MiB | flatness measure | scoring 1st third MiB | scoring last third MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["process"] != "other":
            lines.append(
                f"| {r['process']} | {r['pid']} | {r['peak_mib']} | {r['measure']} | {r['first_third_mib']} "
                f"| {r['last_third_mib']} |"
            )
    lines.append(
        f"\n{ROWS} rows on {MASTER}: run {report['seconds']} s ({report['rows_per_second']} rows/s), scoring stage "
        f"{scoring_seconds} s ({ROWS / scoring_seconds:.0f} rows/s); task results to the driver "
        f"{sum(result_bytes.values()) / 1024:.0f} KiB in {len(result_bytes)} stages (largest stage "
        f"{max(result_bytes.values()) / 1024:.0f} KiB); "
        f"driver Python CPU while scoring {driver_cpu:.1f} s"
    )
    return "\n".join(lines)
