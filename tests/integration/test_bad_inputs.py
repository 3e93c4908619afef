"""No row, name or keystroke takes a run down: each bad input gets a scored row, a dead-lettered row with a
reason, or one line (exit 2) before compute; a failed or interrupted run leaves nothing that blocks the next.

Real local Spark + Delta, the real CLI (in-process where a signal is not needed), real models."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakescore.jobs.cli import main
from lakescore.jobs.steps.staging import Staging
from tests.integration.test_score_job import read_output, reviews_frame

INVALID_UTF8 = [b"\xff\xfe broken", b"lone surrogate \xed\xa0\x80"]


def _score(tmp_path, source, output, model, *extra: str) -> list[str]:
    return [
        "score",
        "--input",
        str(source),
        "--output",
        str(output),
        "--model",
        str(model),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--report",
        str(tmp_path / "report.json"),
        *extra,
    ]


def _unfinished_report(tmp_path, status: str, step: str | None = None) -> dict:
    """The JSON report of a run that did not finish (in ``step``; ``None``: any), checked to state what is known (when
    it started, how long it ran, its steps' times, where it stopped and why) and, in its HTML page, nothing about
    rows, validation or dead letters, which were never determined."""
    report = json.loads((tmp_path / "report.json").read_text())
    step = step or report["failed_step"]
    assert report["status"] == status and report["failed_step"] == step and report["error"]
    assert report["started_at"] and report["seconds"] >= report["step_seconds"][step] >= 0, report
    assert report["input_rows"] is None and report["validation"] is None and report["rows_per_second"] is None
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert re.findall(r'<section id="([^"]+)"', page) == ["identity", "time"]
    assert f"<th>stopped in step</th><td>{step}</td>" in page and f"before it stopped in step {step}" in page
    for claim in ("Dead-lettered", "every input row", "Validation", "Not run", "Rows:", "rows/s"):
        assert claim not in page, claim
    return report


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lakescore:")]
    assert len(err) == 1, err
    return err[0]


def _cli(tmp_path, *args: str) -> list[str]:
    """The console script with ``args``, building a session of its own: warehouse under ``tmp_path``, so the JVM's
    log goes to ``tmp_path / "logs"``."""
    return [
        str(Path(sys.executable).with_name("lakescore")),
        *args,
        "--set",
        f"spark.warehouse_dir={tmp_path / 'wh'}",
        "--set",
        "spark.master=local[2]",
        "--set",
        "spark.conf.spark.ui.enabled=false",
    ]


def _run(command: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _failure_lines(stderr: str) -> list[str]:
    """What a failing run printed on stderr besides lakescore's INFO progress lines (timestamped off a terminal)."""
    return [line for line in stderr.splitlines() if " INFO lakescore" not in line]


def _details(line: str, tmp_path) -> str:
    """The log file a failure line names (``(details: <log>)`` at its end), checked to be the session's own."""
    assert line.endswith(")") and " (details: " in line, line
    log = Path(line[line.rindex(" (details: ") + len(" (details: ") : -1])
    assert log.parent == tmp_path / "logs" and log.is_file(), line
    return log.read_text()


def test_invalid_utf8_rows_are_dead_lettered_and_their_neighbours_scored(tmp_path, spark, tiny_classifier_dir):
    frame = reviews_frame(30, seed=2)
    bodies = [t.encode() for t in frame["body"]]
    bodies[3], bodies[17] = INVALID_UTF8
    source = tmp_path / "reviews.parquet"
    body = pa.array(bodies, pa.binary()).view(pa.string())  # bytes Spark and Parquet accept as a string column
    pq.write_table(pa.table({"review_id": pa.array(frame["review_id"], pa.int64()), "body": body}), source)
    output = tmp_path / "out" / "labels"
    code = main(
        _score(tmp_path, source, output, tiny_classifier_dir, "--task", "classify", "--set", "max_error_rate=0.1")
    )
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["output_rows"], report["error_rows"], report["error_reasons"]) == (28, 2, {"invalid_text": 2})
    errors = read_output(spark, str(output) + "_errors")
    assert errors["review_id"].tolist() == [frame["review_id"][3], frame["review_id"][17]]
    assert errors["input"].tolist() == ["\\xff\\xfe broken", "lone surrogate \\xed\\xa0\\x80"]
    assert set(errors["reason"]) == {"invalid_text"} and errors["error"].str.contains("not valid UTF-8").all()
    # A successful run leaves no empty staging folders behind.
    assert not (output.parent / "_lakescore_staging").exists()


