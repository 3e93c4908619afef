"""What a run used and cost (:mod:`lakescore.jobs.cost`): the arithmetic, and where the report shows it."""

from __future__ import annotations

import re

import pytest

from lakescore.jobs.commands.history import RunRecord, format_history
from lakescore.jobs.config import ConfigError, load_config
from lakescore.jobs.cost import SessionResources, cost_text, run_cost, session_cores
from lakescore.jobs.report.html import render_html
from lakescore.jobs.report.model import RunReport


def test_cores_of_a_session_count_the_driver_unless_it_shares_the_local_executor():
    assert session_cores("local[4]", 4, driver_cores=2) == 4
    assert session_cores("local", 1) == 1
    assert session_cores("local-cluster[2,1,1024]", 2) == 3  # executor JVMs beside the driver's
    assert session_cores("spark://host:7077", 32, driver_cores=4) == 36
    assert session_cores(None, 8) == 9  # a session that hides its master (serverless): counted as a cluster


def test_the_run_and_its_scoring_stage_count_the_cores_they_held_and_the_model_its_busy_time():
    # The stage's figure is its own wall time on the cores its tasks held (4 slots of 2 CPUs), not the model's
    # summed forward seconds, which are a figure of their own.
    resources = SessionResources(cores=9, executor_cores=8, task_cpus=2)
    cost = run_cost(seconds=100.0, stage_seconds=60.0, worker_seconds=300.0, rows_scored=45_000, resources=resources)
    assert cost["cores"] == 9 and cost["stage_cores"] == 8 and cost["gpus"] == 0
    assert cost["core_seconds"] == {"run": 900.0, "score_stage": 480.0, "model": 600.0}
    assert cost["gpu_seconds"] == {"run": 0.0, "score_stage": 0.0, "model": 0.0}
    assert cost["rows_per_core_second"] == 50.0
    assert "cost" not in cost and "cost_per_million_rows" not in cost  # no price set: no cost


def test_prices_give_the_run_cost_and_per_million_rows_with_an_unset_price_counting_zero():
    resources = SessionResources(cores=4, executor_cores=4, task_cpus=1, task_gpus=0.5)
    cost = run_cost(
        seconds=3600.0,
        stage_seconds=3000.0,
        worker_seconds=7200.0,
        rows_scored=2_000_000,
        resources=resources,
        gpus=2,
        price_per_core_hour=0.05,
        price_per_gpu_hour=2.0,
    )
    assert cost["gpu_seconds"] == {
        "run": 7200.0,
        "score_stage": 6000.0,
        "model": 3600.0,
    }  # two GPUs held; half a GPU per task
    assert cost["cost"] == pytest.approx(4 * 0.05 + 2 * 2.0)
    assert cost["cost_per_million_rows"] == pytest.approx((4 * 0.05 + 2 * 2.0) / 2)
    gpu_only = run_cost(
        seconds=3600.0,
        stage_seconds=0.0,
        worker_seconds=0.0,
        rows_scored=0,
        resources=resources,
        gpus=1,
        price_per_gpu_hour=3.0,
    )
    assert gpu_only["cost"] == 3.0 and gpu_only["cost_per_million_rows"] is None  # nothing scored: no per-row figure
    assert gpu_only["rows_per_core_second"] is None


def test_prices_are_declared_in_the_schema_and_refused_when_negative():
    cfg = load_config(flags={"resources.price_per_core_hour": 0.04, "resources.price_per_gpu_hour": 2.5})
    assert (cfg.resources.price_per_core_hour, cfg.resources.price_per_gpu_hour) == (0.04, 2.5)
    with pytest.raises(ConfigError, match="price_per_core_hour"):
        load_config(flags={"resources.price_per_core_hour": -1})


def _report(cost: dict) -> RunReport:
    return RunReport(
        run_id="r1",
        status="succeeded",
        task="embed",
        input="in",
        output="out",
        model_id="m",
        model_revision=None,
        model_sha256="ab" * 32,
        input_rows=1000,
        output_rows=1000,
        error_rows=0,
        rows_scored=1000,
        seconds=20.0,
        step_seconds={"score_stage": 8.0},
        cost=cost,
    )


def test_summary_html_and_history_show_what_the_run_used_and_cost():
    cost = run_cost(
        seconds=20.0,
        stage_seconds=8.0,
        worker_seconds=6.0,
        rows_scored=1000,
        resources=SessionResources(2, 2, 1),
        price_per_core_hour=0.36,
    )
    report = _report(cost)
    line = "  " + cost_text(cost)
    assert line in report.summary().splitlines()
    assert cost_text(cost) == (
        "core-s: 40.0 whole run (2 cores), 16.0 scoring stage (2 cores), 6.0 in model forward "
        "passes; 25.0 rows/core-s (whole run); cost 0.004 (4 per million rows)"
    )

    page = render_html(report.as_dict())
    cells = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page))
    assert "<h3 id=cost>" in page and cells["core-seconds, whole run (held: wall × the session&#x27;s)"] == "40.0"
    assert cells["core-seconds, scoring stage (held: its wall × its tasks&#x27;)"] == "16.0"
    assert cells["core-seconds, in model forward passes (busy: summed over tasks)"] == "6.0"
    assert "<th>cost per million rows scored</th><td>4</td>" in page and "GPU-seconds" not in page

    record = RunRecord("r1", "2026-11-26 08:00:00", "WRITE", 0, 1000, "r1.json", report.as_dict())
    header, row = format_history([record]).splitlines()
    assert header.split()[8:11] == ["seconds", "core-s", "cost"]
    assert row.split()[7:10] == ["20.0", "40", "0.004"]


def test_a_gpu_run_shows_its_gpu_seconds():
    cost = run_cost(
        seconds=10.0,
        stage_seconds=9.0,
        worker_seconds=8.0,
        rows_scored=100,
        resources=SessionResources(8, 8, 4),
        gpus=1,
    )
    assert cost_text(cost).startswith(
        "core-s: 80.0 whole run (8 cores), 72.0 scoring stage (8 cores), 32.0 in model "
        "forward passes; GPU-s: 10.0 whole run (1 GPU), 9.0 scoring stage (1 GPU), 8.0 in"
    )
    page = render_html(_report(cost).as_dict())
    assert "<th>GPU-seconds, scoring stage (held: its wall × its tasks&#x27;)</th><td>9.0</td>" in page


def test_a_report_from_before_the_model_figure_still_reads():
    old = {"cores": 2, "gpus": 0, "core_seconds": {"score_stage": 6.0, "run": 40.0}, "rows_per_core_second": 25.0}
    assert cost_text(old) == "core-s: 40.0 whole run (2 cores), 6.0 scoring stage; 25.0 rows/core-s (whole run)"
    assert "<th>core-seconds, scoring stage (held: its wall × its tasks&#x27;)</th><td>6.0</td>" in render_html(
        _report(old).as_dict()
    )
