"""The HTML run report: one self-contained file beside the JSON report, readable with no network.

:func:`render_html` turns a report (the JSON report's dict: :class:`~lakescore.jobs.report.model.RunReport`
fields, with its ``profile`` from :mod:`lakescore.jobs.steps.report_data`) into a page of
inline CSS and inline SVG charts (:mod:`lakescore.jobs.report.charts`); it has no
JavaScript and loads nothing. Sections: run identity, the run id's earlier attempts, row accounting, where the time
went, throughput over time, input lengths, the predictions' distributions, every validation check,
the drift figures with both runs' distributions side by side, and a sample of dead-lettered rows. Which prediction
charts appear follows the profile's ``kind`` of each column (a data type), never the task's name. The page of a run that
did not finish (:data:`~lakescore.jobs.report.text.UNFINISHED`) has the run and its time only: nothing was
determined about its rows.

Every value that came from a user, a table or a model (ids, names, paths, labels, texts)
goes through :func:`html.escape`; chart labels are escaped by matplotlib's SVG writer.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lakescore.jobs.report import charts
from lakescore.jobs.report.model import html_path_for
from lakescore.jobs.report.text import (
    UNFINISHED,
    dead_letters_place,
    drift_gated,
    drift_text,
    nothing_scored_text,
    precision_check_text,
)

__all__ = ["render_html", "write_html"]

_OK_COLOUR, _KEPT_COLOUR = "#2b7a3d", "#8fa9c4"
_ERROR_COLOURS = ["#b3261e", "#e8710a", "#a142f4", "#8c564b", "#d01884", "#5f6368"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1f24;margin:0;background:#f6f8fa}
main{max-width:1040px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 6px}
section{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:16px 20px;margin:16px 0}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px;word-break:break-all}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600;font-size:13px}
.ok{background:#2b7a3d}.bad{background:#b3261e}.pass{color:#2b7a3d;font-weight:600}.fail{color:#b3261e;font-weight:600}
.note{color:#57606a;font-size:12px}.charts{display:flex;flex-wrap:wrap;gap:12px}.charts figure{margin:0;flex:1 1 440px}
svg{max-width:100%;height:auto}
"""


def render_html(report: Mapping[str, Any]) -> str:
    """The page for ``report`` (a :meth:`~lakescore.jobs.report.model.RunReport.as_dict` dict) as one HTML string."""
    profile = report.get("profile") or {}
    if report.get("status") in UNFINISHED:  # what is known: when, how long, where it stopped and why
        sections = [_identity(report), _time(report, [])]
    else:
        sections = [
            _identity(report),
            _attempts(report),
            _accounting(report),
            _time(report, profile.get("throughput") or []),
            _inputs(profile.get("inputs") or []),
            _predictions(report, profile),
            _validation(report),
            _drift(report.get("drift")),
            _dead_letters(profile.get("dead_letters"), report),
        ]
    status = str(report.get("status"))
    started = f" · started {_e(report['started_at'])}" if report.get("started_at") else ""
    badge = f'<span class="badge {"ok" if status == "succeeded" else "bad"}" id="status">{_e(status)}</span>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>lakescore run {_e(report.get('run_id'))}</title><style>{_CSS}</style></head>"
        f'<body><main><h1>lakescore run <span class="mono" id="run-id">{_e(report.get("run_id"))}</span> {badge}</h1>'
        f'<p class="note">{_e(report.get("input"))} → {_e(report.get("output"))} · task {_e(report.get("task"))}'
        f"{started}</p>" + "".join(s for s in sections if s) + "</main></body></html>\n"
    )


def write_html(report: Mapping[str, Any], json_path: os.PathLike | str) -> Path:
    """Write the page beside ``json_path`` (same stem, ``.html``) atomically; return its path."""
    target = html_path_for(json_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.part")
    partial.write_text(render_html(report), encoding="utf-8")
    os.replace(partial, target)
    return target


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{_e(title)}</h2>{body}</section>'


def _rows(pairs: Iterable[tuple[str, Any]], mono: Iterable[str] = ()) -> str:
    mono = set(mono)
    cells = "".join(
        f"<tr><th>{_e(k)}</th><td{' class=mono' if k in mono else ''}>{_e(v)}</td></tr>"
        for k, v in pairs
        if v is not None
    )
    return f"<table>{cells}</table>"


def _table(header: Iterable[str], rows: Iterable[Iterable[Any]], numeric: Iterable[int] = ()) -> str:
    numeric = set(numeric)
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in numeric else ''}>{_e(v)}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(svg: str, caption: str = "") -> str:
    return f"<figure>{svg}<figcaption class=note>{_e(caption)}</figcaption></figure>"


