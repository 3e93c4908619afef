"""Step 5, account: every input row is in exactly one of the output and the errors table.

The staged rows are counted by reason in one aggregation; with the id check's counts
that gives the output and error rows, the reasons and the error rate. A staging table
holding more or fewer rows than the run's scorable rows means another run of the same
input is writing it: nothing is published.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakescore.jobs.steps.prepare import Plan
from lakescore.schemas.output import ERROR_COLUMNS

__all__ = ["Accounting", "account_rows"]


@dataclass(frozen=True)
class Accounting:
    """Where this run's input rows went. ``input_rows == output_rows + error_rows`` always."""

    staged: DataFrame
    """Every staged row (scored or not), with the scoring function's columns."""
    input_rows: int
    output_rows: int
    error_rows: int
    reasons: dict[str, int]
    """Reason code -> rows, for every row in the errors table."""

    @property
    def error_rate(self) -> float:
        return self.error_rows / self.input_rows

    @property
    def published(self) -> DataFrame:
        """The staged rows that were scored (what the output receives, before identity columns)."""
        return self.staged.where(F.col(ERROR_COLUMNS[0]).isNull())


def account_rows(plan: Plan) -> Accounting:
    """Count the staged rows by reason and check them against the plan.

    Raises ``RuntimeError`` when staging does not hold exactly the plan's scorable rows,
    or when the rows do not add up (input = output + errors).
    """
    ids = plan.split.ids
    staged = plan.staging.rows()
    by_reason = {r[0]: int(r[1]) for r in staged.groupBy(ERROR_COLUMNS[0]).count().collect()}
    staged_rows = sum(by_reason.values())
    if staged_rows != plan.scorable_rows:
        raise RuntimeError(
            f"staging {plan.staging.location} holds {staged_rows} rows for {plan.scorable_rows} scorable input rows; "
            "another run of the same input is probably writing it at the same time. Nothing was published; rerun."
        )
    reasons = {k: v for k, v in by_reason.items() if k is not None}
    unscored = sum(reasons.values())
    if ids.null_id_rows:
        reasons["null_id"] = ids.null_id_rows
    if ids.refused_rows - ids.null_id_rows:
        reasons["duplicate_id"] = ids.refused_rows - ids.null_id_rows
    accounting = Accounting(
        staged=staged,
        input_rows=ids.rows,
        output_rows=staged_rows - unscored,
        error_rows=ids.refused_rows + unscored,
        reasons=dict(sorted(reasons.items())),
    )
    if accounting.input_rows != accounting.output_rows + accounting.error_rows:
        raise RuntimeError(
            f"row accounting broken: {accounting.input_rows} in, {accounting.output_rows} out, {accounting.error_rows} errors"
        )
    return accounting
