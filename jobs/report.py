"""The JSON run report: what a scheduler, an auditor or the next job reads after a run."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["RunReport", "write_report", "one_line"]


@dataclass
class RunReport:
    """Facts of one run. ``status`` is ``succeeded``, ``validation_failed`` or ``error_rate_exceeded`` for a run
    that reached its publish decision, ``failed`` or ``interrupted`` for one that stopped before (then
    ``failed_step`` and ``error`` say where and why, and the counts are unknown).

    ``input_rows == output_rows + error_rows`` for every finished run: each input row is
    in the output or, with its reason (``error_reasons`` counts them), in ``errors_table``.
    """

    run_id: str
    status: str
    task: str
    input: str
    output: str
    model_id: str
    model_revision: Optional[str]
    model_sha256: Optional[str]
    input_rows: Optional[int] = None
    output_rows: Optional[int] = None
    error_rows: Optional[int] = None
    errors_table: Optional[str] = None
    error_reasons: Optional[dict[str, int]] = None
    errors_delta_version: Optional[int] = None
    chunks: Optional[dict[str, Any]] = None
    seconds: Optional[float] = None
    rows_per_second: Optional[float] = None
    delta_version: Optional[int] = None
    previous_delta_version: Optional[int] = None
    validation: Optional[dict[str, Any]] = None
    step_seconds: dict[str, float] = field(default_factory=dict)
    workers: dict[str, float] = field(default_factory=dict)
    spark: dict[str, str] = field(default_factory=dict)
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    error: Optional[str] = None
    failed_step: Optional[str] = None
    """For ``status`` ``failed`` / ``interrupted``: the step the run stopped in."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One human line per fact that matters, for the end of a log."""
        lines = [f"run {self.run_id}: {self.status}"]
        if self.output_rows is not None:
            where = f"Delta version {self.delta_version}" if self.delta_version is not None else "not published"
            lines.append(f"  {self.input_rows} input rows -> {self.output_rows} rows for {self.output} ({where})")
        if self.error_rows:
            reasons = ", ".join(f"{k} {v}" for k, v in (self.error_reasons or {}).items())
            lines.append(f"  {self.error_rows} rows in {self.errors_table} ({reasons})")
        if self.chunks and self.chunks.get("skipped"):
            lines.append(f"  resumed: {self.chunks['skipped']} of {self.chunks['total']} chunks were already staged")
        if self.seconds is not None:
            rate = f", {self.rows_per_second:.1f} rows/s" if self.rows_per_second else ""
            lines.append(f"  {self.seconds:.1f} s{rate}")
        if self.model_sha256:
            lines.append(f"  model {self.model_id} sha256 {self.model_sha256[:16]}…")
        if self.validation is not None:
            failed = self.validation.get("failed", [])
            lines.append(f"  validation: {'passed' if self.validation['success'] else f'{len(failed)} check(s) failed'}")
            for check in failed:
                lines.append(f"    failed: {check['expectation']} {check.get('column') or ''} {check.get('observed', '')}")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


def write_report(report: RunReport, path: os.PathLike | str) -> Path:
    """Write ``report`` as JSON to ``path`` atomically (a reader never sees half a report)."""
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=f".{target.name}.", delete=False) as handle:
        json.dump(report.as_dict(), handle, indent=2, sort_keys=False, default=str)
        handle.write("\n")
    os.replace(handle.name, target)
    return target


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of at most 500 characters, for an operator (builtin error types keep their name)."""
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    if isinstance(exc, (ValueError, LookupError, OSError, RuntimeError)) and type(exc).__module__ == "builtins":
        return f"{type(exc).__name__}: {text[:500]}"
    return text[:500]
