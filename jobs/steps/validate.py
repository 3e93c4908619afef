"""Step 6, validate: the Great Expectations suite on the rows this run would publish.

Skipped (``None``) when validation is off, or when the error rate already fails the run.
GX reports a failed check as ``success: false``; the publish step gates on it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from lakescore.jobs.steps.account import Accounting
from lakescore.jobs.steps.context import Plan, RunContext, Targets
from lakescore.schemas.expectations import OutputFacts, UserExpectations, validate_output
from lakescore.udfs.registry import get_task

__all__ = ["validate_rows"]


def validate_rows(
    run: RunContext, targets: Targets, plan: Plan, accounting: Accounting, rows: DataFrame
) -> dict[str, Any] | None:
    """Run the suite on ``rows`` (the output rows with identity columns); its outcome as a dict, or ``None`` if
    skipped."""
    cfg = run.cfg
    if not cfg.validation.enabled or accounting.error_rate > cfg.max_error_rate:
        return None
    task = get_task(cfg.task)
    shares = {
        column: (value, getattr(cfg.validation, option))
        for option, (column, value) in task.validation_options.items()
        if getattr(cfg.validation, option) is not None
    }
    facts = OutputFacts(
        schema=targets.output_schema,
        expected_rows=accounting.published_rows,
        prediction_columns=tuple(f.name for f in cfg.output_fields() if f.name not in task.optional_outputs),
        model_sha256=plan.identity.sha256,
        run_id=plan.run_id,
        user=UserExpectations(
            min_rows=cfg.validation.min_rows,
            value_ranges=dict(cfg.validation.value_ranges),
            max_null_fraction=dict(cfg.validation.max_null_fraction),
            max_value_share=shares,
        ),
        value_sets=dict(task.output_value_sets),
    )
    return validate_output(rows, facts).as_dict()
