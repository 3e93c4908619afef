"""The HTML page from report dicts, no Spark: sections per data kind, and everything user-supplied escaped."""

from __future__ import annotations

import re
import time

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from lakescore.jobs.config import load_config
from lakescore.jobs.report.html import render_html
from lakescore.jobs.report.model import RunReport
from lakescore.jobs.steps.clock import StepClock
from lakescore.jobs.steps.report import failure_report
from lakescore.jobs.steps.report_data import summarize_column, summarize_input

XSS = "<script>alert(1)</script>"


def summaries(rng: np.random.Generator) -> list[dict]:
    """Prediction summaries of the column types the tasks write (and an array<struct> one, like ner)."""
    labels = pa.chunked_array([pa.array([XSS, "neutral", "positive", XSS, "positive", None])])
    scores = pa.chunked_array([pa.array(rng.random(6))])
    vectors = pa.chunked_array([pa.array([list(v) for v in rng.normal(size=(6, 8))], pa.list_(pa.float32()))])
    entity = T.StructType([T.StructField("entity_group", T.StringType()), T.StructField("score", T.DoubleType())])
    entities = pa.chunked_array(
        [pa.array([[{"entity_group": "ORG", "score": 0.9}], [], [{"entity_group": XSS, "score": 0.5}]])]
    )
    return [
        summarize_column("label", T.StringType(), labels),
        summarize_column("score", T.DoubleType(), scores),
        summarize_column("embedding", T.ArrayType(T.FloatType()), vectors),
        summarize_column("entities", T.ArrayType(entity), entities),
    ]


def report(**overrides) -> dict:
    rng = np.random.default_rng(0)
    base = {
        "run_id": f"run-{XSS}",
        "status": "succeeded",
        "task": "classify",
        "input": f"db.{XSS}",
        "output": f"/tmp/{XSS}/out",
        "model_id": f"/models/{XSS}",
        "model_revision": None,
        "model_sha256": "ab" * 32,
        "input_rows": 10,
        "output_rows": 8,
        "error_rows": 2,
        "errors_table": f"db.{XSS}_errors",
        "error_reasons": {"duplicate_id": 2},
        "seconds": 12.5,
        "rows_per_second": 0.8,
        "delta_version": 3,
        "step_seconds": {"startup": 4.0, "score_stage": 6.0, "validate": 2.5},
        "versions": {"lakescore": "0.2.0", "spark": "4.1.1", "delta": "4.4.0"},
        "validation": {
            "success": True,
            "failed": [],
            "checks": [
                {"expectation": "expect_column_values_to_be_in_set", "column": XSS, "success": True},
                {"expectation": "expect_table_row_count_to_equal", "column": None, "success": False, "observed": 7},
            ],
        },
        "profile": {
            "sample_rows": 6,
            "inputs": [summarize_input("body", T.StringType(), pa.chunked_array([pa.array(["a b", XSS, "ccc"])]))],
            "predictions": summaries(rng),
            "dead_letters": {
                "columns": ["review_id", "input", "reason"],
                "rows": [["7", XSS, "duplicate_id"]],
                "text_limit": 200,
            },
            "throughput": [[0.0, 0], [3.0, 4], [6.0, 8]],
        },
    }
    base.update(overrides)
    return base


def test_every_section_is_drawn_from_the_data_present():
    page = render_html(report())
    for section in ("identity", "rows", "time", "throughput", "inputs", "predictions", "validation", "dead-letters"):
        assert f'id="{section}"' in page or f"id={section}" in page, section
    assert (
        page.count("<svg") == 10
    )  # rows, steps, throughput, input lengths, labels, scores, norms, PCA, items, item field
    assert "4.1.1" in page and "4.4.0" in page and "ab" * 32 in page
    assert "L2 norm of embedding" in page and "PC 1 (" in page and "entities per row" in page
    assert re.search(r"<td class=fail>FAIL</td><td>expect_table_row_count_to_equal", page)


def test_user_supplied_text_is_escaped_everywhere():
    page = render_html(report())
    assert "<script" not in page.lower()
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8  # ids, tables, paths, labels, texts, checks


def test_projection_is_coloured_by_a_small_categorical_column():
    items = summaries(np.random.default_rng(1))
    vectors = items[2]
    assert "colours" not in vectors["projection"]  # summarize_column alone does not colour
    from lakescore.jobs.steps.report_data import _colour_projections

    table = pa.table({"label": ["a", "b", "a", "b", "a", "b"]})
    items[0] = summarize_column("label", T.StringType(), table.column("label"))
    items[2] = summarize_column(
        "embedding",
        T.ArrayType(T.FloatType()),
        pa.chunked_array([pa.array([[float(i), float(i * i), 1.0] for i in range(6)])]),
    )
    _colour_projections(items, table)
    assert items[2]["projection"]["colours"] == ["a", "b", "a", "b", "a", "b"]


def test_failed_run_without_profile_still_renders():
    page = render_html(report(status="validation_failed", profile=None, validation=None, error="the output failed"))
    assert 'class="badge bad"' in page and "the output failed" in page and "Not run" in page


