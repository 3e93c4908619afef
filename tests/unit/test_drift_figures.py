"""The drift gate's figures, bounds, report line, metrics row and HTML section, without Spark: JS distance against
scipy, PSI against a hand computation, the task registry's profiled outputs and the config's refusals."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from lakescore.jobs.commands.history import RunRecord, format_history
from lakescore.jobs.config import ConfigError, load_config
from lakescore.jobs.report.html import render_html
from lakescore.jobs.report.model import RunReport
from lakescore.jobs.report.text import drift_text
from lakescore.jobs.steps.drift import EMPTY_BIN_SHARE, exceeded, js_distance, psi
from lakescore.jobs.steps.metrics import METRICS_SCHEMA, metrics_row
from lakescore.jobs.steps.publish import refusal
from lakescore.jobs.steps.report import refusal_reason
from lakescore.udfs.registry import OutputProfile, get_task


@pytest.mark.parametrize(
    "p,q",
    [
        ({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}),
        ({"positive": 0.9, "negative": 0.1}, {"positive": 0.2, "negative": 0.5, "neutral": 0.3}),
        ({"a": 1.0}, {"b": 1.0}),
        ({"a": 3, "b": 1}, {"a": 1, "b": 1, "c": 2}),  # counts are normalised
    ],
)
def test_js_distance_equals_scipy_base_2(p, q):
    labels = sorted(set(p) | set(q))
    expected = jensenshannon([p.get(k, 0) for k in labels], [q.get(k, 0) for k in labels], base=2)
    assert js_distance(p, q) == pytest.approx(expected, abs=1e-12)
    assert js_distance(q, p) == pytest.approx(expected, abs=1e-12)


def test_js_distance_is_zero_for_equal_shares_and_one_for_disjoint_labels():
    assert js_distance({"x": 2, "y": 6}, {"x": 0.25, "y": 0.75}) == pytest.approx(0.0, abs=1e-12)
    assert js_distance({"x": 1.0}, {"y": 1.0}) == pytest.approx(1.0)


def test_psi_by_hand_with_an_empty_bin():
    actual, expected = [30, 50, 20, 0], [25, 25, 25, 25]
    a = [0.3, 0.5, 0.2, EMPTY_BIN_SHARE]
    e = [0.25] * 4
    by_hand = sum((x - y) * math.log(x / y) for x, y in zip(a, e))
    assert psi(actual, expected) == pytest.approx(by_hand, rel=1e-12)
    assert psi([10] * 10, [3] * 10) == pytest.approx(0.0, abs=1e-12)


def test_psi_of_a_shifted_normal_matches_numpy_on_decile_bins():
    rng = np.random.default_rng(3)
    base, moved = rng.normal(size=20_000), rng.normal(loc=0.5, size=20_000)
    edges = np.quantile(base, np.arange(1, 10) / 10)
    a = np.bincount(np.searchsorted(edges, moved, side="left"), minlength=10) / moved.size
    e = np.bincount(np.searchsorted(edges, base, side="left"), minlength=10) / base.size
    assert psi(list(a), list(e)) == pytest.approx(float(np.sum((a - e) * np.log(a / e))), rel=1e-9)
    assert 0.2 < psi(list(a), list(e)) < 0.35  # a half-sigma shift is a "moved" population


def test_a_figure_past_its_bound_is_exceeded_and_a_missing_one_passes():
    bounds = {"label_js": {"max": 0.2}, "id_cosine_p5": {"min": 0.9}, "score_psi": {"max": 0.1}}
    assert exceeded({"label_js": 0.21, "id_cosine_p5": 0.95, "score_psi": None}, bounds) == ["label_js"]
    assert exceeded({"label_js": 0.2, "id_cosine_p5": 0.89}, bounds) == ["id_cosine_p5"]


DRIFT = {
    "baseline": "previous",
    "baseline_version": 3,
    "bounds": {"label_js": {"max": 0.2}},
    "figures": {"label_js": 0.41234, "score_psi": 0.0312},
    "exceeded": ["label_js"],
    "gated": True,
    "note": None,
    "profiles": {
        "run": {
            "rows": 100,
            "label_shares": {"positive": 0.9, "negative": 0.1},
            "score_deciles": [0.5] * 9,
            "score_bins": [10] * 10,
        },
        "baseline": {
            "rows": 80,
            "label_shares": {"positive": 0.3, "negative": 0.7},
            "score_deciles": [0.4] * 9,
            "score_bins": [8] * 10,
            "score_bin_edges": [i / 10 for i in range(1, 10)],
        },
    },
}


def test_the_drift_line_and_the_refusal_carry_every_figure_on_one_line():
    assert drift_text(DRIFT) == "against version 3: label_js 0.4123 (max 0.2: exceeded), score_psi 0.0312"
    assert (
        drift_text({"figures": {}, "note": "no baseline: the output does not exist yet"})
        == "no baseline: the output does not exist yet"
    )
    cfg = load_config(flags={"task": "classify", "validation.drift.max_label_js": 0.2})

    class Counted:  # the accounting facts the refusal reads
        error_rate, error_rows, rows_considered, rows_kept = 0.0, 0, 100, 0

    def _refusal(cfg, targets, accounting, validation, drift):  # the publish's decision, worded by the report step
        status = refusal(cfg, accounting, validation, drift)
        return None if status is None else (status, refusal_reason(status, cfg, targets, accounting, drift))

    status, reason = _refusal(cfg, None, Counted(), {"success": True}, DRIFT)
    assert status == "drift_exceeded" and "\n" not in reason
    assert reason == (
        "drift past its bounds against version 3: label_js 0.4123 (max 0.2: exceeded), score_psi 0.0312. "
        "The output was not published."
    )
    assert _refusal(cfg, None, Counted(), {"success": True}, {**DRIFT, "exceeded": []}) is None
    assert _refusal(cfg, None, Counted(), {"success": False}, DRIFT)[0] == "validation_failed"  # validation first


def _report(**facts) -> RunReport:
    base = dict(
        run_id="night-1",
        status="drift_exceeded",
        task="classify",
        input="in",
        output="out",
        model_id="m",
        model_revision=None,
        model_sha256="ab" * 32,
        input_rows=100,
        output_rows=100,
        error_rows=0,
        rows_kept=0,
        started_at="2026-11-26T08:00:00+00:00",
        finished_at="2026-11-26T08:01:00+00:00",
        seconds=60.0,
        drift=DRIFT,
    )
    return RunReport(**{**base, **facts})


def test_the_metrics_row_holds_the_profile_and_figures_in_the_table_schema():
    row = metrics_row(_report())
    assert list(row) == METRICS_SCHEMA.names
    assert row["label_shares"] == {"positive": 0.9, "negative": 0.1} and row["score_deciles"] == [0.5] * 9
    assert (row["label_js"], row["score_psi"], row["id_cosine_p5"]) == (0.41234, 0.0312, None)
    assert row["drift_exceeded"] == ["label_js"] and row["baseline_version"] == 3 and row["started_at"].year == 2026
    stopped = metrics_row(_report(status="interrupted", drift=None, input_rows=None, output_rows=None))
    assert stopped["status"] == "interrupted" and stopped["label_shares"] is None and stopped["input_rows"] is None
    assert metrics_row(_report(run_id="")) is None and metrics_row(_report(run_id="x' OR '1'='1")) is None


def test_the_summary_html_and_history_show_the_drift_figures():
    report = _report()
    assert "  drift: against version 3: label_js 0.4123 (max 0.2: exceeded), score_psi 0.0312" in report.summary()
    page = render_html(report.as_dict())
    section = page[page.index('<section id="drift">') :]
    section = section[: section.index("</section>")]
    assert "<td class=fail>EXCEEDED</td>" in section and "none (reported only)" in section
    assert len(re.findall(r"<svg", section)) == 2  # label shares and score bins, both runs side by side
    assert "baseline (version 3)" in section and "this run" in section
    record = RunRecord("night-1", "2026-11-26", "WRITE", None, None, None, report.as_dict())
    assert format_history([record]).splitlines()[1].endswith("label_js 0.412!, score_psi 0.031")
    from_metrics = RunRecord(
        "night-2",
        "2026-11-26",
        "WRITE",
        4,
        10,
        None,
        None,
        metrics={"id_cosine_p5": 0.5, "drift_exceeded": ["id_cosine_p5"], "drift_note": None},
    )
    assert format_history([from_metrics]).splitlines()[1].endswith("id_cosine_p5 0.500!")


def test_the_registry_says_which_outputs_are_profiled():
    assert get_task("classify").output_profile() == OutputProfile(label="label", score="score")
    assert get_task("tabular").output_profile() == OutputProfile(score="prediction")
    assert get_task("image_embed").output_profile() == OutputProfile(embedding="embedding")
    assert get_task("ner").output_profile().columns == ()
    generate = get_task("generate")
    free = load_config(flags={"task": "generate"})
    choosing = load_config(flags={"task": "generate", "generate.choices": ["yes", "no"]})
    assert generate.output_profile(free.task_options()) == OutputProfile(text="generated_text")
    assert generate.output_profile(choosing.task_options()) == OutputProfile(label="generated_text")


def test_the_config_refuses_a_bound_the_task_has_no_output_for_and_a_bad_baseline():
    with pytest.raises(
        ConfigError, match=r"^validation.drift.max_label_js compares the label output, which task 'embed'"
    ):
        load_config(flags={"task": "embed", "validation.drift.max_label_js": 0.1})
    with pytest.raises(ConfigError, match="validation.drift.min_id_cosine_p5 compares the embedding output"):
        load_config(flags={"task": "classify", "validation.drift.min_id_cosine_p5": 0.9})
    with pytest.raises(
        ConfigError, match="validation.drift.max_label_js compares the label output, which task 'generate'"
    ):
        load_config(flags={"task": "generate", "validation.drift.max_label_js": 0.1})
    with pytest.raises(ConfigError, match="^validation.drift.baseline must be previous or a Delta version number"):
        load_config(overrides=["validation.drift.baseline=latest"])
    assert load_config(overrides=["validation.drift.baseline=7"]).validation.drift.baseline_version == 7
    assert load_config().validation.drift.baseline_version is None
    assert load_config(flags={"output": "main.`my scores`"}).metrics_ref() == "main.`my scores_metrics`"
    assert load_config(flags={"output": "/data/scores/"}).metrics_ref() == "/data/scores_metrics"
    assert load_config(flags={"output": "/d/s", "validation.metrics_table": "db.m"}).metrics_ref() == "db.m"


def test_a_run_without_a_drift_bound_says_nothing_about_drift():
    note = {
        **DRIFT,
        "bounds": {},
        "gated": False,
        "figures": {},
        "exceeded": [],
        "baseline_version": None,
        "note": "no baseline: the output does not exist yet",
    }
    for ungated in (note, {**DRIFT, "bounds": {}, "gated": False, "exceeded": []}):
        assert "drift" not in _report(status="succeeded", drift=ungated).summary()
    assert 'id="drift"' not in render_html(_report(status="succeeded", drift=note).as_dict())
    # With figures but no bound, the page still shows them as reported only; with a bound, the note is the gate's.
    assert "none (reported only)" in render_html(_report(drift={**DRIFT, "bounds": {}, "gated": False}).as_dict())
    gated = {**note, "bounds": {"label_js": {"max": 0.2}}, "gated": True}
    assert "  drift: no baseline: the output does not exist yet" in _report(status="succeeded", drift=gated).summary()


def test_history_lists_each_attempt_of_a_run_id_with_its_own_facts():
    refused = metrics_row(_report(attempt=1))
    published = metrics_row(_report(attempt=2, status="succeeded", delta_version=4, drift={**DRIFT, "exceeded": []}))
    rows = [
        RunRecord("night-1", "2026-11-26 08:05:00", "WRITE", 4, 100, None, None, metrics=published),
        RunRecord("night-1", "2026-11-26 08:01:00", "-", None, None, None, None, metrics=refused),
    ]
    header, second, first = (line.split() for line in format_history(rows).splitlines())
    assert header[-3:] == ["version", "attempt", "drift"]
    assert (second[0], second[3], second[-6:]) == (
        "night-1",
        "succeeded",
        ["4", "2", "label_js", "0.412,", "score_psi", "0.031"],
    )
    assert (first[0], first[3], first[4:7], first[-6:]) == (
        "night-1",
        "drift_exceeded",
        ["100", "100", "0"],
        ["-", "1", "label_js", "0.412!,", "score_psi", "0.031"],
    )