def _identity(report: Mapping[str, Any]) -> str:
    versions = report.get("versions") or {}
    spark = report.get("spark") or {}
    delta = report.get("delta_version")
    pairs = [
        ("run id", report.get("run_id")),
        ("attempt", report.get("attempt")),
        ("status", report.get("status")),
        ("task", report.get("task")),
        ("input", report.get("input")),
        ("output", f"{report.get('output')} (Delta version {delta})" if delta is not None else report.get("output")),
        ("errors table", report.get("errors_table")),
        ("model", report.get("model_id")),
        ("model revision", report.get("model_revision") or "unknown"),
        ("model sha256", report.get("model_sha256")),
        ("precision", precision_check_text(check) if (check := report.get("precision_check")) else None),
        ("model auto", f"{c['backend']} {c['dtype']}: {c['reason']}" if (c := report.get("cpu_path")) else None),
        ("started", report.get("started_at")),
        ("finished", report.get("finished_at")),
        ("stopped in step", report.get("failed_step")),
        ("staged", _staged(report)),
        ("lakescore", versions.get("lakescore")),
        ("Spark", versions.get("spark")),
        ("Delta", versions.get("delta")),
        ("Spark master", spark.get("master")),
        ("Spark application", spark.get("app_id")),
        ("error", report.get("error")),
    ]
    return _section("identity", "Run", _rows(pairs, mono=("run id", "model sha256", "model", "input", "output")))


def _attempts(report: Mapping[str, Any]) -> str:
    """Every attempt of the run id, oldest first, this one last: a rerun resumes the run id, and an earlier attempt's
    refusal stays on this page (and in the metrics table)."""
    earlier = report.get("attempts") or []
    if not earlier:
        return ""
    this = {**report, "attempt": f"{report.get('attempt')} (this report)"}
    rows = [
        (
            a.get("attempt"),
            a.get("started_at"),
            a.get("status"),
            a.get("output_rows"),
            a.get("error_rows"),
            "-" if a.get("delta_version") is None else a["delta_version"],
            _short(a.get("error")),
        )
        for a in [*earlier, this]
    ]
    table = _table(
        ["attempt", "started", "status", "output rows", "errors", "Delta version", "error"], rows, numeric=[3, 4, 5]
    )
    return _section("attempts", f"Attempts of run {report.get('run_id')}", table)


def _staged(report: Mapping[str, Any]) -> str | None:
    """An unfinished run's staged chunks (what a rerun resumes from), as far as they are known."""
    chunks = report.get("chunks") or {}
    if report.get("status") not in UNFINISHED or not chunks.get("staging"):
        return None
    if chunks.get("staged") is not None:
        return f"{chunks['staged']} of {chunks.get('total')} chunks in {chunks['staging']}"
    return f"{chunks.get('total')} chunk(s) planned in {chunks['staging']}"


def _accounting(report: Mapping[str, Any]) -> str:
    """Where every input row went: kept (incremental mode), scored or dead-lettered by reason; in incremental mode
    also the output rows whose id is missing from the input, and those the run deleted."""
    rows_in, errors = report.get("input_rows"), report.get("error_rows") or 0
    if rows_in is None:
        return ""
    scored = report.get("rows_scored")
    scored = (report.get("output_rows") or 0) if scored is None else scored
    incremental = report.get("rows_missing") is not None
    kept = report.get("rows_kept") or 0
    reasons = sorted((report.get("error_reasons") or {}).items())
    parts = (
        ([("kept", kept, _KEPT_COLOUR)] if incremental else [])
        + [("scored", scored, _OK_COLOUR)]
        + [(reason, count, _ERROR_COLOURS[i % len(_ERROR_COLOURS)]) for i, (reason, count) in enumerate(reasons)]
    )
    chart = charts.stacked_bar_chart("accounting", [("input", [("input", rows_in, "#1f4e79")]), ("result", parts)])
    rows = [("input", f"{rows_in:,}")] + ([("kept (not scored again)", f"{kept:,}")] if incremental else [])
    rows += [("scored", f"{scored:,}")]
    if report.get("ranked_out") is not None:  # rank: scored, then cut to each key's top_k
        rows += [("  ranked out (not published)", f"{report['ranked_out']:,}")]
    rows += [("errors", f"{errors:,}")] + [(f"  {reason}", f"{count:,}") for reason, count in reasons]
    if report.get("rows_carried"):  # dead letters of earlier runs, not scored again: apart from this run's failures
        rows += [("  carried from earlier runs (not scored again)", f"{report['rows_carried']:,}")]
    if incremental:
        rows += [
            ("output ids missing from the input", f"{report['rows_missing']:,}"),
            ("deleted from the output", f"{report.get('rows_deleted') or 0:,}"),
        ]
        if report.get("chunk_rows_deleted") is not None:  # a chunked run: the counts above are documents
            rows += [("  chunk rows deleted", f"{report['chunk_rows_deleted']:,}")]
    title = "Rows: input = kept + scored + errors" if incremental else "Rows: input = scored + errors"
    changed = report.get("spec_changes")
    note = (
        f"<p class=note>The scoring spec changed, so every row was scored again: {_e('; '.join(changed))}.</p>"
        if changed
        else ""
    )
    return _section("rows", title, note + _figure(chart) + _table(["", "rows"], rows, numeric=[1]))