@pytest.mark.parametrize("run_id", ["ends-with\\", "x" * 10_000, "two\nlines", "quote'd", "sp ace"])
def test_run_ids_that_would_break_the_write_are_refused_before_compute(tmp_path, spark, minilm_dir, capsys, run_id):
    source = tmp_path / "reviews.parquet"
    reviews_frame(5).to_parquet(source)
    output = tmp_path / "out"
    code = main(_score(tmp_path, source, output, minilm_dir, "--write-mode", "replace_run", "--run-id", run_id))
    assert code == 2
    line = _one_error_line(capsys)
    assert line.startswith("lakescore: error: run_id must be 1-128 characters") and len(line) < 400
    assert not output.exists()


def test_output_that_is_or_sits_inside_the_input_is_refused(tmp_path, spark, minilm_dir, capsys):
    source = tmp_path / "reviews"
    spark.createDataFrame(reviews_frame(5)).write.format("delta").save(str(source))
    assert main(_score(tmp_path, source, source, minilm_dir)) == 2
    assert "is the input: the run would overwrite what it reads" in _one_error_line(capsys)
    assert main(_score(tmp_path, source, source / "scored", minilm_dir)) == 2
    assert "is inside the input directory" in _one_error_line(capsys)
    assert "is inside the input directory" in _unfinished_report(tmp_path, "failed", "startup")["error"]
    assert not (source / "scored").exists() and not (source.parent / "reviews_errors").exists()
    assert spark.read.format("delta").load(str(source)).count() == 5  # the source is untouched


def test_an_output_left_by_a_failed_first_publish_does_not_block_the_next_run(tmp_path, spark, minilm_dir):
    source = tmp_path / "reviews.parquet"
    reviews_frame(12).to_parquet(source)
    output = tmp_path / "out"
    (output / "_delta_log" / "_staged_commits").mkdir(parents=True)  # what a commit cut short leaves
    assert main(_score(tmp_path, source, output, minilm_dir)) == 0
    assert len(read_output(spark, str(output))) == 12


def test_a_corrupt_input_file_exits_2_naming_it_and_writes_a_failed_report(tmp_path, spark, minilm_dir):
    """The CLI as a user runs it: the executors' stack traces go to the run's log file, not the console."""
    source = tmp_path / "reviews"
    source.mkdir()
    reviews_frame(10).to_parquet(source / "part-0.parquet")
    (source / "part-1.parquet").write_bytes(b"PAR1" + b"\x00" * 64)  # truncated: no footer
    output = tmp_path / "out"
    result = _run(_cli(tmp_path, *_score(tmp_path, source, output, minilm_dir)), tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = _failure_lines(result.stderr)
    assert len(lines) <= 3, result.stderr[-3000:]
    assert lines[-1].startswith("lakescore: error: cannot read input file ") and "part-1.parquet" in lines[-1], lines
    assert "is not a Parquet file" in lines[-1]  # the reader's root cause
    log = _details(lines[-1], tmp_path)
    assert "ERROR Executor: Exception in task" in log and "Traceback (most recent call last)" in log
    assert not output.exists() and not (Path(str(output) + "_errors")).exists()
    report = _unfinished_report(tmp_path, "failed", "prepare")
    assert "part-1.parquet" in report["error"] and set(report["step_seconds"]) == {"startup", "read_check", "prepare"}
    assert report["log_file"] == lines[-1].rsplit(" (details: ", 1)[1][:-1]


def _on_own_tmpfs(mountpoint: Path, options: str) -> list[str]:
    """A command prefix that runs a command with a tmpfs of its own (``mount -o options``) on ``mountpoint``, in a
    mount namespace of its own: a real full or read-only filesystem, which binds root too (chmod does not), seen only
    by that command and gone with it. A user namespace maps an unprivileged user to root for the mount."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here to give the run a filesystem of its own")
    unshare = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    mount = f'mount -t tmpfs -o {options} tmpfs "{mountpoint}"'
    allowed = subprocess.run([*unshare, "sh", "-c", mount], capture_output=True, text=True)
    if allowed.returncode != 0:
        pytest.skip(f"the OS forbids mounting a tmpfs in a mount namespace here: {allowed.stderr.strip()}")
    return [*unshare, "sh", "-c", f'{mount} && exec "$@"', "sh"]


def _score_onto_own_tmpfs(tmp_path: Path, name: str, options: str, model) -> tuple[Path, subprocess.CompletedProcess]:
    """Score 12 rows with the CLI into ``<name>/out``, where ``<name>`` is a tmpfs of the run's own (``options``)."""
    source = tmp_path / "reviews.parquet"
    reviews_frame(12).to_parquet(source)
    mountpoint = tmp_path / name
    mountpoint.mkdir()
    command = _cli(tmp_path, *_score(tmp_path, source, mountpoint / "out", model, "--task", "classify"))
    return mountpoint, _run(_on_own_tmpfs(mountpoint, options) + command, tmp_path)


def test_an_output_on_a_read_only_filesystem_is_refused_before_compute(tmp_path, spark, tiny_classifier_dir):
    read_only, result = _score_onto_own_tmpfs(tmp_path, "read-only", "ro,size=1m", tiny_classifier_dir)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"lakescore: error: cannot write output '{read_only / 'out'}': read-only file system"
    ]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "failed" and report["failed_step"] == "read_check"  # before the model preflight ended


