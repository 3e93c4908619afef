"""The run report: JSON for a scheduler, an auditor or the next job, and the same facts as an HTML page.

:func:`write_report` writes ``x.json`` and, beside it, ``x.html``
(:mod:`lakescore.jobs.report_html`): one self-contained page that opens with no network.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from lakescore.jobs.cost import cost_text

__all__ = [
    "RunReport", "UNFINISHED", "write_report", "report_location", "html_path_for", "software_versions", "one_line",
    "precision_check_text", "nothing_scored_text", "dead_letters_place", "drift_gated", "drift_text",
]

log = logging.getLogger(__name__)

UNFINISHED = ("failed", "interrupted")
"""Statuses of a run that stopped before its publish decision: its report knows no row counts."""


@dataclass
class RunReport:
    """Facts of one run. ``status`` is ``succeeded``, ``validation_failed``, ``error_rate_exceeded`` or
    ``drift_exceeded`` for a run that reached its publish decision, ``failed`` or ``interrupted``
    (:data:`UNFINISHED`) for one that stopped before: then ``failed_step`` and ``error`` say where and why, ``started_at``, ``seconds`` and ``step_seconds``
    how long it ran, and the counts are unknown (``None``).

    ``input_rows == rows_kept + output_rows + error_rows + ranked_out`` for every finished run: each input row is kept
    (incremental mode), scored into the output, ranked out (``rank``) or, with its reason (``error_reasons`` counts
    them), in ``errors_table``.
    """

    run_id: str
    status: str
    task: str
    input: str
    output: str
    model_id: str
    model_revision: Optional[str]
    model_sha256: Optional[str]
    attempt: Optional[int] = None
    """This run id's attempt: 1, and one more for each rerun of the run id (a rerun resumes its staging), counted in the
    metrics table (``None`` without one: ``validation.metrics`` off, or the report of a run that raised)."""
    attempts: Optional[list[dict[str, Any]]] = None
    """The run id's earlier attempts, oldest first, from the metrics table: ``attempt``, ``status``, ``started_at``,
    ``finished_at``, ``seconds``, row counts, ``delta_version``, ``drift_exceeded``, ``error``; ``None`` for a first
    attempt."""
    input_version: Optional[int] = None
    """The Delta version of the input the run read from start to end (``None``: not a Delta input)."""
    input_rows: Optional[int] = None
    ignored_files: Optional[int] = None
    """``input_format`` ``images``: files under the input folder that are not images (by extension), not read; ``None``
    for table inputs."""
    output_rows: Optional[int] = None
    error_rows: Optional[int] = None
    rows_kept: Optional[int] = None
    """Input rows whose output row was current and was not scored again (0 outside incremental mode)."""
    rows_scored: Optional[int] = None
    """Input rows scored this run: ``output_rows``, plus ``ranked_out`` with ``rank``."""
    ranked_out: Optional[int] = None
    """``rank``: scored rows past their key's ``top_k``, not published (``None`` without ``rank``)."""
    rows_missing: Optional[int] = None
    """Incremental mode: output rows whose id is not in the input (``None`` in the other modes)."""
    spec_changes: Optional[list[str]] = None
    """Incremental mode: how this run's scoring spec differs from the one the output's rows were scored with (settings,
    model files besides the weights, lakescore's output version), so that every row was scored again; ``None`` when
    nothing differs."""
    rows_deleted: Optional[int] = None
    """Incremental mode: output rows the run's MERGE deleted (missing ids with ``write.delete_missing``, ids whose
    input now fails); ``None`` in the other modes."""
    input_scans: Optional[int] = None
    """Reads of the rows to score by the scoring step: 1 for a run of any number of chunks (they are written once,
    partitioned by chunk, and each chunk reads its partition), 0 when a resumed run finds them written or nothing
    is left to score. The id check reads the input's ids before it; in incremental mode the plan's one join over the
    input writes the new and changed rows to a private table, and the scoring step reads those."""
    dedup: Optional[dict[str, Any]] = None
    """``scoring.dedup``: ``mode``, whether it was ``used``, what ``auto`` decided from (``sample_rows`` rows with
    ``sample_distinct`` distinct inputs: a sample, or in incremental mode every row to score and an estimate of its
    distinct inputs) and ``forward_passes_saved`` (rows that shared another row's input in their chunk)."""
    precision_check: Optional[dict[str, Any]] = None
    """A reduced-precision run (``model.quantize`` int8, ``model.dtype`` bfloat16 / float16): what its preflight
    checked against float32 and passed: ``path``, ``sample_rows`` and the head's figures (``cosine_p1`` for
    embeddings, ``agreement`` and ``prob_delta_p99`` for classifiers); ``None`` for float32 runs."""
    staging_removed: Optional[list[str]] = None
    """Staging of the output's earlier runs that no run can resume any more (other run keys, last committed before
    this run started), removed after this run's publish: the tables or folders."""
    errors_table: Optional[str] = None
    error_reasons: Optional[dict[str, int]] = None
    errors_delta_version: Optional[int] = None
    chunks: Optional[dict[str, Any]] = None
    seconds: Optional[float] = None
    rows_per_second: Optional[float] = None
    """Input rows per second of the whole run; ``None`` when the run scored no row."""
    delta_version: Optional[int] = None
    previous_delta_version: Optional[int] = None
    validation: Optional[dict[str, Any]] = None
    drift: Optional[dict[str, Any]] = None
    """This run's predictions against the output at a baseline version (:func:`lakescore.jobs.steps.drift.check_drift`):
    ``figures`` (``label_js``, ``score_psi``, ``id_cosine_p5``, as the task's outputs allow), ``bounds``, ``exceeded``,
    ``baseline_version``, ``gated`` (whether a bound applied), ``note`` (why there was no comparison), and the
    ``profiles`` of both sides; ``None`` for a task without a profiled output."""
    step_seconds: dict[str, float] = field(default_factory=dict)
    workers: dict[str, float] = field(default_factory=dict)
    cost: Optional[dict[str, Any]] = None
    """What the run used and cost: core-seconds and GPU-seconds of the scoring stage and the whole run, rows per
    core-second and, with ``resources.price_per_*_hour`` set, ``cost`` and ``cost_per_million_rows``
    (:func:`lakescore.jobs.cost.run_cost` defines each); ``None`` for a run that did not finish."""
    spark: dict[str, str] = field(default_factory=dict)
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    error: Optional[str] = None
    failed_step: Optional[str] = None
    """For ``status`` ``failed`` / ``interrupted``: the step the run stopped in."""
    versions: dict[str, Optional[str]] = field(default_factory=dict)
    """lakescore, Spark and Delta versions the run used (:func:`software_versions`)."""
    profile: Optional[dict[str, Any]] = None
    """Samples and summaries the HTML report draws (:func:`lakescore.jobs.steps.report_data.collect_profile`)."""
    html_report: Optional[str] = None
    """Where :func:`write_report` put the HTML page."""
    log_file: Optional[str] = None
    """The run's log file: the JVM's warnings and errors and a failure's full traceback, which the console leaves
    out (``None``: nothing was logged there, or the console got everything: ``-v``, a session lakescore did not build)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One human line per fact that matters, for the end of a log."""
        lines = [f"run {self.run_id}: {self.status}"]
        if self.output_rows is not None:
            where = f"Delta version {self.delta_version}" if self.delta_version is not None else "not published"
            if self.delta_version is None and self.status == "succeeded":
                where = "unchanged: no new version"
            lines.append(f"  {self.input_rows} input rows -> {self.output_rows} rows for {self.output} ({where})")
        if self.ranked_out is not None:
            lines.append(f"  top-K per key: {self.ranked_out} scored rows ranked out, not published")
        if self.ignored_files:
            lines.append(f"  {self.ignored_files} file(s) in the input folder ignored: not images")
        if self.rows_missing is not None:
            lines.append(
                f"  incremental: {self.rows_kept} kept, {self.rows_scored} scored, {self.rows_missing} missing from the "
                f"input, {self.rows_deleted or 0} deleted from the output"
            )
        if self.spec_changes:
            lines.append(f"  scoring spec changed, every row scored again: {'; '.join(self.spec_changes)}")
        if self.error_rows:
            reasons = ", ".join(f"{k} {v}" for k, v in (self.error_reasons or {}).items())
            lines.append(f"  {self.error_rows} rows {dead_letters_place(vars(self))} ({reasons})")
        if self.precision_check:
            lines.append(f"  {precision_check_text(self.precision_check)}")
        if self.dedup and self.dedup.get("used"):
            lines.append(f"  dedup: {self.dedup['forward_passes_saved']} forward passes saved (identical inputs scored once)")
        if self.chunks and self.chunks.get("skipped"):
            lines.append(f"  resumed: {self.chunks['skipped']} of {self.chunks['total']} chunks were already staged")
        nothing = nothing_scored_text(vars(self))
        if nothing is not None:
            lines.append(f"  {nothing}")
        if self.failed_step:
            lines.append(f"  stopped in step {self.failed_step}")
        if self.staging_removed:
            lines.append(f"  removed stale staging of earlier runs: {', '.join(self.staging_removed)}")
        if self.workers.get("tokens_out"):
            rate = f", {self.workers['tokens_per_second']:.1f} tokens/s" if self.workers.get("tokens_per_second") else ""
            lines.append(f"  generated {int(self.workers['tokens_out'])} tokens from {int(self.workers['tokens_in'])} prompt tokens{rate}")
        if self.workers.get("requests"):  # an endpoint or served engine: what the rows cost in requests
            lines.append(f"  sent {int(self.workers['requests'])} requests, {int(self.workers.get('retries') or 0)} retried "
                         f"({int(self.workers.get('rate_limited') or 0)} answered 429)")
        if self.seconds is not None:
            rate = f", {self.rows_per_second:.1f} rows/s" if self.rows_per_second and nothing is None else ""
            lines.append(f"  {self.seconds:.1f} s{rate}")
        if self.cost:
            lines.append(f"  {cost_text(self.cost)}")
        if self.model_sha256:
            lines.append(f"  model {self.model_id} sha256 {self.model_sha256[:16]}…")
        if self.validation is not None:
            failed = self.validation.get("failed", [])
            lines.append(f"  validation: {'passed' if self.validation['success'] else f'{len(failed)} check(s) failed'}")
            for check in failed:
                lines.append(f"    failed: {check['expectation']} {check.get('column') or ''} {check.get('observed', '')}")
        if self.drift is not None and drift_gated(self.drift):  # no bound set: no gate to speak of
            lines.append(f"  drift: {drift_text(self.drift)}")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