def test_projection_finds_the_direction_of_most_variance():
    from lakescore.jobs.steps.report_data import projection

    rng = np.random.default_rng(2)
    along = rng.normal(size=200)
    rows = [np.array([a, 2 * a, -a]) + rng.normal(scale=1e-3, size=3) for a in along]
    result = projection(rows)
    assert result["explained"][0] > 0.999
    xs = np.array([p[0] for p in result["points"]])
    assert abs(np.corrcoef(xs, along)[0, 1]) > 0.999


def test_a_reduced_precision_run_shows_what_its_check_against_float32_found():
    check = {"path": "bfloat16", "sample_rows": 256, "cosine_p1": 0.99987, "cosine_min": 0.99985}
    page = render_html(report(precision_check=check))
    assert (
        "<th>precision</th><td>bfloat16: within tolerance of float32 on 256 sampled rows (cosine_p1 0.9999, cosine_min "
        "0.9999)</td>" in page
    )
    assert "<th>precision</th>" not in render_html(report())  # a float32 run: no row


def _table_rows(page: str, section: str) -> list[tuple[str, str]]:
    """The (label, value) cells of a section's table, as text."""
    body = re.search(rf'<section id="{section}">(.*?)</section>', page, re.S).group(1)
    return [(k.strip(), v) for k, v in re.findall(r"<tr><td>(.*?)</td><td class=num>(.*?)</td></tr>", body)]


def test_incremental_accounting_shows_kept_scored_missing_deleted_and_the_identity_that_holds():
    page = render_html(
        report(
            input_rows=305,
            rows_kept=275,
            rows_scored=30,
            output_rows=30,
            error_rows=0,
            error_reasons={},
            rows_missing=15,
            rows_deleted=15,
        )
    )
    assert "Rows: input = kept + scored + errors" in page and "in = output + errors" not in page
    assert _table_rows(page, "rows") == [
        ("input", "305"),
        ("kept (not scored again)", "275"),
        ("scored", "30"),
        ("errors", "0"),
        ("output ids missing from the input", "15"),
        ("deleted from the output", "15"),
    ]
    assert "kept (275)" in page and "scored (30)" in page  # the chart's legend: the result bar adds up to the input
    assert "From the first 6 of the 30 rows this run scored." in page  # the predictions' sample: scored rows, not kept
    assert "scoring spec changed" not in page
    changed = render_html(
        report(
            input_rows=30,
            rows_kept=0,
            rows_scored=30,
            output_rows=30,
            error_rows=0,
            error_reasons={},
            rows_missing=0,
            rows_deleted=0,
            spec_changes=["file sentence_bert_config.json changed"],
        )
    )
    assert "The scoring spec changed, so every row was scored again: file sentence_bert_config.json changed." in changed
    # Outside incremental mode nothing is kept: input = scored + errors, and no kept / missing / deleted rows.
    full = render_html(report())
    assert "Rows: input = scored + errors" in full
    assert _table_rows(full, "rows") == [("input", "10"), ("scored", "8"), ("errors", "2"), ("duplicate_id", "2")]


def test_a_run_with_nothing_to_score_says_so_and_draws_no_empty_prediction_or_rate():
    empty = summaries(np.random.default_rng(3))  # what a profile of zero scored rows held: empty summaries
    for s in empty:
        s.update(
            {
                "counts": [],
                "distinct": 0,
                "width": [],
                "histogram": {"edges": [], "counts": []},
                "norm_histogram": {"edges": [], "counts": []},
                "projection": None,
            }
        )
    noop = dict(
        input_rows=12,
        rows_kept=12,
        rows_scored=0,
        output_rows=0,
        error_rows=0,
        error_reasons={},
        rows_missing=0,
        rows_deleted=0,
        rows_per_second=3.7,
        delta_version=None,
    )
    page = render_html(
        report(
            **noop,
            profile={
                **report()["profile"],
                "predictions": empty,
                "sample_rows": 0,
                "dead_letters": None,
                "throughput": [[0.0, 0], [1.0, 0]],
            },
        )
    )
    predictions = re.search(r'<section id="predictions">(.*?)</section>', page, re.S).group(1)
    assert "Nothing to score: 12 input rows kept as they are." in predictions and "<svg" not in predictions
    assert "dimensions" not in page and "rows/s" not in page and "id=throughput" not in page
    assert "12.5 s in all" in page
    summary = RunReport(
        run_id="r2",
        status="succeeded",
        task="classify",
        input="in",
        output="out",
        model_id="m",
        model_revision=None,
        model_sha256=None,
        seconds=3.2,
        **noop,
    ).summary()
    assert "nothing to score: 12 input rows kept as they are" in summary and "rows/s" not in summary
    assert "3.2 s" in summary


def test_a_run_whose_rows_to_score_were_all_dead_lettered_is_not_called_nothing_to_score():
    page = render_html(
        report(input_rows=3, output_rows=0, rows_scored=0, error_rows=3, error_reasons={"null_input": 3})
    )
    assert "No row scored: every row to score was dead-lettered." in page and "Nothing to score" not in page


