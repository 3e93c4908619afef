"""A real run through the real CLI (its own quiet JVM), its HTML report opened in real headless Chromium.

Hostile strings go in wherever a user, a table or a model can put text: the run id, the
model's directory and label names, and a dead-lettered row's text. The page must show
them as text, run no script, make no request beyond its own file and log no error.
The screenshot is kept in ``$LAKESCORE_SCREENSHOT_DIR`` when set (to look at it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from chromium_page import visit

SCRIPT = "<script>alert('text')</script>"
LABEL = "<img src=x onerror=alert('label')>"
RUN_ID = (
    "run-2026-11-23.browser_x"  # markup in a run id is refused before compute: the model dir, label and text carry it
)

FACTS = """(() => {
  const text = id => (document.getElementById(id) || {}).textContent || '';
  return {
    scripts: document.querySelectorAll('script').length,
    images: document.querySelectorAll('img').length,
    sections: [...document.querySelectorAll('section')].map(s => s.id),
    svgs: document.querySelectorAll('section svg').length,
    runId: text('run-id'), status: text('status'),
    identity: text('identity'), predictions: text('predictions'),
    deadLetters: text('dead-letters'), drift: text('drift'),
    validationRows: document.querySelectorAll('#validation tbody tr').length,
    failedChecks: document.querySelectorAll('#validation td.fail').length,
  };
})()"""


@pytest.fixture
def hostile_classifier(tmp_path, tiny_classifier_dir) -> Path:
    """The tiny classifier in a directory named like markup, with a label that is markup."""
    model = tmp_path / "model-<i onclick=alert('dir')>"
    shutil.copytree(tiny_classifier_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["id2label"]["0"] = LABEL
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (model / "config.json").write_text(json.dumps(config))
    return model


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, "-m", "lakescore.jobs.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_report_of_a_real_run_renders_in_chromium(tmp_path, hostile_classifier, spark):
    texts = ["great kettle", "broke after a week", "fine", "arrived late, works", SCRIPT] * 8
    frame = pd.DataFrame({"review_id": list(range(len(texts))), "body": texts})
    frame.loc[frame.index[-1], "review_id"] = 0  # a duplicated id: both copies dead-lettered, one with SCRIPT
    frame.loc[frame.index[-1], "body"] = SCRIPT
    frame.to_parquet(tmp_path / "reviews.parquet")
    result = run_cli(
        tmp_path,
        "score",
        "--task",
        "classify",
        "--input",
        "reviews.parquet",
        "--output",
        str(tmp_path / "scores"),
        "--model",
        str(hostile_classifier),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--run-id",
        RUN_ID,
        "--report",
        "reports/run.json",
        "--set",
        "max_error_rate=0.2",
        "--set",
        "spark.master=local[2]",
        "--set",
        f"spark.warehouse_dir={tmp_path / 'warehouse'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    html_file = tmp_path / "reports" / "run.html"
    assert f"report: {html_file}" in result.stdout
    # Quiet console: no JVM, Hive or Derby warning reached stderr, only lakescore's own lines.
    assert not [line for line in result.stderr.splitlines() if " lakescore" not in line], result.stderr[-3000:]

    report = json.loads((tmp_path / "reports" / "run.json").read_text())
    assert report["html_report"] == str(html_file) and report["error_reasons"] == {"duplicate_id": 2}
    assert report["step_seconds"]["report_data"] < 30

    page = visit(html_file.as_uri(), FACTS)
    if os.environ.get("LAKESCORE_SCREENSHOT_DIR"):
        Path(os.environ["LAKESCORE_SCREENSHOT_DIR"], "report-classify.png").write_bytes(page.screenshot)
    assert page.errors() == [] and page.dialogs == []
    assert page.requests == [html_file.as_uri()]  # self-contained: nothing else is fetched
    facts = page.facts
    assert facts["scripts"] == 0 and facts["images"] == 0  # the markup stayed text
    # no drift bound set and no baseline to compare: the page says nothing about drift (issue 45 item 13)
    assert facts["sections"] == ["identity", "rows", "time", "inputs", "predictions", "validation", "dead-letters"]
    assert facts["runId"] == RUN_ID and facts["status"] == "succeeded"
    assert "model-<i onclick=alert('dir')>" in facts["identity"] and "4.1.1" in facts["identity"]
    assert LABEL in facts["predictions"] and "L2 norm of probs" in facts["predictions"]
    assert SCRIPT in facts["deadLetters"] and "duplicate_id" in facts["deadLetters"]
    assert facts["drift"] == ""
    assert facts["validationRows"] == len(report["validation"]["checks"]) and facts["failedChecks"] == 0
    assert facts["svgs"] >= 8
    assert page.screenshot.startswith(b"\x89PNG") and len(page.screenshot) > 50_000


def test_the_browser_check_itself_catches_errors_and_requests(tmp_path):
    """The harness must fail a page that logs an error, throws, or loads something: else the test above proves
    nothing."""
    page_file = tmp_path / "bad.html"
    page_file.write_text("<!DOCTYPE html><img src='missing.png'><script>console.error('boom'); null.x</script>")
    page = visit(page_file.as_uri(), "document.querySelectorAll('img').length")
    errors = "\n".join(page.errors())
    assert "console.error: boom" in errors and "TypeError" in errors and re.search(r"missing\.png", errors)
    assert (tmp_path / "missing.png").as_uri() in page.requests and page.facts == 1


def test_verbose_brings_the_jvm_lines_back_and_default_stays_quiet(tmp_path, minilm_dir):
    missing = tmp_path / "no_such_dir"  # Spark warns with a stack trace while it looks for it
    args = [
        "score",
        "--input",
        str(missing),
        "--output",
        str(tmp_path / "o"),
        "--model",
        str(minilm_dir),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--set",
        f"spark.warehouse_dir={tmp_path / 'warehouse'}",
        "--set",
        "spark.master=local[1]",
    ]
    quiet = run_cli(tmp_path, *args)
    assert quiet.returncode == 2
    assert quiet.stderr.splitlines() == [
        f"lakescore: error: cannot read input '{missing}': [PATH_NOT_FOUND] Path does not exist: file:{missing}. "
        "SQLSTATE: 42K03"
    ]
    [log] = (tmp_path / "logs").glob("lakescore-*.log")  # the JVM's warning went to the run's log file instead
    assert "WARN FileStreamSink" in log.read_text() and "java.io.FileNotFoundException" in log.read_text()
    loud = run_cli(tmp_path, "-v", *args)
    assert loud.returncode == 2
    assert "Using incubator modules" in loud.stderr and "Using Spark's default log4j profile" in loud.stderr