def _time(report: Mapping[str, Any], throughput: list) -> str:
    steps = [(name, float(seconds)) for name, seconds in (report.get("step_seconds") or {}).items()]
    nothing_scored = nothing_scored_text(report) is not None
    body = ""
    if steps:
        total, rate, stopped = report.get("seconds"), report.get("rows_per_second"), report.get("failed_step")
        caption = f"{total:.1f} s in all" if total is not None else ""
        if caption and stopped and report.get("status") in UNFINISHED:
            caption = f"{total:.1f} s before it stopped in step {stopped}"
        elif caption and rate and not nothing_scored:
            caption += f", {rate:,.1f} rows/s"
        body += "<h3>Where the time went</h3>" + _figure(charts.timeline_chart("steps", steps), caption)
    body += _cost(report.get("cost")) + _tokens(report.get("workers") or {})
    if len(throughput) >= 2 and not nothing_scored:
        xs, ys = [t for t, _ in throughput], [r for _, r in throughput]
        rate_x = [t for t, r in throughput if t > 0 and r > 0]
        rate_y = [r / t for t, r in throughput if t > 0 and r > 0]
        chart = charts.line_chart(
            "throughput",
            xs,
            ys,
            "seconds into the scoring stage",
            "rows scored",
            second=(rate_x, rate_y, "rows/s since the stage began"),
        )
        body += "<h3 id=throughput>Throughput</h3>" + _figure(chart, "rows are counted as scoring tasks finish")
    return _section("time", "Time", body) if body else ""


_HELD = (
    ("run", "whole run (held: wall × the session's)"),
    ("score_stage", "scoring stage (held: its wall × its tasks')"),
    ("model", "in model forward passes (busy: summed over tasks)"),
)
"""The report's core- and GPU-seconds, each named for what it counts (:mod:`lakescore.jobs.cost`)."""


def _cost(cost: Mapping[str, Any] | None) -> str:
    """What the run used and cost (:func:`lakescore.jobs.cost.run_cost` defines each figure), as a table."""
    if not cost:
        return ""
    cores, gpus = cost["core_seconds"], cost.get("gpu_seconds") or {}
    pairs = [("session", f"{cost['cores']} cores" + (f", {cost['gpus']} GPUs" if cost.get("gpus") else ""))]
    for unit, figures in (("core", cores), ("GPU", gpus if cost.get("gpus") else {})):
        pairs += [
            (f"{unit}-seconds, {what}", f"{figures[key]:,.1f}") for key, what in _HELD if figures.get(key) is not None
        ]
    if cost.get("rows_per_core_second"):
        pairs.append(("rows scored per core-second", f"{cost['rows_per_core_second']:,.2f}"))
    if cost.get("cost") is not None:
        pairs.append(("cost", f"{cost['cost']:,.4g}"))
        if cost.get("cost_per_million_rows") is not None:
            pairs.append(("cost per million rows scored", f"{cost['cost_per_million_rows']:,.4g}"))
    return "<h3 id=cost>What it used</h3>" + _rows(pairs)


def _tokens(workers: Mapping[str, Any]) -> str:
    """A run that generated text: the prompt tokens read (those read from a cache; those written to one, where a
    provider reported any), the tokens generated and the rate the report's ``workers`` give (generated tokens over the
    scoring stage's wall seconds); nothing for a run that generated no token."""
    if not workers.get("tokens_out"):
        return ""
    rate = workers.get("tokens_per_second")
    written = int(workers.get("tokens_in_cache_write") or 0)
    pairs = [
        ("tokens in (prompts read)", f"{int(workers.get('tokens_in') or 0):,}"),
        (
            "of them cached (a server's prompt cache, or a shared prefix computed once in-process)",
            f"{int(workers.get('tokens_in_cached') or 0):,}",
        ),
        ("of them written to the provider's prompt cache (priced apart)", f"{written:,}" if written else None),
        ("tokens out (generated)", f"{int(workers['tokens_out']):,}"),
        ("tokens/s (generated, over the scoring stage's wall time)", f"{rate:,.1f}" if rate else None),
    ]
    return "<h3 id=tokens>Tokens</h3>" + _rows(pairs)