def nothing_scored_text(report: dict[str, Any]) -> Optional[str]:
    """For a finished run (a report's fields, as :meth:`RunReport.as_dict` gives them) that scored no row, the line
    that says why: nothing to score (every row kept, or refused for its id), or every row to score dead-lettered;
    ``None`` when it scored rows or did not finish."""
    scored = report.get("rows_scored")
    scored = report.get("output_rows") if scored is None else scored
    if scored != 0 or report.get("status") in UNFINISHED:
        return None
    reasons = report.get("error_reasons") or {}
    refused = sum(reasons.get(reason, 0) for reason in ("null_id", "duplicate_id"))
    kept = report.get("rows_kept") or 0
    if (report.get("input_rows") or 0) - kept - refused > 0:
        return "no row scored: every row to score was dead-lettered"
    return f"nothing to score: {kept} input rows kept as they are" if kept else "nothing to score"


def precision_check_text(check: dict[str, Any]) -> str:
    """A report's ``precision_check`` as one line: ``bfloat16: within tolerance of float32 on 256 sampled rows
    (cosine_p1 0.9999, ...)``."""
    figures = ", ".join(f"{k} {v:.4f}" for k, v in check.items() if k not in ("path", "sample_rows"))
    return f"{check['path']}: within tolerance of float32 on {check['sample_rows']} sampled rows ({figures})"


