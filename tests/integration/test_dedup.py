"""``scoring.dedup`` on real Spark + Delta with a tiny seeded classifier: identical inputs scored once, fanned out."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pyspark.sql import functions as F

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.steps.dedup import MIN_ROW_SECONDS, decide_dedup
from tests.integration.test_score_job import read_output


def test_dedup_scores_each_input_once_and_equals_dedup_off(spark, tmp_path, tiny_classifier_dir):
    texts = ["great battery", "awful screen", "ok", "great battery", "ok", "ok", None, "great battery", None, "fine"]
    frame = pd.DataFrame({"review_id": range(1, len(texts) + 1), "body": texts})
    source = tmp_path / "reviews"
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").save(str(source))

    def run(dedup, output):
        return run_scoring(
            load_config(
                flags={
                    "input": str(source),
                    "output": str(tmp_path / output),
                    "task": "classify",
                    "model.source": str(tiny_classifier_dir),
                    "id_col": "review_id",
                    "text_col": "body",
                    "max_error_rate": 0.5,
                    "scoring.dedup": dedup,
                }
            ),
            spark,
        )

    on, off, auto = run("on", "on"), run("off", "off"), run("auto", "auto")
    for report in (on, off, auto):
        assert report.status == "succeeded", report.error
        assert (report.output_rows, report.error_rows, report.error_reasons) == (8, 2, {"null_input": 2})
    # 10 rows, 8 scored with 4 distinct texts: 4 forward passes saved. The two null texts share a digest but were
    # dead-lettered, so they saved no forward pass (auto's sample still counts them as one repeated input).
    assert on.dedup == {
        "mode": "on",
        "used": True,
        "sample_rows": None,
        "sample_distinct": None,
        "forward_passes_saved": 4,
    }
    assert off.dedup["used"] is False and off.dedup["forward_passes_saved"] is None
    assert auto.dedup == {
        "mode": "auto",
        "used": True,
        "sample_rows": 10,
        "sample_distinct": 5,
        "forward_passes_saved": 4,
    }
    assert "dedup: 4 forward passes saved" in on.summary()
    assert on.workers["rows_scored"] == 10  # every row is staged; the workers' metrics count once per scored input

    deduplicated, plain = read_output(spark, str(tmp_path / "on")), read_output(spark, str(tmp_path / "off"))
    assert deduplicated["review_id"].tolist() == plain["review_id"].tolist() == [1, 2, 3, 4, 5, 6, 8, 10]
    assert deduplicated["label"].tolist() == plain["label"].tolist()
    np.testing.assert_allclose(np.stack(deduplicated["probs"]), np.stack(plain["probs"]), atol=1e-5)
    # Dead-lettering stays per row: each null text has its own error row.
    errors = spark.read.format("delta").load(str(tmp_path / "on_errors")).toPandas()
    assert sorted(errors["review_id"]) == [7, 9] and set(errors["reason"]) == {"null_input"}
    assert set(errors["error"]) == {"the text_col column 'body' is null on this row"}  # it names the column (issue 65)

    # auto on inputs that do not repeat: no shuffle.
    unique = spark.createDataFrame(
        [(i, f"t{i}", f"d{i}") for i in range(50)], "review_id long, body string, input_digest string"
    )
    decision = decide_dedup("auto", unique, "review_id", 50)
    assert (decision.used, decision.sample_rows, decision.sample_distinct) == (False, 50, 50)
    # Given the distinct inputs among all its rows (an incremental run estimates them), auto decides from those
    # without a sample: 10 of 50 rows repeat an input.
    decision = decide_dedup("auto", unique, "review_id", 50, distinct=40)
    assert (decision.used, decision.sample_rows, decision.sample_distinct) == (True, 50, 40)
    # A model faster a row than deduplicating costs is never deduplicated, and its rows are not sampled: reading
    # these would fail the job.
    unreadable = unique.withColumn("input_digest", F.raise_error(F.lit("the sample was read")))
    decision = decide_dedup("auto", unreadable, "review_id", 50, row_seconds=MIN_ROW_SECONDS / 2)
    assert (decision.used, decision.sample_rows) == (False, None)
    decision = decide_dedup("auto", unique, "review_id", 50, distinct=40, row_seconds=MIN_ROW_SECONDS * 2)
    assert (decision.used, decision.sample_rows) == (True, 50)


def test_an_incremental_run_decides_dedup_from_its_rows_to_score(spark, tmp_path, tiny_classifier_dir):
    source = tmp_path / "reviews"

    def write(rows):
        spark.createDataFrame(
            pd.DataFrame(rows, columns=["review_id", "body"]), "review_id long, body string"
        ).write.format("delta").mode("overwrite").save(str(source))

    def run(run_id):
        report = run_scoring(
            load_config(
                flags={
                    "input": str(source),
                    "output": str(tmp_path / "labels"),
                    "task": "classify",
                    "model.source": str(tiny_classifier_dir),
                    "id_col": "review_id",
                    "text_col": "body",
                    "write.mode": "incremental",
                    "run_id": run_id,
                }
            ),
            spark,
        )
        assert report.status == "succeeded", report.error
        return report

    night_one = [(i, f"review {i}") for i in range(1, 21)]
    write(night_one)
    assert run("n1").dedup["used"] is False  # 20 distinct texts, sampled
    # Night two: 6 new rows, 2 distinct texts among them, and 20 unchanged rows that repeat nothing new.
    write(night_one + [(21 + i, "same new text" if i % 2 else "another new text") for i in range(6)])
    two = run("n2")
    assert (two.rows_kept, two.rows_scored) == (20, 6)
    assert two.dedup == {
        "mode": "auto",
        "used": True,
        "sample_rows": 6,
        "sample_distinct": 2,
        "forward_passes_saved": 4,
    }


def test_a_pair_with_a_null_side_keeps_its_own_dead_letter_under_dedup(spark, tmp_path, tiny_classifier_dir):
    """A null side is part of what the digest sees: rows whose other side differs never share a dead letter (issue 65:
    row b's errors-table input was row a's)."""
    rows = [
        ("a", None, "P-a"),
        ("b", "Q-b", None),
        ("c", "Q-c", None),
        ("d", None, None),
        ("e", None, None),
        ("f", "Q-f", "P-f"),
        ("g", "Q-f", "P-f"),
    ]
    source = tmp_path / "pairs"
    spark.createDataFrame(rows, "pair_id string, query string, passage string").write.format("delta").save(str(source))
    report = run_scoring(
        load_config(
            flags={
                "input": str(source),
                "output": str(tmp_path / "scores"),
                "task": "classify",
                "model.source": str(tiny_classifier_dir),
                "id_col": "pair_id",
                "text_col": "query",
                "text_pair_col": "passage",
                "max_error_rate": 0.9,
                "scoring.dedup": "on",
            }
        ),
        spark,
    )
    assert report.status == "succeeded", report.error
    assert (report.output_rows, report.error_rows) == (2, 5)
    errors = spark.read.format("delta").load(str(tmp_path / "scores_errors")).toPandas().set_index("pair_id")
    assert errors["input"].to_dict() == {
        "a": '{"passage":"P-a"}',
        "b": '{"query":"Q-b"}',
        "c": '{"query":"Q-c"}',
        "d": "{}",
        "e": "{}",
    }
    assert set(errors["reason"]) == {"null_input"}
    assert report.dedup["forward_passes_saved"] == 1  # f and g share their input
