"""The Great Expectations suite that proves a written output before anyone reads it.

The suite is built per run from the declared output schema (:mod:`lakescore.schemas.output`),
the run's facts (rows to publish, the weights digest the driver resolved, the run
id) and the checks users add in config, and runs on the staged output before it
is published.

GX reports a failing or erroring expectation as ``success=False`` (it does not
raise), so :func:`validate_output` returns a :class:`ValidationOutcome` that the
job gates on. A schema comparison by column names and full types (including
array element types, which GX's type expectation cannot see) is one more check.

Cost: the suite first runs with ``BOOLEAN_ONLY`` results, which needs far fewer
Spark jobs than ``SUMMARY`` (which also collects sample unexpected rows). Only
when that pass fails does it run again with ``SUMMARY``, so failures still come
with counts and examples.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructField, StructType

from lakescore.schemas.column_names import original_name, renamed_columns, resolvable_name
from lakescore.schemas.output import IDENTITY_COLUMNS, column_types

__all__ = ["OutputFacts", "UserExpectations", "ValidationOutcome", "validate_output", "build_expectations"]

NULLABLE_IDENTITY = ("model_revision",)
"""Identity columns that may be null (a local model directory has no revision)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UserExpectations:
    """Checks users add in config (``validation:``) on top of the built-in suite."""

    min_rows: int | None = None
    value_ranges: dict[str, tuple[float, ...]] = field(default_factory=dict)
    max_null_fraction: dict[str, float] = field(default_factory=dict)
    max_value_share: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Column -> ``(value, fraction)``: at most this fraction of rows may hold the value (``finish_reason``
    ``length``)."""


@dataclass(frozen=True)
class OutputFacts:
    """What the output must agree with."""

    schema: StructType
    expected_rows: int
    prediction_columns: tuple[str, ...]
    """The prediction columns every published row must have a value in."""
    model_sha256: str
    run_id: str
    user: UserExpectations = field(default_factory=UserExpectations)
    value_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Output column -> the values it may hold (the task's, e.g. ``finish_reason``)."""


@dataclass
class ValidationOutcome:
    """Result of the suite: ``success`` and one entry per check (``failed`` lists the failures)."""

    success: bool
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if not c["success"]]

    def as_dict(self) -> dict[str, Any]:
        return {"success": self.success, "failed": self.failed, "checks": self.checks}


def build_expectations(facts: OutputFacts) -> list:
    """The GX 1.x expectations for ``facts``: row count, ordered columns, types, non-null, identity."""
    import great_expectations.expectations as gxe

    expectations: list = [
        gxe.ExpectTableRowCountToEqual(value=facts.expected_rows),
        gxe.ExpectTableColumnsToMatchOrderedList(column_list=[f.name for f in facts.schema.fields]),
    ]
    for f in facts.schema.fields:
        expectations.append(gxe.ExpectColumnValuesToBeOfType(column=f.name, type_=type(f.dataType).__name__))
    for name in (*facts.prediction_columns, *IDENTITY_COLUMNS):
        if name not in NULLABLE_IDENTITY:
            expectations.append(gxe.ExpectColumnValuesToNotBeNull(column=name))
    expectations.append(gxe.ExpectColumnValuesToBeInSet(column="model_sha256", value_set=[facts.model_sha256]))
    expectations.append(gxe.ExpectColumnValuesToBeInSet(column="run_id", value_set=[facts.run_id]))
    for name, values in facts.value_sets.items():
        expectations.append(gxe.ExpectColumnValuesToBeInSet(column=name, value_set=list(values)))
    user = facts.user
    if user.min_rows is not None:
        expectations.append(gxe.ExpectTableRowCountToBeBetween(min_value=user.min_rows))
    for name, (low, high) in user.value_ranges.items():
        expectations.append(gxe.ExpectColumnValuesToBeBetween(column=name, min_value=low, max_value=high))
    for name, fraction in user.max_null_fraction.items():
        expectations.append(gxe.ExpectColumnValuesToNotBeNull(column=name, mostly=1.0 - fraction))
    for name, (value, fraction) in user.max_value_share.items():
        expectations.append(gxe.ExpectColumnValuesToNotBeInSet(column=name, value_set=[value], mostly=1.0 - fraction))
    return expectations


