"""The report's sentences: the lines a summary, a log and the HTML page say about a run, and the one line an operator
reads for a failure."""

from __future__ import annotations

import re
from typing import Any

from lakescore.schemas.reasons import DUPLICATE_ID, NULL_ID

__all__ = [
    "UNFINISHED",
    "nothing_scored_text",
    "precision_check_text",
    "dead_letters_place",
    "drift_gated",
    "drift_text",
    "one_line",
    "before_compute",
    "kept_trace",
]

UNFINISHED = ("failed", "interrupted", "pending")
"""Statuses of a run that stopped before its publish decision: its report knows no row counts (``pending``: a
``batch.wait: false`` run whose provider batches still run; the same command collects them)."""


def nothing_scored_text(report: dict[str, Any]) -> str | None:
    """For a finished run (a report's fields, as :meth:`RunReport.as_dict` gives them) that scored no row, the line
    that says why: nothing to score (every row kept, or refused for its id), or every row to score dead-lettered;
    ``None`` when it scored rows or did not finish."""
    scored = report.get("rows_scored")
    scored = report.get("output_rows") if scored is None else scored
    if scored != 0 or report.get("status") in UNFINISHED:
        return None
    reasons = report.get("error_reasons") or {}
    refused = sum(reasons.get(reason, 0) for reason in (NULL_ID, DUPLICATE_ID))
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


def one_line(exc: BaseException, step: str | None = None) -> str:
    """``exc`` as one line of at most 500 characters, for an operator (builtin error types keep their name); an
    error Spark raised names its root cause (:func:`~lakescore.jobs.platform.tables.failure_reason`, ``step``: the
    run's step it stopped, if any); one whose text cannot be had because Spark's JVM stopped says so."""
    try:
        return _one_line(exc, step)
    except Exception as lost:  # py4j's errors ask the JVM for their text: one that died (out of memory) cannot answer
        if type(lost).__module__.split(".")[0] != "py4j" and not isinstance(lost, ConnectionError):
            raise  # lakescore's own fault, not a JVM gone
        return (
            f"{type(exc).__name__}: Spark's JVM stopped before it could say why ({type(lost).__name__}: "
            f"{' '.join(str(lost).split())[:200]}); its last lines are in the driver's log"
        )


def _one_line(exc: BaseException, step: str | None) -> str:
    from lakescore.jobs.platform.tables import failure_reason

    worker = _worker_line(exc)
    if worker:
        return worker
    reason = failure_reason(exc, step)
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


def _worker_line(exc: BaseException) -> str | None:
    """The message of the last such worker error in ``exc``'s text and causes, or ``None``."""
    seen: BaseException | None = exc
    found = None
    while seen is not None and found is None:
        matches = _WORKER_LINE.findall(str(seen))
        found = matches[-1].strip()[:500] if matches else None
        seen = seen.__cause__ or seen.__context__
    return found


def before_compute(exc: BaseException) -> bool:
    """Whether ``exc`` refused the run before any compute: a setting, the input's contract, a table or the model (its
    one line says everything; the CLI exits 2)."""
    from lakescore.jobs.config import ConfigError
    from lakescore.jobs.platform.tables import TableError
    from lakescore.schemas.contracts import InputContractError
    from lakescore.udfs.models.model_source import ModelSourceError

    return isinstance(exc, (ConfigError, InputContractError, TableError, ModelSourceError))


def kept_trace(exc: BaseException) -> str | None:
    """The log file that now holds ``exc``'s full traceback (written there once), or ``None``: an interruption or a
    refusal before compute says everything in its one line, and a session lakescore did not build (or ``-v``) has no
    such file."""
    from lakescore.jobs.platform.spark.console import keep_trace
    from lakescore.jobs.platform.spark.interrupts import was_interrupted

    if was_interrupted(exc) or before_compute(exc):
        return None
    path = keep_trace(exc)
    return str(path) if path is not None else None