def dead_letters_place(report: dict[str, Any]) -> str:
    """Where a run's dead-lettered rows are (a report's fields): ``in <errors table>`` for a run that published; else
    in its staging, since a refused run leaves the errors table as the output's last publish wrote it."""
    if report.get("status") == "succeeded":
        return f"in {report.get('errors_table')}"
    staging = (report.get("chunks") or {}).get("staging")
    return f"dead-lettered, kept in staging {staging} ({report.get('errors_table')} unchanged)"


def drift_gated(drift: dict[str, Any]) -> bool:
    """Whether a bound of ``validation.drift`` applied to the run whose report's ``drift`` this is."""
    return bool(drift.get("gated", drift.get("bounds")))


def drift_text(drift: dict[str, Any]) -> str:
    """A report's ``drift`` as one line: ``against version 3: label_js 0.4123 (max 0.2: exceeded), score_psi 0.0312``,
    or its ``note`` when nothing was compared."""
    figures = drift.get("figures") or {}
    if not figures:
        return drift.get("note") or "nothing compared"
    bounds, exceeded = drift.get("bounds") or {}, set(drift.get("exceeded") or ())
    parts = []
    for figure, value in figures.items():
        text = f"{figure} {value:.4f}" if value is not None else f"{figure} -"
        for side, bound in (bounds.get(figure) or {}).items():
            text += f" ({side} {bound:g}{': exceeded' if figure in exceeded else ''})"
        parts.append(text)
    note = f"; {drift['note']}" if drift.get("note") else ""
    return f"against version {drift.get('baseline_version')}: {', '.join(parts)}{note}"


