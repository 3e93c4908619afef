"""What a run used and cost (:mod:`lakescore.jobs.cost`): the arithmetic, and where the report shows it."""

from __future__ import annotations

import pytest

from lakescore.jobs.commands.history import RunRecord, format_history
from lakescore.jobs.config import ConfigError, load_config
from lakescore.jobs.cost import SessionResources, cost_text, run_cost, session_cores
from lakescore.jobs.report import RunReport
from lakescore.jobs.report_html import render_html


def test_cores_of_a_session_count_the_driver_unless_it_shares_the_local_executor():
    assert session_cores("local[4]", 4, driver_cores=2) == 4
    assert session_cores("local", 1) == 1
    assert session_cores("local-cluster[2,1,1024]", 2) == 3  # executor JVMs beside the driver's
    assert session_cores("spark://host:7077", 32, driver_cores=4) == 36
    assert session_cores(None, 8) == 9  # a session that hides its master (serverless): counted as a cluster


def test_scoring_stage_counts_busy_task_time_and_the_run_counts_held_cores():
    resources = SessionResources(cores=9, executor_cores=8, task_cpus=2)
    cost = run_cost(seconds=100.0, worker_seconds=300.0, rows_scored=45_000, resources=resources)
    assert cost["cores"] == 9 and cost["gpus"] == 0
    assert cost["core_seconds"] == {"score_stage": 600.0, "run": 900.0}
    assert cost["gpu_seconds"] == {"score_stage": 0.0, "run": 0.0}
    assert cost["rows_per_core_second"] == 50.0
    assert "cost" not in cost and "cost_per_million_rows" not in cost  # no price set: no cost


def test_prices_give_the_run_cost_and_per_million_rows_with_an_unset_price_counting_zero():
    resources = SessionResources(cores=4, executor_cores=4, task_cpus=1, task_gpus=0.5)
    cost = run_cost(seconds=3600.0, worker_seconds=7200.0, rows_scored=2_000_000, resources=resources, gpus=2,
                    price_per_core_hour=0.05, price_per_gpu_hour=2.0)
    assert cost["gpu_seconds"] == {"score_stage": 3600.0, "run": 7200.0}  # half a GPU per task; two GPUs held
    assert cost["cost"] == pytest.approx(4 * 0.05 + 2 * 2.0)
    assert cost["cost_per_million_rows"] == pytest.approx((4 * 0.05 + 2 * 2.0) / 2)
    gpu_only = run_cost(seconds=3600.0, worker_seconds=0.0, rows_scored=0, resources=resources, gpus=1,
                        price_per_gpu_hour=3.0)
    assert gpu_only["cost"] == 3.0 and gpu_only["cost_per_million_rows"] is None  # nothing scored: no per-row figure
    assert gpu_only["rows_per_core_second"] is None


def test_prices_are_declared_in_the_schema_and_refused_when_negative():
    cfg = load_config(flags={"resources.price_per_core_hour": 0.04, "resources.price_per_gpu_hour": 2.5})
    assert (cfg.resources.price_per_core_hour, cfg.resources.price_per_gpu_hour) == (0.04, 2.5)
    with pytest.raises(ConfigError, match="price_per_core_hour"):
        load_config(flags={"resources.price_per_core_hour": -1})


def _report(cost: dict) -> RunReport:
    return RunReport(run_id="r1", status="succeeded", task="embed", input="in", output="out", model_id="m",
                     model_revision=None, model_sha256="ab" * 32, input_rows=1000, output_rows=1000, error_rows=0,
                     rows_scored=1000, seconds=20.0, step_seconds={"score_stage": 8.0}, cost=cost)


def test_summary_html_and_history_show_what_the_run_used_and_cost():
    cost = run_cost(seconds=20.0, worker_seconds=6.0, rows_scored=1000, resources=SessionResources(2, 2, 1),
                    price_per_core_hour=0.36)
    report = _report(cost)
    line = "  " + cost_text(cost)
    assert line in report.summary().splitlines()
    assert cost_text(cost) == "40.0 core-s (scoring stage 6.0), 25.0 rows/core-s; cost 0.004 (4 per million rows)"

    page = render_html(report.as_dict())
    assert "<h3 id=cost>" in page and "<th>core-seconds, whole run</th><td>40.0</td>" in page
    assert "<th>cost per million rows scored</th><td>4</td>" in page and "GPU-seconds" not in page

    record = RunRecord("r1", "2026-11-26 08:00:00", "WRITE", 0, 1000, "r1.json", report.as_dict())
    header, row = format_history([record]).splitlines()
    assert header.split()[8:11] == ["seconds", "core-s", "cost"]
    assert row.split()[7:10] == ["20.0", "40", "0.004"]


def test_a_gpu_run_shows_its_gpu_seconds():
    cost = run_cost(seconds=10.0, worker_seconds=8.0, rows_scored=100, resources=SessionResources(8, 8, 4), gpus=1)
    assert cost_text(cost).startswith("80.0 core-s (scoring stage 32.0), 10.0 GPU-s (scoring stage 8.0)")
    assert "<th>GPU-seconds, scoring stage</th><td>8.0</td>" in render_html(_report(cost).as_dict())
