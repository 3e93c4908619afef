"""``lakescore history <output> [--run ID]``: an output's past runs, one line per attempt, from Delta's history, the
metrics table and the stored reports.

Every run tags its commits with :func:`~lakescore.jobs.platform.tables.run_metadata` (run id and
the JSON report's path): the publish commit on the output, and the errors-table commit that goes with it. So the
output's history lists the runs that published; the metrics table (``<output>_metrics``) adds every attempt that did
not (refused by a check, failed, interrupted), each rerun of a run id as its next attempt; and the errors table's
history adds the refused runs of an earlier lakescore, which wrote their errors table. Each run's JSON report, where
it can still be read and is of that attempt, fills in status, rows and seconds, else its metrics row does. The drift
figures come from the report, else from the metrics row. Commits without lakescore's tag (another writer, a run before
tagging) are listed as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lakescore.jobs.platform.tables import HistoryEntry, TableError, delta_history
from lakescore.jobs.report.model import RunReport, html_path_for
from lakescore.jobs.steps.metrics import ATTEMPT, read_metrics

__all__ = ["RunRecord", "run_history", "format_history", "format_run", "find_run"]


@dataclass(frozen=True)
class RunRecord:
    """One run as history shows it: Delta's facts, and its report when readable."""

    run_id: str | None
    when: str
    operation: str
    delta_version: int | None
    """The output version it published; ``None`` for a run that published nothing."""
    rows_written: int | None
    report_path: str | None
    report: dict[str, Any] | None
    metrics: dict[str, Any] | None = None
    """This attempt's row in the metrics table (:mod:`lakescore.jobs.steps.metrics`), when it has one."""

    @property
    def attempt(self) -> int | None:
        """Which attempt of its run id this is (from its metrics row); ``None`` when unknown."""
        return (self.metrics or {}).get(ATTEMPT)

    @property
    def facts(self) -> dict[str, Any]:
        """The attempt's report, else its metrics row (status, row counts, seconds, weights), else nothing."""
        return self.report or self.metrics or {}

    @property
    def drift(self) -> dict[str, Any] | None:
        """The drift figures (``figures``, ``exceeded``, ``note``): the report's, else the metrics row's."""
        if self.report and self.report.get("drift"):
            return self.report["drift"]
        if not self.metrics:
            return None
        figures = {
            k: self.metrics[k] for k in ("label_js", "score_psi", "id_cosine_p5") if self.metrics.get(k) is not None
        }
        return {
            "figures": figures,
            "exceeded": self.metrics.get("drift_exceeded") or [],
            "note": self.metrics.get("drift_note"),
        }

    @property
    def status(self) -> str:
        if self.facts:
            return str(self.facts.get("status"))
        if self.run_id is None:
            return f"other commit ({self.operation})"
        return "published" if self.delta_version is not None else "not published"


def run_history(
    spark, output: str, errors: str, limit: int | None = None, metrics: str | None = None
) -> list[RunRecord]:
    """The runs of ``output`` (and its errors table ``errors``; with ``metrics``, every attempt in that metrics
    table), newest first, at most ``limit``.

    A run id appears once per attempt in the metrics table (a rerun of a run id, e.g. after a refusal, is its next
    attempt) and once per publish of the output that no attempt accounts for.
    """
    published = delta_history(spark, output, limit)
    attempts = read_metrics(spark, metrics, limit) if metrics else []
    refused = delta_history(spark, errors, limit)
    if not published and not attempts and not refused:
        raise TableError(f"no Delta table {output!r} (nor its errors table) to show the history of")
    records = [_record(entry, entry.version) for entry in published]
    publishes = {(r.run_id, r.delta_version): i for i, r in enumerate(records)}
    for row in attempts:
        i = publishes.get((row["run_id"], row["delta_version"]))
        if i is not None:
            records[i] = _with_attempt(records[i], row)
        else:  # an attempt that published nothing: its report, if the run id's report file still holds this attempt's
            paths = [r.report_path for r in records if r.run_id == row["run_id"] and r.report_path]
            record = RunRecord(row["run_id"], _when(row), "-", None, None, paths[0] if paths else None, None)
            records.append(_with_attempt(replace(record, report=_read_report(record.report_path)), row))
    seen = {r.run_id for r in records if r.run_id}
    for entry in refused:
        if entry.run_id and entry.run_id not in seen:  # refused by an earlier lakescore, which wrote its errors table
            seen.add(entry.run_id)
            records.append(replace(_record(entry, None), rows_written=None))
    records.sort(key=lambda r: (r.when, r.attempt or 0), reverse=True)
    return records[:limit] if limit else records


