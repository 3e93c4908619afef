"""The run report: the facts of one run (:class:`RunReport`), JSON for a scheduler, an auditor or the next job.

Its files (``x.json`` and, beside it, the page ``x.html``) are written by :mod:`lakescore.jobs.report.files`; its
lines of text are :mod:`lakescore.jobs.report.text`'s.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lakescore.jobs.cost import cost_text
from lakescore.jobs.report.text import (
    UNFINISHED,
    dead_letters_place,
    drift_gated,
    drift_text,
    nothing_scored_text,
    precision_check_text,
)

__all__ = ["RunReport", "UNFINISHED", "html_path_for", "software_versions"]


@dataclass
class RunReport:
    """Facts of one run. ``status`` is ``succeeded``, ``validation_failed``, ``error_rate_exceeded`` or
    ``drift_exceeded`` for a run that reached its publish decision, ``failed``, ``interrupted`` or ``pending``
    (:data:`UNFINISHED`) for one that stopped before: then ``failed_step`` and ``error`` say where and why,
    ``started_at``, ``seconds`` and ``step_seconds`` how long it ran, and the counts are unknown (``None``).

    ``input_rows == rows_kept + output_rows + error_rows + ranked_out`` for every finished run: each input row is kept
    (incremental mode), scored into the output, ranked out (``rank``) or, with its reason (``error_reasons`` counts
    them), in ``errors_table``.
    """

    run_id: str
    status: str
    task: str
    input: str | None
    output: str | None
    model_id: str | None
    model_revision: str | None
    model_sha256: str | None
    model_listing: dict[str, Any] | None = None
    """A model served elsewhere (``generate.endpoint``): what the endpoint's ``/v1/models`` said of it when the run
    started, as ``model_sha256`` and the scoring spec cover it: ``{"answered": false}`` (not answered), ``{"answered":
    true, "entry": null}`` (answered without listing the model) or the model's ``entry``; ``None`` for a model with
    files here."""
    attempt: int | None = None
    """This run id's attempt: 1, and one more for each rerun of the run id (a rerun resumes its staging), counted in the
    metrics table (``None`` without one: ``validation.metrics`` off, or the report of a run that raised)."""
    attempts: list[dict[str, Any]] | None = None
    """The run id's earlier attempts, oldest first, from the metrics table: ``attempt``, ``status``, ``started_at``,
    ``finished_at``, ``seconds``, row counts, ``delta_version``, ``drift_exceeded``, ``error``; ``None`` for a first
    attempt."""
    input_version: int | None = None
    """The Delta version of the input the run read from start to end (``None``: not a Delta input)."""
    input_rows: int | None = None
    ignored_files: int | None = None
    """``input_format`` ``images``: files under the input folder that are not images (by extension), not read; ``None``
    for table inputs."""
    output_rows: int | None = None
    output_chunks: int | None = None
    """A chunked run (``embed.chunk``): the output rows its ``output_rows`` documents became (their chunks, and
    document vectors); ``None`` for other runs."""
    error_rows: int | None = None
    rows_kept: int | None = None
    """Input rows whose output row was current and was not scored again (0 outside incremental mode)."""
    rows_scored: int | None = None
    """Input rows scored this run: ``output_rows``, plus ``ranked_out`` with ``rank``."""
    ranked_out: int | None = None
    """``rank``: scored rows past their key's ``top_k``, not published (``None`` without ``rank``)."""
    rows_missing: int | None = None
    """Incremental mode: output rows whose id is not in the input (``None`` in the other modes)."""
    spec_changes: list[str] | None = None
    """Incremental mode: how this run's scoring spec differs from the one the output's rows were scored with (settings,
    model files besides the weights, lakescore's output version), so that every row was scored again; ``None`` when
    nothing differs."""
    rows_deleted: int | None = None
    """Incremental mode: output rows the run's MERGE deleted (missing ids with ``write.delete_missing``, ids whose
    input now fails), documents for a chunked run; ``None`` in the other modes."""
    chunk_rows_deleted: int | None = None
    """Incremental mode, a chunked run: the chunk rows the MERGE deleted (the deleted documents' and the shortened
    ones' last chunks); ``None`` for other runs."""
    rows_carried: int | None = None
    """Incremental mode: rows an earlier run dead-lettered for a reason of their own, unchanged since, not scored
    again: their dead letters are carried in the errors table (counted in ``error_rows`` and ``error_reasons``, not
    toward ``max_error_rate``); ``None`` in the other modes."""
    input_scans: int | None = None
    """Reads of the rows to score by the scoring step: 1 for a run of any number of chunks (they are written once,
    partitioned by chunk, and each chunk reads its partition), 0 when a resumed run finds them written or nothing
    is left to score. The id check reads the input's ids before it; in incremental mode the plan's one join over the
    input writes the new and changed rows to a private table, and the scoring step reads those."""
    dedup: dict[str, Any] | None = None
    """``scoring.dedup``: ``mode``, whether it was ``used``, what ``auto`` decided from (``sample_rows`` rows with
    ``sample_distinct`` distinct inputs: a sample, or in incremental mode every row to score and an estimate of its
    distinct inputs) and ``forward_passes_saved`` (rows that shared another row's input in their chunk)."""
    precision_check: dict[str, Any] | None = None
    """A reduced-precision run (``model.quantize`` int8, ``model.dtype`` bfloat16 / float16): what its preflight
    checked against float32 and passed: ``path``, ``sample_rows`` and the head's figures (``cosine_p1`` for
    embeddings, ``agreement`` and ``prob_delta_p99`` for classifiers); ``None`` for float32 runs."""
    cpu_path: dict[str, str] | None = None
    """``model.backend`` / ``model.dtype`` ``auto``: the CPU path it chose from this host's CPU flags: ``backend``,
    ``dtype``, ``quantize`` and the ``reason`` (:func:`lakescore.udfs.models.cpu_paths.choose_cpu_path`); ``None``
    when neither was ``auto``."""
    staging_removed: list[str] | None = None
    """Staging of the output's earlier runs that no run can resume any more (other run keys, last committed before
    this run started), removed after this run's publish: the tables or folders."""
    errors_table: str | None = None
    error_reasons: dict[str, int] | None = None
    errors_delta_version: int | None = None
    chunks: dict[str, Any] | None = None
    seconds: float | None = None
    rows_per_second: float | None = None
    """Input rows per second of the whole run; ``None`` when the run scored no row."""
    delta_version: int | None = None
    previous_delta_version: int | None = None
    validation: dict[str, Any] | None = None
    drift: dict[str, Any] | None = None
    """This run's predictions against the output at a baseline version (:func:`lakescore.jobs.steps.drift.check_drift`):
    ``figures`` (``label_js``, ``score_psi``, ``id_cosine_p5``, as the task's outputs allow), ``bounds``, ``exceeded``,
    ``baseline_version``, ``gated`` (whether a bound applied), ``note`` (why there was no comparison), and the
    ``profiles`` of both sides; ``None`` for a task without a profiled output."""
    provider_batch: dict[str, Any] | None = None
    """A run through the provider's Batch API (``generate.endpoint.batch``, ``embed.endpoint.batch``): its ``batches``
    (id, round, lines, state), ``lines_submitted``, ``lines_resubmitted`` and ``retry_reasons`` (lines by the reason
    they were sent again), and with a price ``token_cost_per_row`` (the same tokens at the per-row price) and
    ``saving``."""
    step_seconds: dict[str, float] = field(default_factory=dict)
    workers: dict[str, float] = field(default_factory=dict)
    cost: dict[str, Any] | None = None
    """What the run used and cost: core-seconds and GPU-seconds of the scoring stage and the whole run, rows per
    core-second and, with ``resources.price_per_*_hour`` set, ``cost`` and ``cost_per_million_rows``
    (:func:`lakescore.jobs.cost.run_cost` defines each); ``None`` for a run that did not finish."""
    spark: dict[str, str | None] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None
    failed_step: str | None = None
    """For ``status`` ``failed`` / ``interrupted`` / ``pending``: the step the run stopped in."""
    versions: dict[str, str | None] = field(default_factory=dict)
    """lakescore, Spark and Delta versions the run used (:func:`software_versions`)."""
    profile: dict[str, Any] | None = None
    """Samples and summaries the HTML report draws (:func:`lakescore.jobs.steps.report_data.collect_profile`)."""
    html_report: str | None = None
    """Where :func:`write_report` put the HTML page."""
    log_file: str | None = None
    """The run's log file: the JVM's warnings and errors and a failure's full traceback, which the console leaves
    out (``None``: nothing was logged there, or the console got everything: ``-v``, a session lakescore did not
    build)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One human line per fact that matters, for the end of a log."""
        lines = [f"run {self.run_id}: {self.status}"]
        if self.output_rows is not None:
            where = f"Delta version {self.delta_version}" if self.delta_version is not None else "not published"
            if self.delta_version is None and self.status == "succeeded":
                where = "unchanged: no new version"
            lines.append(
                f"  {self.input_rows} input rows -> {self.output_rows} rows for {self.output} ({where})"
                if self.output_chunks is None
                else f"  {self.input_rows} input documents -> {self.output_rows} documents in {self.output_chunks} "
                f"chunk rows for {self.output} ({where})"
            )
        if self.ranked_out is not None:
            lines.append(f"  top-K per key: {self.ranked_out} scored rows ranked out, not published")
        if self.ignored_files:
            lines.append(f"  {self.ignored_files} file(s) in the input folder ignored: not of the task's file types")
        if self.rows_missing is not None:
            chunk_rows = f" ({self.chunk_rows_deleted} chunk rows)" if self.chunk_rows_deleted is not None else ""
            carried = f", {self.rows_carried} dead letters carried (not scored again)" if self.rows_carried else ""
            lines.append(
                f"  incremental: {self.rows_kept} kept, {self.rows_scored} scored{carried}, {self.rows_missing} "
                f"missing from the input, {self.rows_deleted or 0} deleted from the output{chunk_rows}"
            )
        if self.spec_changes:
            lines.append(f"  scoring spec changed, every row scored again: {'; '.join(self.spec_changes)}")
        if self.error_rows:
            reasons = ", ".join(f"{k} {v}" for k, v in (self.error_reasons or {}).items())
            lines.append(f"  {self.error_rows} rows {dead_letters_place(vars(self))} ({reasons})")
        if self.cpu_path:
            path = self.cpu_path
            lines.append(f"  model auto: {path['backend']} {path['dtype']} ({path['reason']})")
        if self.precision_check:
            lines.append(f"  {precision_check_text(self.precision_check)}")
        if self.dedup and self.dedup.get("used"):
            lines.append(
                f"  dedup: {self.dedup['forward_passes_saved']} forward passes saved (identical inputs scored once)"
            )
        if self.provider_batch:
            batch = self.provider_batch
            saving = (
                f", saving {batch['saving']:,.4g} against the per-row price" if batch.get("saving") is not None else ""
            )
            lines.append(
                f"  provider batch: {len(batch['batches'])} batch(es), {batch['lines_submitted']} lines submitted, "
                f"{batch['lines_resubmitted']} resubmitted{saving}"
            )
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
            rate = (
                f", {self.workers['tokens_per_second']:.1f} tokens/s" if self.workers.get("tokens_per_second") else ""
            )
            cached = int(self.workers.get("tokens_in_cached") or 0)
            written = int(self.workers.get("tokens_in_cache_write") or 0)
            apart = [f"{cached} cached: a prompt cache or a shared prefix"] if cached else []
            apart += [f"{written} written to the provider's prompt cache"] if written else []
            shown = f" ({'; '.join(apart)})" if apart else ""
            lines.append(
                f"  generated {int(self.workers['tokens_out'])} tokens from {int(self.workers['tokens_in'])} prompt "
                f"tokens{shown}{rate}"
            )
        elif self.workers.get("tokens_in"):  # an embedding server's usage: prompt tokens only
            lines.append(f"  sent {int(self.workers['tokens_in'])} prompt tokens")
        if self.workers.get("audio_ms"):  # a transcription endpoint's: what a price per audio minute charges
            lines.append(f"  sent {int(self.workers['audio_ms']) / 60_000:,.2f} minutes of audio")
        if self.workers.get("requests"):  # an endpoint or served engine: what the rows cost in requests
            lines.append(
                f"  sent {int(self.workers['requests'])} requests, {int(self.workers.get('retries') or 0)} retried "
                f"({int(self.workers.get('rate_limited') or 0)} answered 429)"
            )
        if self.seconds is not None:
            rate = f", {self.rows_per_second:.1f} rows/s" if self.rows_per_second and nothing is None else ""
            lines.append(f"  {self.seconds:.1f} s{rate}")
        if self.cost:
            lines.append(f"  {cost_text(self.cost)}")
        if self.model_sha256:
            lines.append(f"  model {self.model_id} sha256 {self.model_sha256[:16]}…")
        if self.validation is not None:
            failed = self.validation.get("failed", [])
            lines.append(
                f"  validation: {'passed' if self.validation['success'] else f'{len(failed)} check(s) failed'}"
            )
            for check in failed:
                lines.append(
                    f"    failed: {check['expectation']} {check.get('column') or ''} {check.get('observed', '')}"
                )
        if self.drift is not None and drift_gated(self.drift):  # no bound set: no gate to speak of
            lines.append(f"  drift: {drift_text(self.drift)}")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


def html_path_for(json_path: os.PathLike | str) -> Path:
    """The HTML page's path for the JSON report at ``json_path``: same stem, ``.html``.

    >>> html_path_for("reports/2026-11-21.json").as_posix()
    'reports/2026-11-21.html'
    """
    return Path(json_path).expanduser().with_suffix(".html")


def software_versions(spark_version: str | None) -> dict[str, str | None]:
    """``{"lakescore", "spark", "delta"}`` versions: the package's, the session's, and delta-spark's
    (``None`` where the platform ships Delta without that Python package)."""
    from importlib.metadata import PackageNotFoundError, version

    from lakescore._version import __version__

    try:
        delta = version("delta-spark")
    except PackageNotFoundError:
        delta = None
    return {"lakescore": __version__, "spark": spark_version, "delta": delta}
