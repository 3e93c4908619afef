"""``lakescore history``: runs found from the Delta history's lakescore tags and their stored reports."""

from __future__ import annotations

import json

import pandas as pd

from lakescore.jobs.cli import main
from lakescore.jobs.report import write_report
from lakescore.jobs.score_job import run_scoring


def test_history_lists_published_and_failed_runs_and_shows_one(tmp_path, spark, job_config, capsys):
    source = tmp_path / "in.parquet"
    pd.DataFrame({"review_id": [1, 2, 3], "body": ["good", "bad", "fine"]}).to_parquet(source)
    out = str(tmp_path / "scores")
    for run_id, extra in (("night-1", {}), ("night-2", {"validation.min_rows": 1000})):
        report_path = tmp_path / "reports" / f"{run_id}.json"
        cfg = job_config(input=str(source), output=out, run_id=run_id, report=str(report_path), **extra)
        write_report(run_scoring(cfg, spark), report_path)

    commit = spark.sql(f"DESCRIBE HISTORY delta.`{out}`").select("userMetadata").first()[0]
    assert json.loads(commit) == {"lakescore": {"run_id": "night-1", "report": str(tmp_path / "reports" / "night-1.json")}}

    assert main(["history", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["run", "id", "date", "(UTC)"]
    second, first = (line.split() for line in lines[1:])
    assert (second[0], second[3], second[4:7], second[-1]) == ("night-2", "validation_failed", ["3", "3", "0"], "-")
    assert (first[0], first[3], first[4:7], first[-1]) == ("night-1", "succeeded", ["3", "3", "0"], "0")
    assert len(lines) == 3

    assert main(["history", out, "--run", "night-1"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("run night-1: succeeded\n")
    assert f"HTML report: {tmp_path / 'reports' / 'night-1.html'}\n" in shown + "\n"

    assert main(["history", out, "--run", "night-9"]) == 2
    assert "no run 'night-9' in this output's history (recent runs: night-2, night-1)" in capsys.readouterr().err