def _with_attempt(record: RunRecord, row: dict[str, Any]) -> RunRecord:
    """``record`` with its attempt's metrics ``row``; its report kept only if it is that attempt's (a later attempt
    of the run id writes the same report file)."""
    report = record.report
    if report is not None and (
        report.get("run_id") != row["run_id"] or report.get(ATTEMPT) not in (None, row[ATTEMPT])
    ):
        report = None
    return replace(record, metrics=row, report=report)


def _when(row: dict[str, Any]) -> str:
    """An attempt's time as history shows a commit's: when it finished (else started), to the second."""
    instant = row.get("finished_at") or row.get("started_at")
    return instant.isoformat(sep=" ", timespec="seconds") if instant else "-"


def find_run(records: list[RunRecord], run_id: str) -> RunRecord:
    """The newest record of ``run_id``; :class:`~lakescore.jobs.platform.tables.TableError` listing recent ids when
    none."""
    for record in records:
        if record.run_id == run_id:
            return record
    known = ", ".join(r.run_id for r in records[:10] if r.run_id) or "none tagged"
    raise TableError(f"no run {run_id!r} in this output's history (recent runs: {known})")


def format_history(records: list[RunRecord]) -> str:
    """A fixed-width table, a line per attempt: run id, date, status, rows in / out / errors, seconds, core-seconds
    and cost (:mod:`lakescore.jobs.cost`), model sha, Delta version, attempt of the run id, drift figures (``!``: past
    its bound)."""
    header = (
        "run id",
        "date (UTC)",
        "status",
        "in",
        "out",
        "errors",
        "seconds",
        "core-s",
        "cost",
        "model sha256",
        "version",
        "attempt",
        "drift",
    )
    rows = [header] + [_cells(r) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    right = {3, 4, 5, 6, 7, 8, 10, 11}
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    )


def format_run(record: RunRecord) -> str:
    """That run's report summary and where its JSON and HTML reports are (or that they are gone)."""
    if not record.report:
        where = record.report_path or "no report path was recorded"
        return (
            f"run {record.run_id}: {record.status} (Delta version {record.delta_version}, {record.when})\n"
            f"  report not readable: {where}"
        )
    fields = {k: v for k, v in record.report.items() if k in RunReport.__dataclass_fields__}
    lines = [RunReport(**fields).summary(), f"  JSON report: {record.report_path}"]
    assert record.report_path is not None  # the report was read from it
    html = record.report.get("html_report") or str(html_path_for(record.report_path))
    lines.append(f"  HTML report: {html}" + ("" if Path(html).is_file() else " (missing)"))
    return "\n".join(lines)


def _record(entry: HistoryEntry, version: int | None) -> RunRecord:
    report = _read_report(entry.report)
    if report is not None and report.get("run_id") != entry.run_id:
        report = None  # the file now holds a later run's report
    return RunRecord(entry.run_id, entry.timestamp, entry.operation, version, entry.rows, entry.report, report)


def _read_report(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _cells(record: RunRecord) -> tuple[str, ...]:
    report = record.facts

    def number(key: str, fallback: int | None = None) -> str:
        value = report.get(key, fallback)
        return f"{value:,}" if isinstance(value, int) else "-"

    seconds = report.get("seconds")
    sha = report.get("model_sha256")
    cost = report.get("cost") or {}
    core_seconds = (cost.get("core_seconds") or {}).get("run")
    return (
        record.run_id or "(not lakescore)",
        record.when,
        record.status,
        number("input_rows"),
        number("output_rows", record.rows_written),
        number("error_rows"),
        f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "-",
        f"{core_seconds:,.0f}" if isinstance(core_seconds, (int, float)) else "-",
        f"{cost['cost']:.4g}" if isinstance(cost.get("cost"), (int, float)) else "-",
        sha[:12] if sha else "-",
        str(record.delta_version) if record.delta_version is not None else "-",
        str(record.attempt) if record.attempt is not None else "-",
        _drift_cell(record.drift),
    )


def _drift_cell(drift: dict[str, Any] | None) -> str:
    """``label_js 0.412!, score_psi 0.031``: each figure, ``!`` where it passed its bound; ``-`` when none."""
    if not drift or not drift.get("figures"):
        return "-"
    past = set(drift.get("exceeded") or ())
    return (
        ", ".join(f"{k} {v:.3f}{'!' if k in past else ''}" for k, v in drift["figures"].items() if v is not None) or "-"
    )