def write_report(report: RunReport, path: os.PathLike | str, html: bool = True) -> Path:
    """Write ``report`` as JSON to ``path`` atomically (a reader never sees half a report), and with
    ``html`` the HTML page beside it (:func:`html_path_for`), recorded in ``report.html_report``.

    A page that cannot be drawn is logged as a warning and leaves ``html_report`` unset: the
    JSON report is what schedulers depend on.
    """
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    if html:
        _write_html(report, target)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=f".{target.name}.", delete=False) as handle:
        json.dump(report.as_dict(), handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")
    os.replace(handle.name, target)
    return target


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of at most 500 characters, for an operator (builtin error types keep their name); an
    error Spark raised names its root cause (:func:`~lakescore.jobs.platform.tables.failure_reason`)."""
    from lakescore.jobs.platform.tables import failure_reason

    worker = _worker_line(exc)
    if worker:
        return worker
    reason = failure_reason(exc)
    if reason:
        return " ".join(reason.split())[:500]
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    if isinstance(exc, (ValueError, LookupError, OSError, RuntimeError)) and type(exc).__module__ == "builtins":
        return f"{type(exc).__name__}: {text[:500]}"
    return text[:500]


_WORKER_LINE = re.compile(r"\b(?:EndpointDown|EngineStartError): ([^\n]+)")
"""An executor's error whose message is the operator's whole line, as a failed Spark task carries it (in the Python
worker's traceback): the endpoint that stopped the run, the engine that would not start."""


def _worker_line(exc: BaseException) -> Optional[str]:
    """The message of the last such worker error in ``exc``'s text and causes, or ``None``."""
    seen, found = exc, None
    while seen is not None and found is None:
        matches = _WORKER_LINE.findall(str(seen))
        found = matches[-1].strip()[:500] if matches else None
        seen = seen.__cause__ or seen.__context__
    return found


def report_location(report: RunReport, json_path: os.PathLike | str) -> str:
    """The summary's last line: where to look (the HTML page when there is one, and the JSON)."""
    json_file = Path(json_path).expanduser().resolve()
    if report.html_report:
        return f"  report: {report.html_report} (JSON: {json_file.name} beside it)"
    return f"  report: {json_file}"


def html_path_for(json_path: os.PathLike | str) -> Path:
    """The HTML page's path for the JSON report at ``json_path``: same stem, ``.html``.

    >>> html_path_for("reports/2026-11-21.json").as_posix()
    'reports/2026-11-21.html'
    """
    return Path(json_path).expanduser().with_suffix(".html")


def software_versions(spark_version: Optional[str]) -> dict[str, Optional[str]]:
    """``{"lakescore", "spark", "delta"}`` versions: the package's, the session's, and delta-spark's
    (``None`` where the platform ships Delta without that Python package)."""
    from importlib.metadata import PackageNotFoundError, version

    import lakescore

    try:
        delta = version("delta-spark")
    except PackageNotFoundError:
        delta = None
    return {"lakescore": lakescore.__version__, "spark": spark_version, "delta": delta}


def _write_html(report: RunReport, json_path: Path) -> None:
    from lakescore.jobs.report_html import write_html

    try:
        report.html_report = str(html_path_for(json_path).resolve())
        write_html(report.as_dict(), json_path)
    except Exception:  # the page is a view of the JSON; never lose the JSON for it
        report.html_report = None
        log.warning("could not write the HTML report beside %s", json_path, exc_info=True)