def _inputs(summaries: list) -> str:
    figures = []
    for s in summaries:
        unit = s.get("unit") or "value"
        stats = s.get("stats") or {}
        caption = ", ".join(f"{k} {v:,.1f}" for k, v in stats.items()) + f" ({s.get('count', 0):,} rows sampled)"
        hist = s.get("histogram") or {}
        label = f"{s['column']}: {unit} per row" if s["kind"] == "lengths" else s["column"]
        figures.append(
            _figure(
                charts.histogram_chart(f"input-{len(figures)}", hist.get("edges", []), hist.get("counts", []), label),
                caption,
            )
        )
    return _section("inputs", "Input", f"<div class=charts>{''.join(figures)}</div>") if figures else ""


def _predictions(report: Mapping[str, Any], profile: Mapping[str, Any]) -> str:
    nothing = nothing_scored_text(report)
    if nothing is not None:  # no empty charts
        return _section("predictions", "Predictions", f"<p>{_e(nothing[:1].upper() + nothing[1:])}.</p>")
    summaries, sample_rows = profile.get("predictions") or [], profile.get("sample_rows")
    figures = []
    for i, s in enumerate(summaries):
        figures.extend(_prediction_figures(f"prediction-{i}", s))
    if not figures:
        return ""
    scored = report.get("output_rows") or 0
    note = (
        f"<p class=note>From the first {sample_rows:,} of the {scored:,} rows this run scored.</p>"
        if sample_rows
        else ""
    )
    return _section("predictions", "Predictions", note + f"<div class=charts>{''.join(figures)}</div>")


def _prediction_figures(key: str, s: Mapping[str, Any]) -> list[str]:
    """The figures of one prediction column, by its summary's ``kind``."""
    name, kind = s["column"], s["kind"]
    if kind == "categories":
        counts = [(v, c) for v, c in s["counts"]] + ([("(other values)", s["other"])] if s.get("other") else [])
        return [_figure(charts.bar_chart(key, counts), f"{name}: {s['distinct']:,} distinct values")]
    if kind == "numeric":
        hist = s["histogram"]
        return [_figure(charts.histogram_chart(key, hist["edges"], hist["counts"], name), f"{name}: value histogram")]
    if kind == "vectors":
        if not s.get("norm_stats"):  # no row of the sample has a value (choice_logprobs of a run without choices)
            return []
        hist = s["norm_histogram"]
        out = [
            _figure(
                charts.histogram_chart(key, hist["edges"], hist["counts"], f"L2 norm of {name}"),
                f"{name}: {s['width']} dimensions",
            )
        ]
        proj = s.get("projection")
        if proj:
            svg = charts.scatter_chart(
                key + "-pca", proj["points"], proj["explained"], proj.get("colours"), proj.get("colour_by")
            )
            out.append(_figure(svg, f"{name}: first {len(proj['points']):,} rows on their two principal components"))
        return out
    if kind == "items":
        hist = s["items_histogram"]
        out = [
            _figure(
                charts.histogram_chart(key, hist["edges"], hist["counts"], f"{name} per row"),
                f"{name}: {s['items']:,} in the sample",
            )
        ]
        for j, field in enumerate(s.get("fields") or []):
            out.append(
                _figure(
                    charts.bar_chart(f"{key}-{j}", [(v, c) for v, c in field["counts"]], f"{name} items"),
                    f"{name}.{field['field']}",
                )
            )
        return out
    return []


def _validation(report: Mapping[str, Any]) -> str:
    validation = report.get("validation")
    if validation is None:
        why = (
            "the error rate was exceeded" if report.get("status") == "error_rate_exceeded" else "validation is disabled"
        )
        return _section("validation", "Validation", f"<p class=note>Not run: {why}.</p>")
    checks = validation.get("checks") or []
    rows = [
        (
            "pass" if c.get("success") else "FAIL",
            c.get("expectation"),
            c.get("column") or "",
            _short(c.get("observed")),
            c.get("unexpected_count") or "",
            c.get("error") or "",
        )
        for c in checks
    ]
    failed = sum(1 for c in checks if not c.get("success"))
    summary = f"<p>{len(checks)} checks, <span class={'fail' if failed else 'pass'}>{failed} failed</span>.</p>"
    table = _table(["result", "check", "column", "observed", "unexpected rows", "error"], rows, numeric=[4])
    table = table.replace("<td>pass</td>", "<td class=pass>pass</td>").replace(
        "<td>FAIL</td>", "<td class=fail>FAIL</td>"
    )
    return _section("validation", "Validation", summary + table)