def validate_output(df: DataFrame, facts: OutputFacts, suite_name: str = "lakescore_output") -> ValidationOutcome:
    """Run the suite on ``df`` (the written table) and return the outcome. Never raises for a failed check.

    Checks name the columns as ``df`` does. GX's Spark engine resolves a column by its bare name (a dot reads as a
    struct field), so the suite runs on ``df`` with :func:`~lakescore.schemas.column_names.resolvable_name` names."""
    resolvable_df, resolvable_facts = _resolvable(df, facts)
    result = _run_suite(resolvable_df, resolvable_facts, suite_name, "BOOLEAN_ONLY")
    if not result.success:
        result = _run_suite(resolvable_df, resolvable_facts, suite_name, "SUMMARY")

    checks = [_describe(r) for r in result.results]
    schema_ok = column_types(df.schema) == column_types(facts.schema)
    checks.append(
        {
            "expectation": "output_schema_matches_declared",
            "column": None,
            "success": schema_ok,
            "observed": None if schema_ok else df.schema.simpleString(),
            "expected": facts.schema.simpleString(),
        }
    )
    outcome = ValidationOutcome(success=bool(result.success) and schema_ok, checks=checks)
    for check in outcome.failed:
        log.warning("validation failed: %s", check)
    return outcome


def _resolvable(df: DataFrame, facts: OutputFacts) -> tuple[DataFrame, OutputFacts]:
    """``df`` and ``facts`` with every column named by its :func:`resolvable_name` (most names are already)."""
    user = dataclasses.replace(
        facts.user,
        value_ranges={resolvable_name(k): v for k, v in facts.user.value_ranges.items()},
        max_null_fraction={resolvable_name(k): v for k, v in facts.user.max_null_fraction.items()},
    )
    schema = StructType(
        [StructField(resolvable_name(f.name), f.dataType, f.nullable, f.metadata) for f in facts.schema.fields]
    )
    return renamed_columns(df, resolvable_name), dataclasses.replace(facts, schema=schema, user=user)


def _run_suite(df: DataFrame, facts: OutputFacts, suite_name: str, result_format: str):
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    # persist=False: GX would otherwise cache the whole output and leave it cached.
    batch_definition = (
        context.data_sources.add_spark(name="lakescore", persist=False)
        .add_dataframe_asset(name="output")
        .add_batch_definition_whole_dataframe(name="whole_output")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=suite_name, expectations=build_expectations(facts)))
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name=f"{suite_name}_validation", data=batch_definition, suite=suite)
    )
    return definition.run(batch_parameters={"dataframe": df}, result_format=result_format)


def _describe(result) -> dict[str, Any]:
    config = result.expectation_config
    kwargs = dict(config.kwargs)
    check: dict[str, Any] = {
        "expectation": config.type,
        "column": original_name(kwargs["column"]) if kwargs.get("column") else None,  # as the output names it
        "success": bool(result.success),
    }
    observed = (result.result or {}).get("observed_value")
    if observed is not None:
        check["observed"] = observed
    unexpected = (result.result or {}).get("unexpected_count")
    if unexpected:
        check["unexpected_count"] = unexpected
    error = _exception_message(result.exception_info or {})
    if error:
        check["error"] = error
    return check


def _exception_message(info: dict) -> str | None:
    """GX puts one exception record per result, or one per metric keyed by metric id."""
    if info.get("raised_exception"):
        return info.get("exception_message")
    nested = [v for v in info.values() if isinstance(v, dict) and v.get("raised_exception")]
    return "; ".join(str(v.get("exception_message")) for v in nested) or None
