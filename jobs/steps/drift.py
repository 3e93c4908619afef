"""Step 6, validate (drift): this run's predictions against the output's rows at a baseline version.

Computed in Spark on the rows the run would publish and the output read at the baseline version (Delta time
travel), before the publish; the task registry says which output is a label, a numeric score, an embedding or
generated text (:meth:`~lakescore.udfs.registry.Task.output_profile`). Figures, as the task's outputs allow:

* ``label_js``: the Jensen-Shannon distance (base 2, so between 0 and 1) between the two runs' label shares;
* ``score_psi``: the population stability index of the numeric prediction over 10 bins cut at the baseline's deciles;
* ``id_cosine_p5``: the 5th percentile of the cosine between an id's embedding in this run and in the baseline,
  over the ids in both (and with the same ``input_digest`` where both store it: an edited input may move).

Every figure is computed and reported; those with a bound in ``validation.drift`` gate the publish
(:func:`~lakescore.jobs.steps.publish.publish` refuses it as ``drift_exceeded``). An output that does not exist yet (a
first run) skips the comparison with a note; a configured baseline the output does not have was refused before compute
(:func:`~lakescore.jobs.steps.read.check_drift_baseline`). Both sides' profiles (row count, label shares,
deciles of the score, of the embeddings' norms, of the generated texts' lengths) are kept for the report and the
metrics table. At most three Spark jobs: the deciles of both sides, the label and bin counts of both sides, and the
per-id cosines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakescore.jobs.platform.spark.background import in_background
from lakescore.jobs.platform.tables import TableError, read_input
from lakescore.jobs.steps.account import Accounting
from lakescore.jobs.steps.context import RunContext, Targets
from lakescore.jobs.steps.ids import row_key
from lakescore.schemas.output import DIGEST_COLUMN
from lakescore.udfs.registry import OutputProfile, get_task

__all__ = ["DECILES", "EMPTY_BIN_SHARE", "check_drift", "start_drift", "js_distance", "psi", "exceeded"]

DECILES = tuple(round(i / 10, 1) for i in range(1, 10))
EMPTY_BIN_SHARE = 1e-4
"""PSI: the share an empty bin counts as on either side, so that its logarithm is finite (Evidently's choice)."""
COSINE_PERCENTILE = 0.05
_SIDE, _BIN = "_lakescore_side", "_lakescore_bin"
RUN, BASELINE = "run", "baseline"
BOUNDS = {
    "label_js": ("max", "max_label_js"),
    "score_psi": ("max", "max_score_psi"),
    "id_cosine_p5": ("min", "min_id_cosine_p5"),
}
"""Each figure, the side its bound sits on and the ``validation.drift`` option setting it."""


def check_drift(run: RunContext, targets: Targets, accounting: Accounting, rows: DataFrame) -> dict[str, Any] | None:
    """The drift of ``rows`` (the output rows this run would publish, ``accounting.output_rows`` of them) against the
    output at the configured baseline, as the report's ``drift`` dict
    (:attr:`~lakescore.jobs.report.model.RunReport.drift`); ``None`` when the task writes no profiled output."""
    cfg = run.cfg
    outputs = get_task(cfg.task).output_profile(cfg.task_options())
    if not outputs.columns:
        return None
    settings = cfg.validation.drift
    bounds = {
        figure: {side: settings.bounds()[option]}
        for figure, (side, option) in BOUNDS.items()
        if settings.bounds()[option] is not None
    }
    drift = {
        "baseline": settings.baseline,
        "baseline_version": None,
        "bounds": bounds,
        "figures": {},
        "exceeded": [],
        "gated": bool(bounds),
        "note": None,
        "profiles": {RUN: {"rows": 0}},
    }
    if not accounting.output_rows:  # e.g. an incremental run with nothing to score: no job, nothing to compare
        drift["note"] = "nothing compared: this run scored no row"
        return drift
    version, baseline, note = _baseline(run, targets, outputs)
    profiles = _profiles({RUN: rows, **({BASELINE: baseline} if baseline is not None else {})}, outputs)
    drift.update(baseline_version=version, note=note, profiles=profiles)
    if baseline is None:
        return drift
    if not profiles[BASELINE]["rows"]:
        drift["note"] = f"nothing compared: version {version} of the output holds no row"
        return drift
    figures = drift["figures"]
    if outputs.label:
        figures["label_js"] = round(js_distance(profiles[RUN]["label_shares"], profiles[BASELINE]["label_shares"]), 6)
    if outputs.score and profiles[BASELINE].get("score_bins"):  # no bins: the baseline has no score to cut them at
        figures["score_psi"] = round(psi(profiles[RUN]["score_bins"], profiles[BASELINE]["score_bins"]), 6)
    if outputs.embedding:
        cosine, compared = _id_cosine_percentile(rows, baseline, cfg.output_key_cols, outputs.embedding)
        figures["id_cosine_p5"] = None if cosine is None else round(cosine, 6)
        drift["ids_compared"] = compared
    drift["exceeded"] = exceeded(figures, bounds)
    return drift


def start_drift(
    run: RunContext, targets: Targets, accounting: Accounting, rows: DataFrame
) -> Future[dict[str, Any] | None]:
    """:func:`check_drift` in a background thread: its small Spark jobs wait on the scheduler more than they compute,
    so they overlap the GX suite's."""
    return in_background("drift", check_drift, run, targets, accounting, rows)


def exceeded(figures: Mapping[str, float | None], bounds: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The figures past their bound (``{"max": x}`` or ``{"min": x}``); a figure not computed passes."""
    past = []
    for figure, bound in bounds.items():
        value = figures.get(figure)
        if value is not None and ((value > bound["max"]) if "max" in bound else (value < bound["min"])):
            past.append(figure)
    return past


def js_distance(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """The Jensen-Shannon distance, base 2, between two distributions over labels (shares or counts, normalised here;
    a label missing from one side has share 0 there): 0 for equal shares, 1 for disjoint labels."""
    labels = sorted(set(p) | set(q))
    a, b = _normalised([p.get(k, 0.0) for k in labels]), _normalised([q.get(k, 0.0) for k in labels])
    divergence = 0.0
    for x, y in zip(a, b):
        m = (x + y) / 2
        divergence += (x * math.log2(x / m) if x else 0.0) / 2 + (y * math.log2(y / m) if y else 0.0) / 2
    return math.sqrt(max(divergence, 0.0))


def psi(actual: Sequence[float], expected: Sequence[float]) -> float:
    """The population stability index of ``actual`` counts (or shares) per bin against ``expected``'s: the sum over
    bins of ``(a - e) * ln(a / e)``, each side's shares normalised, an empty bin counted as :data:`EMPTY_BIN_SHARE`."""
    a = [max(x, EMPTY_BIN_SHARE) for x in _normalised(actual)]
    e = [max(x, EMPTY_BIN_SHARE) for x in _normalised(expected)]
    return sum((x - y) * math.log(x / y) for x, y in zip(a, e))


def _normalised(values: Sequence[float]) -> list[float]:
    total = float(sum(values))
    return [v / total for v in values] if total else [0.0 for _ in values]


def _baseline(
    run: RunContext, targets: Targets, outputs: OutputProfile
) -> tuple[int | None, DataFrame | None, str | None]:
    """``(version, rows, None)`` of the output at the configured baseline, or ``(version, None, note)`` saying why there
    is none to compare with."""
    cfg, latest = run.cfg, targets.previous_version
    version = cfg.validation.drift.baseline_version
    version = latest if version is None else version
    if latest is None:
        return version, None, "no baseline: the output does not exist yet"
    try:
        baseline = read_input(run.spark, cfg.output, "delta", version=version)
    except TableError as exc:  # e.g. a version whose files were vacuumed
        return version, None, f"no baseline: version {version} of the output cannot be read ({str(exc)[:200]})"
    missing = [c for c in outputs.columns if c not in baseline.columns]
    if missing:
        return version, None, f"no baseline: version {version} of the output has no column {missing[0]!r}"
    return version, baseline, None


def _profiles(sides: Mapping[str, DataFrame], outputs: OutputProfile) -> dict[str, dict[str, Any]]:
    """Each side's row count and the deciles of its numeric outputs (one job), then its label shares and, against the
    baseline's score deciles, its score counts per bin (one more job when there is a label or a baseline score)."""
    numbers = {
        name: expr
        for name, expr in (
            ("score_deciles", F.col(outputs.score).cast("double") if outputs.score else None),
            ("embedding_norm_deciles", _norm(F.col(outputs.embedding)) if outputs.embedding else None),
            ("text_length_deciles", F.length(F.col(outputs.text)).cast("double") if outputs.text else None),
        )
        if expr is not None
    }
    both = _union(
        {
            side: df.select(
                *[expr.alias(name) for name, expr in numbers.items()],
                *([F.col(outputs.label).cast("string").alias("label")] if outputs.label else []),
            )
            for side, df in sides.items()
        }
    )
    found = (
        both.groupBy(_SIDE)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            *[F.percentile_approx(F.col(name), list(DECILES)).alias(name) for name in numbers],
        )
        .collect()
    )
    profiles: dict[str, dict[str, Any]] = {side: {"rows": 0, **dict.fromkeys(numbers)} for side in sides}
    for row in found:
        profiles[row[_SIDE]].update({k: v for k, v in row.asDict().items() if k != _SIDE})
    for profile in profiles.values():
        for name in numbers:
            profile[name] = [float(v) for v in profile[name]] if profile[name] else None
    edges = profiles.get(BASELINE, {}).get("score_deciles")
    keys = (["label"] if outputs.label else []) + ([_BIN] if edges else [])
    if keys:
        if edges:  # bin i holds edges[i-1] < score <= edges[i]; 0 and 9 are open
            score = F.col("score_deciles")
            both = both.withColumn(
                _BIN, F.when(score.isNotNull() & ~F.isnan(score), sum(F.when(score > e, 1).otherwise(0) for e in edges))
            )
        for side in profiles:
            profiles[side].update(
                ({"label_shares": {}} if outputs.label else {})
                | ({"score_bins": [0] * (len(edges) + 1)} if edges else {})
            )
        for row in both.groupBy(_SIDE, *keys).count().collect():
            profile = profiles[row[_SIDE]]
            if outputs.label and row["label"] is not None:
                profile["label_shares"][row["label"]] = profile["label_shares"].get(row["label"], 0) + row["count"]
            if edges and row[_BIN] is not None:
                profile["score_bins"][row[_BIN]] += row["count"]
        for profile in profiles.values():
            if outputs.label:
                total = sum(profile["label_shares"].values())
                profile["label_shares"] = (
                    {k: round(v / total, 6) for k, v in sorted(profile["label_shares"].items())} if total else {}
                )
        if edges:
            profiles[BASELINE]["score_bin_edges"] = edges
    return profiles


def _union(sides: Mapping[str, DataFrame]) -> DataFrame:
    frames = [df.withColumn(_SIDE, F.lit(side)) for side, df in sides.items()]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def _norm(vector):
    return F.sqrt(F.aggregate(vector, F.lit(0.0), lambda total, x: total + x.cast("double") * x.cast("double")))


def _dot(a, b):
    return F.aggregate(
        F.zip_with(a, b, lambda x, y: x.cast("double") * y.cast("double")), F.lit(0.0), lambda total, x: total + x
    )


def _id_cosine_percentile(
    rows: DataFrame, baseline: DataFrame, id_cols: Sequence[str], embedding: str
) -> tuple[float | None, int]:
    """``(5th percentile of the per-id cosine, ids compared)`` over the ids in both sides with vectors of one width
    (and the same ``input_digest`` where both have it), a zero vector on either side left out; ``(None, 0)`` when no
    id is in both."""
    digest = DIGEST_COLUMN in rows.columns and DIGEST_COLUMN in baseline.columns
    ours = rows.select(
        row_key(id_cols).alias("_id"),
        F.col(embedding).alias("_a"),
        *([F.col(DIGEST_COLUMN).alias("_da")] if digest else []),
    )
    theirs = baseline.select(
        row_key(id_cols).alias("_id"),
        F.col(embedding).alias("_b"),
        *([F.col(DIGEST_COLUMN).alias("_db")] if digest else []),
    )
    pairs = ours.join(theirs, "_id").where(F.size("_a") == F.size("_b"))
    if digest:
        pairs = pairs.where(F.col("_da") == F.col("_db"))
    cosine = F.try_divide(_dot(F.col("_a"), F.col("_b")), _norm(F.col("_a")) * _norm(F.col("_b")))
    found = (
        pairs.select(cosine.alias("_cos"))
        .agg(F.percentile_approx("_cos", COSINE_PERCENTILE).alias("p"), F.count("_cos").alias("n"))
        .first()
    )
    return (None if found["p"] is None else float(found["p"])), int(found["n"])
