"""Kill the driver at every named point of a run, rerun the same command, and get exactly the uninterrupted result.

Each case runs ``lakescore score`` as a subprocess with ``LAKESCORE_TEST_KILL=<point>``
(:mod:`lakescore.jobs.testing_hooks`): the driver SIGKILLs itself there, as a platform kills a
driver (no ``finally``, no shutdown hook). The same command is then rerun (in this process, on the
test session's Spark: one JVM start per case, not two) and must: exit 0; put every input id exactly
once in output or errors; publish the predictions of one uninterrupted reference run (made once per
module); leave no staging behind; leave at most one publish commit tagged with the run id in the
output's history. One incremental case kills an incremental run between chunks.

The tiny seeded tabular model, 240 rows (a NaN feature and a null id among them), 3 chunks.
``-s`` shows the matrix (point, outcome, seconds); ``LAKESCORE_KILL_MATRIX_OUT=<file>`` writes it there too.

Each case starts a driver JVM of its own (~20-30 s on 2 cores), so ``make test`` runs the points marked
``in make test`` below (a kill inside a staging commit, and between the output's and the errors table's
commits: the idempotent publish) and the incremental case; ``LAKESCORE_KILL_MATRIX=all`` runs every point (README's
table).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lakescore.jobs.cli import main
from lakescore.jobs.platform.tables import delta_history
from lakescore.jobs.testing_hooks import KILL_ENV
from tests.conftest import TinyTabular

ROWS = 240
CHUNK_ROWS = 80  # 3 chunks
RUN_ID = "kill-matrix"
NAN_ID, NULL_ID_AT = 17, 30  # a bad feature (dead-lettered by the workers), a null id (refused before scoring)
REPO = Path(__file__).resolve().parents[2]
MATRIX_ENV = "LAKESCORE_KILL_MATRIX_OUT"
KILLED_RUN_TIMEOUT = 900

ALL_ENV = "LAKESCORE_KILL_MATRIX"
# (point, what it interrupts, in make test). "@s": the kill lands s seconds after the point, inside what runs next.
_ALL_POINTS = [
    ("read_check", "after startup, the model preflight launched", False),
    ("read_check@1.5", "during the model preflight", False),
    ("score_stage", "planned, nothing staged", False),
    ("chunk_committed:0", "after chunk 0's commit", False),  # also tests/integration/test_tasks_and_faults.py
    ("chunk_commit:1@0.4", "during chunk 1's commit", True),
    ("staging_pinned", "all chunks staged, pinned", False),
    ("validation_running@0.3", "during GX validation", False),
    ("publish_commit", "right before the publish commit", False),
    ("publish_committed", "after publish, before errors table", True),
    ("errors_committed", "after errors table, before staging drop", False),
]
POINTS = [(p, what) for p, what, fast in _ALL_POINTS if fast or os.environ.get(ALL_ENV) == "all"]
# Killed and rerun without --run-id: the rerun resumes a publish already committed under the killed run's
# generated id, and must go on as that run (its errors table and report name the id the output rows carry).
WITHOUT_RUN_ID = {"publish_committed"}

_matrix: list[tuple[str, str, str, float, float]] = []


def _frame(seed: int = 11) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.normal(size=(ROWS, 4)), columns=list(TinyTabular.FEATURES))
    frame.insert(0, "account_id", pd.array(np.arange(1, ROWS + 1), dtype="Int64"))
    frame.loc[frame["account_id"] == NAN_ID, "feature_b"] = np.nan
    frame.loc[NULL_ID_AT, "account_id"] = pd.NA
    return frame


def _args(
    source: Path, output: Path, script: Path, report: Path, *extra: str, run_id: str | None = RUN_ID
) -> list[str]:
    return [
        "score",
        "--task",
        "tabular",
        "--input",
        str(source),
        "--output",
        str(output),
        "--model",
        str(script),
        "--id-col",
        "account_id",
        "--feature-prefix",
        "feature_",
        *(["--run-id", run_id] if run_id else []),
        "--report",
        str(report),
        "--set",
        f"write.chunk_rows={CHUNK_ROWS}",
        "--set",
        "max_error_rate=0.05",
        *extra,
    ]


def _killed_run(args: list[str], workdir: Path, point: str) -> tuple[int, float, str]:
    """Run the CLI in a subprocess that kills itself at ``point``; ``(return code, seconds, log tail)``."""
    cmd = [
        str(Path(sys.executable).with_name("lakescore")),
        *args,
        "--set",
        f"spark.warehouse_dir={workdir / 'wh'}",
        "--set",
        "spark.master=local[2]",
        "--set",
        "spark.conf.spark.ui.enabled=false",
        "--set",
        "spark.conf.spark.sql.shuffle.partitions=2",
    ]
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "HF_HUB_OFFLINE": "1",
        KILL_ENV: point,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=KILLED_RUN_TIMEOUT)
    except subprocess.TimeoutExpired:  # a failure, never a "SIGKILL": this kill is the test's, not the point's
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"the run did not reach {point} within {KILLED_RUN_TIMEOUT} s:\n{out.decode(errors='replace')[-3000:]}"
        ) from None
    seconds = time.monotonic() - started
    try:  # what the driver left running (its JVM exits when the driver's pipe closes): gone before the rerun
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.returncode, seconds, out.decode(errors="replace")[-3000:]


def _table(spark, path: Path) -> pd.DataFrame:
    return spark.read.format("delta").load(str(path)).toPandas()


def _sorted(frame: pd.DataFrame, key: str = "account_id") -> pd.DataFrame:
    out = frame.sort_values(key, na_position="first").reset_index(drop=True)
    for name in out.columns:  # arrays (scores) compare as lists
        if out[name].map(lambda v: isinstance(v, np.ndarray)).any():
            out[name] = out[name].map(list)
    return out


@pytest.fixture(scope="module")
def matrix_input(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill-matrix")
    source = root / "accounts.parquet"
    frame = _frame()
    frame.to_parquet(source)
    return root, source, frame


@pytest.fixture(scope="module")
def reference(matrix_input, tiny_tabular, spark):
    """One uninterrupted run of the same command: output and errors tables."""
    root, source, _ = matrix_input
    output = root / "reference" / "risk"
    assert main(_args(source, output, tiny_tabular[1], root / "reference.json")) == 0
    return _sorted(_table(spark, output)), _sorted(_table(spark, Path(f"{output}_errors")))


@pytest.fixture(scope="module", autouse=True)
def print_matrix():
    """After the module: the matrix as a table on stdout (``-s``) and in ``$LAKESCORE_KILL_MATRIX_OUT``."""
    yield
    if not _matrix:
        return
    lines = ["| kill point | interrupts | killed run | rerun | kill run s | rerun s |", "|---|---|---|---|---|---|"]
    lines += [
        f"| `{p}` | {what} | {first} | {second} | {a:.1f} | {b:.1f} |" for p, what, first, second, a, b in _matrix
    ]
    text = "\n".join(lines)
    print("\nkill matrix (driver SIGKILLed at the point, then the same command rerun):\n" + text)
    if os.environ.get(MATRIX_ENV):
        Path(os.environ[MATRIX_ENV]).write_text(text + "\n")


def _assert_exact(
    spark, output: Path, frame: pd.DataFrame, ref_out: pd.DataFrame, ref_err: pd.DataFrame, run_id: str
) -> None:
    out, err = _sorted(_table(spark, output)), _sorted(_table(spark, Path(f"{output}_errors")))
    ids = list(out["account_id"].dropna()) + list(err["account_id"].dropna())
    assert sorted(ids) == sorted(frame["account_id"].dropna()) and len(out) + len(err) == len(frame)  # each id once
    assert err["account_id"].isna().sum() == 1  # the null-id row, once
    # The reference's predictions, ids and identity columns. The reference ran as RUN_ID: where this run's
    # id stands in for it (a run without --run-id), every row it wrote in either table carries that one id.
    as_reference = {"run_id": {run_id: RUN_ID}}
    pd.testing.assert_frame_equal(out.replace(as_reference), ref_out)
    pd.testing.assert_frame_equal(
        err.replace(as_reference).drop(columns=["error"], errors="ignore"),
        ref_err.drop(columns=["error"], errors="ignore"),
    )
    assert not (output.parent / "_lakescore_staging").exists(), list((output.parent / "_lakescore_staging").rglob("*"))[
        :5
    ]
    published = [h for h in delta_history(spark, str(output)) if h.run_id == run_id]
    assert len(published) == 1, published  # at most one publish commit of this run, never two


@pytest.mark.parametrize("point,what", POINTS, ids=[p for p, _ in POINTS])
def test_killed_driver_rerun_gives_the_uninterrupted_result(point, what, matrix_input, reference, tiny_tabular, spark):
    root, source, frame = matrix_input
    case = root / point.replace(":", "-").replace("@", "-at-")
    case.mkdir()
    output, report = case / "risk", case / "report.json"
    args = _args(source, output, tiny_tabular[1], report, run_id=None if point in WITHOUT_RUN_ID else RUN_ID)
    code, killed_seconds, log = _killed_run(args, case, point)
    assert code == -signal.SIGKILL, f"the run was not killed at {point} (exit {code}):\n{log}"
    started = time.monotonic()
    assert main(args) == 0
    rerun_seconds = time.monotonic() - started
    rerun = json.loads(report.read_text())
    assert rerun["run_id"] == RUN_ID or point in WITHOUT_RUN_ID
    _assert_exact(spark, output, frame, *reference, run_id=rerun["run_id"])
    resumed = rerun["chunks"]["skipped"]
    _matrix.append(
        (point, what, "SIGKILL", f"exit 0, exact ({resumed}/3 chunks resumed)", killed_seconds, rerun_seconds)
    )


def test_killed_incremental_run_between_chunks_reruns_to_the_uninterrupted_result(matrix_input, tiny_tabular, spark):
    """A full incremental run, then 200 rows change; the incremental run is killed after its first chunk, rerun,
    and equals the same incremental run made without a kill (on a copy of the first output)."""
    root, _, frame = matrix_input
    script = tiny_tabular[1]
    case = root / "incremental"
    case.mkdir()
    source, output, copy = case / "accounts.parquet", case / "risk", case / "reference" / "risk"
    frame.to_parquet(source)
    first = _args(source, output, script, case / "first.json", "--write-mode", "incremental")
    first[first.index("--run-id") + 1] = "first"
    assert main(first) == 0
    shutil.copytree(output, copy)
    shutil.copytree(Path(f"{output}_errors"), Path(f"{copy}_errors"))
    changed = frame.copy()
    changed.loc[changed.index[:200], "feature_a"] += 1.0  # 200 rows to score again: 3 chunks
    changed.to_parquet(source)

    assert main(_args(source, copy, script, case / "reference.json", "--write-mode", "incremental")) == 0
    args = _args(source, output, script, case / "report.json", "--write-mode", "incremental")
    code, killed_seconds, log = _killed_run(args, case, "chunk_committed:0")
    assert code == -signal.SIGKILL, f"the incremental run was not killed (exit {code}):\n{log}"
    started = time.monotonic()
    assert main(args) == 0
    rerun_seconds = time.monotonic() - started

    report = json.loads((case / "report.json").read_text())
    assert report["input_rows"] == report["rows_kept"] + report["rows_scored"] + report["error_rows"] == ROWS
    assert report["chunks"]["total"] == 3 and report["chunks"]["skipped"] >= 1
    ref_out, ref_err = _sorted(_table(spark, copy)), _sorted(_table(spark, Path(f"{copy}_errors")))
    _assert_exact(spark, output, changed, ref_out, ref_err, run_id=RUN_ID)
    _matrix.append(
        (
            "incremental: chunk_committed:0",
            "incremental MERGE run, after chunk 0",
            "SIGKILL",
            f"exit 0, exact ({report['chunks']['skipped']}/3 chunks resumed)",
            killed_seconds,
            rerun_seconds,
        )
    )