def test_a_full_disk_names_the_cause_in_one_line_and_keeps_the_traces_in_the_log(tmp_path, spark, tiny_classifier_dir):
    full, result = _score_onto_own_tmpfs(tmp_path, "full", "size=4k", tiny_classifier_dir)  # room for directories only
    assert result.returncode == 3, result.stderr[-3000:]
    lines = _failure_lines(result.stderr)
    assert len(lines) <= 3, result.stderr[-3000:]
    assert lines[-1].startswith(f"lakescore: error: no space left on device writing file:{full}/"), lines
    log = _details(lines[-1], tmp_path)
    assert "java.io.IOException: No space left on device" in log and "Traceback (most recent call last)" in log
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["error"].startswith(f"no space left on device writing file:{full}/") and report["log_file"]


def test_interrupt_stops_with_one_line_and_the_rerun_resumes(tmp_path, minilm_dir, spark):
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group (the CLI, the JVM, the workers)."""
    source = tmp_path / "reviews.parquet"
    frame = reviews_frame(120, seed=4)
    frame.to_parquet(source)
    output, staging = tmp_path / "out", tmp_path / "staging"
    cmd = _cli(
        tmp_path,
        *_score(tmp_path, source, output, minilm_dir),
        "--set",
        "write.chunk_rows=30",
        "--set",
        f"write.staging={staging}",
        "--run-date",
        "2026-11-23",
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    first = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.time() + 300

    def chunk_staged():  # the staging table's first commit (not that of the chunked rows beside it, ..._rows)
        return [p for p in staging.glob("*/_delta_log/00000000000000000000.json") if not p.parts[-3].endswith("_rows")]

    while time.time() < deadline and not chunk_staged():
        assert first.poll() is None, first.stderr.read()[-3000:]
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("lakescore:")]
    assert len(lines) == 1 and lines[0].startswith("lakescore: interrupted "), err[-3000:]
    assert lines[0].endswith("rerun the same command to resume") and "Traceback" not in err
    report = _unfinished_report(tmp_path, "interrupted")  # in the scoring step, unless the signal came late
    assert report["chunks"]["staging"].startswith(str(staging))
    assert not output.exists()
    # In the write.staging folder, which other outputs may share: an older run key's staging of this output goes
    # with the rerun's publish, another output's stays.
    ours = Staging.for_output(spark, str(output), str(staging), "d" * 20, 1)
    theirs = Staging.for_output(spark, str(tmp_path / "other"), str(staging), "e" * 20, 1)
    for table in (ours, theirs):
        table.write(spark.range(1))

    assert main(cmd[1:]) == 0  # the rerun, in this process's session (the same command, a warm JVM)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "succeeded" and report["chunks"]["skipped"] >= 1
    assert [p.name for p in staging.iterdir()] == ["e" * 20] and report["staging_removed"] == [ours.location]
    out = read_output(spark, str(output))
    assert sorted(out["review_id"]) == sorted(frame["review_id"])


# ---------------------------------------------------------------- widened: sizes, invisible text, id types, wide tables

ZWJ_ONLY = "\u200d" * 50
HUGE_TEXT = ("lorem ipsum dolor sit amet " * 80_000)[: 2 * 1024 * 1024]  # 2 MiB of words


def test_hostile_shapes_in_one_run_are_scored_exactly_and_only_needed_columns_are_read(
    tmp_path, spark, tiny_classifier_dir
):
    """One input with a 2 MiB text, a row of only zero-width joiners, string ids with leading zeros and trailing
    spaces, a struct column and 5,000 columns the run does not use: every row is scored under its exact id, and the
    scoring stage reads the id and the text column only (its physical plan's ReadSchema)."""
    from lakescore.jobs.config import load_config
    from lakescore.jobs.steps.read import open_input
    from lakescore.jobs.steps.score import score_dataframe

    frame = reviews_frame(12, seed=8)
    ids = ["007", "7", "7 ", " 7", "0007 ", "08", *[f"id-{i}" for i in range(6)]]
    bodies = [HUGE_TEXT, ZWJ_ONLY, *frame["body"].tolist()[2:]]
    unused = {f"unused_{i}": pa.array(range(len(ids)), pa.int32()) for i in range(5000)}
    meta = pa.array([{"lang": "en", "tags": ["a", "b"]}] * len(ids))
    source = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"review_id": pa.array(ids), "body": pa.array(bodies), "meta": meta, **unused}), source)
    output = tmp_path / "out" / "labels"
    code = main(_score(tmp_path, source, output, tiny_classifier_dir, "--task", "classify"))
    assert code == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["input_rows"], report["output_rows"], report["error_rows"]) == (12, 12, 0)
    out = read_output(spark, str(output))
    assert sorted(out["review_id"]) == sorted(ids)  # byte for byte: zeros and spaces kept, "7" and "7 " distinct
    assert out["label"].notna().all()

    cfg = load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "classify",
            "model.source": str(tiny_classifier_dir),
            "id_col": "review_id",
            "text_col": "body",
        }
    )
    run = open_input(cfg, spark)
    scoring = score_dataframe(run.source, cfg, run.spec, ["review_id"], run.input_cols)
    plan = scoring._jdf.queryExecution().executedPlan().toString()
    read_schemas = [line.split("ReadSchema: ", 1)[1] for line in plan.splitlines() if "ReadSchema: " in line]
    assert read_schemas == ["struct<review_id:string,body:string>"], read_schemas