def test_validation_not_run_says_which_reason_applies():
    assert "Not run: the error rate was exceeded." in render_html(report(status="error_rate_exceeded", validation=None))
    assert "Not run: validation is disabled." in render_html(report(validation=None))


def test_an_interrupted_run_reports_what_is_known_and_nothing_about_rows():
    cfg = load_config(
        flags={
            "input": "db.reviews",
            "output": "db.scores",
            "model.source": "/models/m",
            "id_col": "id",
            "text_col": "body",
        }
    )
    clock = StepClock()
    clock.note(run_id="r9", staging="/tmp/staging/key", chunks=4)
    with pytest.raises(KeyboardInterrupt) as raised:
        with clock.step("startup"):
            time.sleep(0.01)
        with clock.step("score_stage"):
            clock.stopped_while_scoring(2, 4)
            raise KeyboardInterrupt("SIGINT")
    failed = failure_report(cfg, raised.value, "interrupted", clock)
    assert failed.started_at == clock.started_at and failed.seconds >= failed.step_seconds["startup"] >= 0.01
    assert list(failed.step_seconds) == ["startup", "score_stage"] and failed.failed_step == "score_stage"
    assert (failed.input_rows, failed.output_rows, failed.error_rows, failed.validation) == (None, None, None, None)

    page = render_html(failed.as_dict())
    assert re.findall(r'<section id="([^"]+)"', page) == ["identity", "time"]
    assert "<th>stopped in step</th><td>score_stage</td>" in page and "<th>error</th><td>SIGINT</td>" in page
    assert "<th>staged</th><td>2 of 4 chunks in /tmp/staging/key</td>" in page
    assert f"<th>started</th><td>{failed.started_at}</td>" in page and "before it stopped in step score_stage" in page
    for claim in ("Dead-lettered", "every input row", "Validation", "Not run", "Rows:", "Nothing to score", "rows/s"):
        assert claim not in page, claim
    summary = failed.summary()
    assert "stopped in step score_stage" in summary and "error: SIGINT" in summary and "rows" not in summary


def test_a_rerun_shows_every_attempt_of_its_run_id_and_a_refused_run_where_its_dead_letters_are():
    earlier = [
        {
            "attempt": 1,
            "status": "drift_exceeded",
            "started_at": "2026-11-26T08:00:00+00:00",
            "seconds": 9.0,
            "output_rows": 8,
            "error_rows": 2,
            "delta_version": None,
            "drift_exceeded": ["label_js"],
            "error": f"drift past its bounds {XSS}",
        }
    ]
    page = render_html(report(attempt=2, attempts=earlier, started_at="2026-11-26T09:00:00+00:00"))
    assert "<th>attempt</th><td>2</td>" in page
    section = re.search(r'<section id="attempts">(.*?)</section>', page, re.S).group(1)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(<td.*?)</tr>", section)]
    assert [row[:3] + row[5:6] for row in cells] == [
        ["1", "2026-11-26T08:00:00+00:00", "drift_exceeded", "-"],
        ["2 (this report)", "2026-11-26T09:00:00+00:00", "succeeded", "3"],
    ]
    assert "&lt;script&gt;" in cells[0][6] and "<script" not in page.lower()
    assert 'id="attempts"' not in render_html(report(attempt=1))  # a first attempt: nothing earlier to show

    # A refused run published nothing: its dead-lettered rows are in its staging, not in the errors table.
    refused = render_html(
        report(
            status="drift_exceeded", delta_version=None, chunks={"total": 1, "skipped": 0, "staging": "/tmp/staging/k1"}
        )
    )
    note = re.search(r'<section id="dead-letters">.*?<p class=note>(.*?)</p>', refused, re.S).group(1)
    assert "kept in staging /tmp/staging/k1" in note and "_errors unchanged" in note
    assert f"rows in db.{XSS.replace('<', '&lt;').replace('>', '&gt;')}_errors" in render_html(report())


def test_a_generate_run_shows_its_tokens_and_no_chart_for_a_column_without_values():
    text = pa.chunked_array([pa.array(["Fine.", "Late again.", "Great"])])
    no_choices = pa.chunked_array([pa.array([None, None, None], pa.list_(pa.float64()))])
    predictions = [
        summarize_column("generated_text", T.StringType(), text),
        summarize_column("choice_logprobs", T.ArrayType(T.DoubleType()), no_choices),
    ]
    profile = {**report()["profile"], "predictions": predictions}
    workers = {"rows_scored": 3, "model_seconds": 1.5, "tokens_in": 1234, "tokens_out": 567, "tokens_per_second": 94.5}
    page = render_html(report(task="generate", workers=workers, profile=profile))
    time_section = re.search(r'<section id="time">(.*?)</section>', page, re.S).group(1)
    cells = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", time_section))
    assert cells["tokens in (prompts read)"] == "1,234" and cells["tokens out (generated)"] == "567"
    assert cells["tokens/s (generated, over the scoring stage&#x27;s wall time)"] == "94.5"
    assert "choice_logprobs" not in page and "dimensions" not in page  # nothing to draw: no "[] dimensions"
    assert "generated_text: 3 distinct values" in page
    assert "tokens in" not in render_html(report())  # a run that generated nothing: no token table
