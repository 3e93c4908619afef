"""``lakescore history``: runs found from the Delta history's lakescore tags, the metrics table and the stored
reports."""

from __future__ import annotations

import json

import pandas as pd

from lakescore.jobs.cli import main
from lakescore.jobs.report.files import write_report
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.steps.metrics import record_run
from lakescore.jobs.steps.staging import Staging
from tests.integration.held_run import run_held_at


def test_history_lists_published_and_failed_runs_and_shows_one(tmp_path, spark, job_config, capsys, monkeypatch):
    source = tmp_path / "in.parquet"
    pd.DataFrame({"review_id": [1, 2, 3], "body": ["good", "bad", "fine"]}).to_parquet(source)
    out = str(tmp_path / "scores")
    for run_id, extra in (("night-1", {}), ("night-2", {"validation.min_rows": 1000})):
        report_path = tmp_path / "reports" / f"{run_id}.json"
        cfg = job_config(input=str(source), output=out, run_id=run_id, report=str(report_path), **extra)
        record_run(spark, cfg, run_scoring(cfg, spark))  # the report and the metrics row, as the CLI writes them

    commit = spark.sql(f"DESCRIBE HISTORY delta.`{out}`").select("userMetadata").first()[0]
    assert json.loads(commit) == {
        "lakescore": {"run_id": "night-1", "report": str(tmp_path / "reports" / "night-1.json")}
    }

    assert main(["history", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["run", "id", "date", "(UTC)"]
    second, first = (line.split() for line in lines[1:])
    # The last columns: the Delta version, the attempt, and the drift figures against the output as each run found it.
    # night-2 published nothing, not even its errors table: its metrics row tells.
    assert (second[0], second[3], second[4:7], second[-4:]) == (
        "night-2",
        "validation_failed",
        ["3", "3", "0"],
        ["-", "1", "id_cosine_p5", "1.000"],
    )
    assert (first[0], first[3], first[4:7], first[-3:]) == ("night-1", "succeeded", ["3", "3", "0"], ["0", "1", "-"])
    assert float(first[8].replace(",", "")) > 0 and first[9] == "-"  # the run's core-seconds; no price, no cost
    assert len(lines) == 3

    assert main(["history", out, "--run", "night-1"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("run night-1: succeeded\n")
    assert f"HTML report: {tmp_path / 'reports' / 'night-1.html'}\n" in shown + "\n"

    assert main(["history", out, "--run", "night-9"]) == 2
    assert "no run 'night-9' in this output's history (recent runs: night-2, night-1)" in capsys.readouterr().err

    # night-2's staging waits for a rerun of night-2. Once a later run publishes, none will: night-3 removes it and
    # says so, in its report and in history. Staging committed after night-3 started (a run beside it) stays.
    staging_root = tmp_path / "_lakescore_staging" / "scores"
    (stale,) = staging_root.iterdir()
    beside = Staging.for_output(spark, out, None, "f" * 20, 1)
    report_path = tmp_path / "reports" / "night-3.json"
    cfg = job_config(input=str(source), output=out, run_id="night-3", report=str(report_path))
    report = run_held_at(spark, cfg, "publish", tmp_path / "barrier", lambda: beside.write(spark.range(1)), monkeypatch)
    write_report(report, report_path)
    assert report.status == "succeeded" and [p.name for p in staging_root.iterdir()] == ["f" * 20]
    assert report.staging_removed == [str(stale)]
    assert main(["history", out, "--run", "night-3"]) == 0
    assert f"  removed stale staging of earlier runs: {stale}\n" in capsys.readouterr().out
