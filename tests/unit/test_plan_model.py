"""``lakescore plan``'s prediction model: pure functions of the sample's token counts and the per-token cost."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

from lakescore.jobs.commands.plan import (
    SampleShape,
    UnitCost,
    _calibrate,
    format_plan,
    history_cost,
    predict,
    sample_shape,
)
from lakescore.jobs.cost import SessionResources, run_cost
from lakescore.udfs.batching import BatchPolicy, plan_batches
from lakescore.udfs.runners import MatrixRunner, TextRunner


def test_sample_shape_counts_the_batches_and_padded_tokens_the_batching_core_plans():
    costs = [5, 9, 9, 3, 40, 7, 7, 7]
    policy = BatchPolicy(max_tokens=27, max_rows=2)
    shape = sample_shape(costs, rows=10, policy=policy, prepare_seconds=0.2)
    batches = plan_batches(costs, policy)
    assert shape.batches == len(batches) == 5  # [40] [9 9] [7 7] [7 5] [3]: the row cap holds before the budget
    assert shape.padded == 40 + 2 * 9 + 2 * 7 + 2 * 7 + 3
    assert (shape.rows, int(shape.costs.sum()), shape.prepare_seconds) == (10, 87, 0.2)


def test_prediction_scales_the_sample_to_the_input_and_spreads_the_work_over_the_slots():
    shape = SampleShape(rows=200, costs=np.full(180, 20), batches=9, padded=4000, prepare_seconds=0.4)  # 20 nulls
    unit = UnitCost(seconds_per_token=0.0005, stage_seconds_per_chunk=3.0, fixed_seconds=12.0, source="t")
    one = predict(shape, 20_000, unit, SessionResources(cores=1, executor_cores=1, task_cpus=1))
    assert (one["rows"], one["rows_to_score"], one["tokens"]) == (20_000, 18_000, 360_000)
    assert (one["forward_batches"], one["padded_tokens"]) == (900, 400_000)
    forward, prepare = 400_000 * 0.0005, 0.4 * 100
    assert one["predicted_seconds"]["score_stage"] == pytest.approx(3.0 + forward + prepare)
    assert one["predicted_seconds"]["total"] == pytest.approx(12.0 + 3.0 + forward + prepare)

    four = predict(shape, 20_000, unit, SessionResources(cores=9, executor_cores=8, task_cpus=2), chunks=3)
    assert four["slots"] == 4
    assert four["predicted_seconds"]["score_stage"] == pytest.approx(3 * 3.0 + (forward + prepare) / 4)

    double = predict(shape, 40_000, unit, SessionResources(1, 1, 1))
    assert double["tokens"] == 2 * one["tokens"] and double["forward_batches"] == 2 * one["forward_batches"]
    assert double["predicted_seconds"]["score_stage"] - 3.0 == pytest.approx(
        2 * (one["predicted_seconds"]["score_stage"] - 3.0)
    )


def test_an_earlier_run_gives_the_per_token_cost_and_the_fixed_cost_it_measured():
    shape = SampleShape(rows=100, costs=np.full(100, 30), batches=4, padded=4000, prepare_seconds=0.05)  # 40 padded/row
    report = {
        "run_id": "n1",
        "status": "succeeded",
        "seconds": 50.0,
        "step_seconds": {"score_stage": 30.0},
        "chunks": {"total": 2},
        "workers": {"rows_scored": 10_000, "model_seconds": 40.0},
    }
    unit = history_cost(report, shape, slots=2)
    assert unit.seconds_per_token == pytest.approx(40.0 / 10_000 / 40)
    assert unit.fixed_seconds == 20.0 and unit.source == "history: run n1"
    prepare = 0.05 / 100 * 10_000
    assert unit.stage_seconds_per_chunk == pytest.approx((30.0 - (40.0 + prepare) / 2) / 2)
    # the same rows again: the prediction gives back what that run measured
    again = predict(shape, 10_000, unit, SessionResources(2, 2, 1), chunks=2)
    assert again["predicted_seconds"]["total"] == pytest.approx(50.0, abs=0.02)

    assert history_cost({**report, "status": "validation_failed"}, shape, 2) is None
    assert history_cost({**report, "workers": {"rows_scored": 10, "model_seconds": 0.1}}, shape, 2) is None
    assert history_cost({k: v for k, v in report.items() if k != "seconds"}, shape, 2) is None


class SleepyHead:
    """A real head, one token per character, whose forward takes a known time per padded token."""

    padding_side = "right"
    seconds_per_token = 2e-5

    def tokenize(self, texts):
        mask = np.zeros((len(texts), max(1, max(len(t) for t in texts))), dtype=np.int64)
        for i, t in enumerate(texts):
            mask[i, : len(t)] = 1
        return {"attention_mask": mask}

    def forward(self, features):
        mask = features["attention_mask"]
        time.sleep(mask.size * self.seconds_per_token)
        return mask.sum(1, keepdims=True).astype(np.float64)


def test_calibration_measures_the_forward_seconds_per_padded_token():
    rng = np.random.default_rng(3)
    texts = ["x" * int(n) for n in rng.integers(5, 120, size=600)]
    table = pa.table({"c0": texts})
    runner = TextRunner(SleepyHead(), ["c0"])
    measured = _calibrate(runner, table, BatchPolicy(max_tokens=1024, max_rows=64))
    assert SleepyHead.seconds_per_token <= measured <= 1.5 * SleepyHead.seconds_per_token


def test_row_costs_are_what_each_runner_batches_by():
    runner = TextRunner(SleepyHead(), ["c0"])
    prepared = runner.prepare(pa.record_batch({"c0": ["abc", None, "de"]}))
    assert runner.row_costs(prepared).tolist() == [3, 2]  # tokens of the rows to score; the null is not scored
    matrix = MatrixRunner(None, ["a", "b"]).prepare(pa.record_batch({"a": [1.0, None, 3.0], "b": [1, 2, 3]}))
    assert MatrixRunner(None, ["a", "b"]).row_costs(matrix).tolist() == [1, 1]  # the NaN row is not scored


def test_the_plan_prints_as_a_short_table():
    shape = SampleShape(rows=100, costs=np.full(100, 30), batches=4, padded=4000, prepare_seconds=0.05)
    plan = predict(
        shape,
        10_000,
        UnitCost(1e-4, 3.0, 12.0, "calibration on the driver"),
        SessionResources(2, 2, 1),
        peak_memory_mib=812.4,
    )
    plan.update(
        sample_rows=100,
        device="cpu",
        max_batch_tokens=1024,
        cost=run_cost(
            seconds=plan["predicted_seconds"]["total"],
            stage_seconds=plan["predicted_seconds"]["score_stage"],
            worker_seconds=40.0,
            rows_scored=10_000,
            resources=SessionResources(2, 2, 1),
            price_per_core_hour=0.05,
        ),
    )
    text = format_plan(plan)
    assert "total" in text and f"{plan['predicted_seconds']['total']:,.1f} s" in text
    assert "812 MiB (cpu)" in text and "400,000 padded" in text and "per million rows" in text


def test_the_bench_plans_with_the_lakescore_runs_own_flags(tmp_path):
    from bench.plan_check import plan_command
    from bench.suite import PEERS, Job

    d = next(p for p in PEERS if p.key == "d")
    command = plan_command(Job("W1", d, tmp_path / "w1.parquet", 100, 1), tmp_path)
    assert command[1] == "plan" and command[-1] == "--json" and "--report" not in command
    assert command[command.index("--input") + 1] == str(tmp_path / "w1.parquet") and "--model" in command