def test_decimal_ids_are_kept_exact(tmp_path, spark, tiny_classifier_dir):
    from decimal import Decimal

    ids = [Decimal("1.10"), Decimal("12345678901234567890.01"), Decimal("0.00"), Decimal("-3.50")]
    source = tmp_path / "decimal.parquet"
    pq.write_table(
        pa.table({"review_id": pa.array(ids, pa.decimal128(24, 2)), "body": pa.array(["good", "bad", "fine", "meh"])}),
        source,
    )
    output = tmp_path / "out"
    assert main(_score(tmp_path, source, output, tiny_classifier_dir, "--task", "classify")) == 0
    out = spark.read.format("delta").load(str(output))
    assert out.schema["review_id"].dataType.simpleString() == "decimal(24,2)"
    assert sorted(r[0] for r in out.select("review_id").collect()) == sorted(ids)


def test_a_binary_text_column_is_refused_before_compute_naming_its_type(tmp_path, spark, tiny_classifier_dir, capsys):
    source = tmp_path / "binary.parquet"
    pq.write_table(
        pa.table({"review_id": pa.array([1, 2], pa.int64()), "body": pa.array([b"ab", b"cd"], pa.binary())}), source
    )
    output = tmp_path / "out"
    assert main(_score(tmp_path, source, output, tiny_classifier_dir, "--task", "classify")) == 2
    line = _one_error_line(capsys)
    assert "body" in line and "binary" in line and "string" in line, line
    assert not output.exists() and not Path(f"{output}_errors").exists()