_DRIFT_CHARTS = (
    ("label_shares", "share of rows", "label shares"),
    ("score_bins", "share of rows", "score, in bins cut at the baseline's deciles"),
    ("score_deciles", "score", "score deciles"),
    ("embedding_norm_deciles", "L2 norm", "embedding norm deciles"),
    ("text_length_deciles", "characters", "text length deciles"),
)
"""The profiles a drift section draws: key, axis label, caption."""


def _drift(drift: Mapping[str, Any] | None) -> str:
    """The drift figures against their bounds, and each profiled distribution of this run beside the baseline's."""
    if drift is None or not (
        drift_gated(drift) or drift.get("figures")
    ):  # no gate and nothing compared: nothing to say
        return ""
    bounds, exceeded = drift.get("bounds") or {}, set(drift.get("exceeded") or ())
    rows = [
        (
            figure,
            "-" if value is None else f"{value:.4f}",
            ", ".join(f"{side} {bound:g}" for side, bound in (bounds.get(figure) or {}).items())
            or "none (reported only)",
            "EXCEEDED" if figure in exceeded else ("pass" if figure in bounds else ""),
        )
        for figure, value in (drift.get("figures") or {}).items()
    ]
    body = f"<p id=drift-line>{_e(drift_text(drift))}</p>"
    if rows:
        table = _table(["figure", "value", "bound", "result"], rows, numeric=[1])
        body += table.replace("<td>pass</td>", "<td class=pass>pass</td>").replace(
            "<td>EXCEEDED</td>", "<td class=fail>EXCEEDED</td>"
        )
    profiles = drift.get("profiles") or {}
    run, baseline = profiles.get("run") or {}, profiles.get("baseline") or {}
    figures = []
    for i, (key, axis, caption) in enumerate(_DRIFT_CHARTS):
        ours, theirs = run.get(key), baseline.get(key)
        if (not ours and not theirs) or (key == "score_deciles" and run.get("score_bins")):  # bins say it better
            continue
        categories, series = _drift_series(
            key, ours, theirs, baseline.get("score_bin_edges"), drift.get("baseline_version")
        )
        figures.append(_figure(charts.paired_bar_chart(f"drift-{i}", categories, series, axis), caption))
    if figures:
        body += f"<div class=charts>{''.join(figures)}</div>"
    return _section("drift", "Drift", body)


def _drift_series(key: str, ours: Any, theirs: Any, edges: list | None, version: Any) -> tuple[list[str], list]:
    """The categories and the two series (this run, the baseline) of one drift chart."""
    names = ("this run", f"baseline (version {version})")
    if key == "label_shares":
        labels = sorted(set(ours or {}) | set(theirs or {}))
        return labels, [
            (n, [(shares or {}).get(k, 0.0) for k in labels]) for n, shares in zip(names, (ours, theirs)) if shares
        ]
    if key == "score_bins":
        cuts = [f"{e:.3g}" for e in edges or []]
        bins = (
            [f"≤ {cuts[0]}"] + [f"{a} – {b}" for a, b in zip(cuts[:-1], cuts[1:])] + [f"> {cuts[-1]}"] if cuts else []
        )
        return bins, [
            (n, [c / (sum(counts) or 1) for c in counts]) for n, counts in zip(names, (ours, theirs)) if counts
        ]
    deciles = [f"p{10 * (i + 1)}" for i in range(len(ours or theirs))]
    return deciles, [(n, values) for n, values in zip(names, (ours, theirs)) if values]


def _dead_letters(sample: Mapping[str, Any] | None, report: Mapping[str, Any]) -> str:
    if not report.get("error_rows"):
        return _section("dead-letters", "Dead-lettered rows", "<p class=note>None: no input row was dead-lettered.</p>")
    if not sample:
        return ""
    note = (
        f"<p class=note>{len(sample['rows'])} of {report['error_rows']:,} rows {_e(dead_letters_place(report))}; "
        f"values cut at {sample['text_limit']} characters.</p>"
    )
    return _section("dead-letters", "Dead-lettered rows", note + _table(sample["columns"], sample["rows"]))


def _short(value: Any, limit: int = 120) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
