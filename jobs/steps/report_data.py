"""What the HTML run report shows, computed from small samples of the run's DataFrames.

No full pass over a big table: the input and the predictions are read with ``limit``
(:data:`SAMPLE_ROWS` rows each: the first rows Spark reads, not a random sample), the
dead-lettered rows with ``limit`` from this run's staged errors.
Row counts and error reasons come from the accounting the run already did.

Every summary is chosen from the column's type, never from the task's name, so a new
task's output columns are profiled without a change here:

=================================  ===========================================================
column type                        summary (``kind``)
=================================  ===========================================================
string                             ``categories``: the most frequent values and their counts
integer / floating point           ``numeric``: histogram and min / median / mean / max
array of numbers                   ``vectors``: histogram of L2 norms, 2-D PCA projection
array of structs                   ``items``: items per row, and the values of each string field
string *input*                     ``lengths``: tokens per text (characters without a tokenizer)
binary *input* (encoded images)    ``numeric``: bytes per value (counted in Spark)
=================================  ===========================================================

A projection is coloured by a ``categories`` column of the same sample when one has at
most :data:`MAX_COLOURS` values. The result is plain JSON (lists, numbers, strings), stored
as the report's ``profile`` and drawn by :mod:`lakescore.jobs.report.html`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakescore.jobs.platform.spark.background import in_background
from lakescore.jobs.platform.tables import column

__all__ = [
    "SAMPLE_ROWS",
    "DEAD_LETTER_ROWS",
    "MAX_COLOURS",
    "collect_profile",
    "summarize_column",
    "summarize_input",
    "histogram",
    "projection",
    "dead_letter_sample",
    "start_profile",
    "start_run_profile",
    "finish_profile",
]

log = logging.getLogger(__name__)

SAMPLE_ROWS = 2000
DEAD_LETTER_ROWS = 20
TEXT_LIMIT = 200
"""Characters of each dead-lettered value the report keeps."""
MAX_CATEGORIES = 20
MAX_COLOURS = 12
PROJECTION_POINTS = 1000


def collect_profile(
    *,
    inputs: DataFrame,
    predictions: DataFrame | None,
    errors: Callable[[], DataFrame] | None,
    throughput: Sequence[tuple[float, int]] = (),
    model_dir: Path | None = None,
    sample_rows: int = SAMPLE_ROWS,
) -> dict[str, Any]:
    """The report's ``profile``: summaries of ``inputs`` (the model's input columns; a binary one as its values'
    byte counts) and
    ``predictions`` (the prediction columns; ``None``: the run scored no row), a sample of the
    rows ``errors()`` returns (this run's dead-lettered rows; called last, so it may wait for
    their write; ``None``: no errors), and the ``throughput`` samples (``(seconds, rows)``) as given.

    ``model_dir`` holding a ``tokenizer.json`` makes text lengths tokens, else characters.
    Reads at most ``sample_rows`` rows of each DataFrame.
    """
    # An image column is summarised by its values' sizes, computed in Spark: its bytes never reach the driver
    inputs = inputs.select(
        *[
            F.length(column(f.name)).alias(f.name) if isinstance(f.dataType, T.BinaryType) else column(f.name)
            for f in inputs.schema.fields
        ]
    )
    input_sample = inputs.limit(sample_rows).toArrow()
    tokenizer = _tokenizer(model_dir)
    summaries, sampled = [], 0
    if predictions is not None:
        prediction_sample = predictions.limit(sample_rows).toArrow()
        summaries = [
            summarize_column(f.name, f.dataType, prediction_sample.column(f.name)) for f in predictions.schema.fields
        ]
        summaries = [s for s in summaries if s is not None]
        _colour_projections(summaries, prediction_sample)
        sampled = prediction_sample.num_rows
    return {
        "sample_rows": sampled,
        "inputs": [
            s
            for s in (
                summarize_input(f.name, f.dataType, input_sample.column(f.name), tokenizer)
                for f in inputs.schema.fields
            )
            if s is not None
        ],
        "predictions": summaries,
        "dead_letters": dead_letter_sample(errors()) if errors is not None else None,
        "throughput": [[round(float(t), 2), int(rows)] for t, rows in throughput],
    }


def start_profile(**arguments) -> Future[dict[str, Any]]:
    """:func:`collect_profile` with ``arguments``, in a background thread (the run validates meanwhile)."""
    return in_background("report", collect_profile, **arguments)


def start_run_profile(run, plan, accounting, throughput: Sequence[tuple[float, int]]) -> Future[dict[str, Any]]:
    """:func:`start_profile` for a run that reached validation: its input columns, the predictions it would
    publish (none when it scored no row: no empty charts) and its dead-lettered rows (read from staging, before
    the publish drops it)."""
    from lakescore.jobs.steps.publish import errors_rows

    return start_profile(
        inputs=run.source.select(*[column(c) for c in run.input_cols]),
        predictions=accounting.published.select(*[F.col(f.name) for f in run.cfg.output_fields()])
        if accounting.output_rows
        else None,
        errors=(lambda: errors_rows(run, plan, accounting)) if accounting.error_rows else None,
        throughput=throughput,
        model_dir=run.model_dir,
    )


def finish_profile(future: Future[dict[str, Any]]) -> dict[str, Any] | None:
    """The profile :func:`start_profile` computed, or ``None`` (and a warning) if that failed: the
    HTML report then lacks its charts, the run goes on."""
    try:
        return future.result()
    except Exception:  # a report detail must never fail a run
        log.warning("could not sample the run for the HTML report", exc_info=True)
        return None


def summarize_column(name: str, dtype: T.DataType, values: pa.ChunkedArray) -> dict[str, Any] | None:
    """One prediction column's summary by its type (module table), or ``None`` for a type it does not draw."""
    if isinstance(dtype, T.StringType):
        return {"column": name, "kind": "categories", **_counts(values.to_pylist())}
    if isinstance(dtype, T.NumericType):
        return {"column": name, "kind": "numeric", **_numbers(values)}
    if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.NumericType):
        rows = [np.asarray(v, dtype=np.float64) for v in values.to_pylist() if v is not None]
        return {"column": name, "kind": "vectors", **_vectors(rows)}
    if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, T.StructType):
        return {"column": name, "kind": "items", **_items(dtype.elementType, values.to_pylist())}
    return None


def summarize_input(name: str, dtype: T.DataType, values: pa.ChunkedArray, tokenizer=None) -> dict[str, Any] | None:
    """One input column's summary: text lengths (tokens with ``tokenizer``) or a numeric histogram."""
    if isinstance(dtype, T.StringType):
        texts = [v for v in values.to_pylist() if v is not None]
        if tokenizer is not None:
            lengths, unit = [len(e.ids) for e in tokenizer.encode_batch(texts)], "tokens"
        else:
            lengths, unit = [len(t) for t in texts], "characters"
        return {
            "column": name,
            "kind": "lengths",
            "unit": unit,
            **_numbers(pa.chunked_array([pa.array(lengths, pa.int64())])),
        }
    if isinstance(dtype, T.NumericType):
        return {"column": name, "kind": "numeric", **_numbers(values)}
    return None


def histogram(values: np.ndarray, bins: int = 30) -> dict[str, list]:
    """``{"edges": [...], "counts": [...]}`` of the finite ``values`` (``bins`` equal bins; integers: at most one per
    value)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"edges": [], "counts": []}
    low, high = float(finite.min()), float(finite.max())
    if np.issubdtype(values.dtype, np.integer):
        bins = max(1, min(bins, int(high - low) + 1))
    counts, edges = np.histogram(finite, bins=bins, range=(low, high) if high > low else (low - 0.5, high + 0.5))
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def projection(rows: Sequence[np.ndarray], points: int = PROJECTION_POINTS) -> dict[str, Any] | None:
    """The first ``points`` vectors projected on their two principal components (numpy SVD),
    with each component's share of the variance; ``None`` for fewer than 3 vectors or dimensions."""
    same = [r for r in rows[:points] if r.shape == rows[0].shape] if rows else []
    if len(same) < 3 or same[0].size < 3:
        return None
    matrix = np.stack(same)
    centred = matrix - matrix.mean(axis=0)
    _, singular, components = np.linalg.svd(centred, full_matrices=False)
    xy = centred @ components[:2].T
    total = float((singular**2).sum()) or 1.0
    return {
        "points": [[round(float(x), 4), round(float(y), 4)] for x, y in xy],
        "explained": [round(float(s**2) / total, 4) for s in singular[:2]],
    }


def dead_letter_sample(errors: DataFrame, rows: int = DEAD_LETTER_ROWS) -> dict[str, Any]:
    """Up to ``rows`` dead-lettered rows, every value as text cut at :data:`TEXT_LIMIT` characters."""
    table = (
        errors.select(
            [
                F.col(c).cast("string").alias(c) if not isinstance(t, T.StringType) else column(c)
                for c, t in ((f.name, f.dataType) for f in errors.schema.fields)
            ]
        )
        .limit(rows)
        .toArrow()
    )
    return {
        "columns": table.column_names,
        "rows": [[_cut(v) for v in row.values()] for row in table.to_pylist()],
        "text_limit": TEXT_LIMIT,
    }


def _cut(value: str | None) -> str | None:
    if value is None or len(value) <= TEXT_LIMIT:
        return value
    return value[:TEXT_LIMIT] + f"… ({len(value)} characters)"


def _counts(values: list) -> dict[str, Any]:
    present = [v for v in values if v is not None]
    unique, counts = (
        np.unique(np.asarray(present, dtype=object).astype(str), return_counts=True) if present else ([], [])
    )
    order = sorted(zip(unique, counts), key=lambda pair: (-pair[1], pair[0]))
    top = [[str(v), int(c)] for v, c in order[:MAX_CATEGORIES]]
    return {
        "counts": top,
        "other": int(sum(c for _, c in order[MAX_CATEGORIES:])),
        "distinct": len(order),
        "nulls": len(values) - len(present),
    }


def _numbers(values: pa.ChunkedArray) -> dict[str, Any]:
    array = values.to_numpy(zero_copy_only=False)
    array = array[~_isnull(array)]
    array = array.astype(np.int64) if np.issubdtype(array.dtype, np.integer) else array.astype(np.float64)
    finite = array[np.isfinite(array)] if array.dtype.kind == "f" else array
    stats = (
        {}
        if finite.size == 0
        else {
            "min": float(finite.min()),
            "median": float(np.median(finite)),
            "mean": float(finite.mean()),
            "max": float(finite.max()),
        }
    )
    return {
        "histogram": histogram(array),
        "stats": stats,
        "count": int(array.size),
        "nulls": int(len(values) - array.size),
    }


def _isnull(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        return np.array([v is None for v in array], dtype=bool)
    return np.zeros(array.shape, dtype=bool)


def _vectors(rows: list[np.ndarray]) -> dict[str, Any]:
    norms = np.array([np.linalg.norm(r) for r in rows], dtype=np.float64)
    widths = sorted({r.size for r in rows})
    return {
        "width": widths[0] if len(widths) == 1 else widths,
        "norm_histogram": histogram(norms),
        "norm_stats": {"min": float(norms.min()), "max": float(norms.max())} if norms.size else {},
        "projection": projection(rows),
    }


def _items(element: T.StructType, rows: list) -> dict[str, Any]:
    per_row = np.array([len(r) for r in rows if r is not None], dtype=np.int64)
    fields = []
    for field in element.fields:
        if isinstance(field.dataType, T.StringType):
            values = [item.get(field.name) for r in rows if r for item in r]
            fields.append({"field": field.name, **_counts(values)})
    return {"items_histogram": histogram(per_row), "items": int(per_row.sum()), "fields": fields}


def _colour_projections(summaries: list[dict[str, Any]], sample: pa.Table) -> None:
    """Colour each projection by the first ``categories`` column with at most :data:`MAX_COLOURS` values."""
    palette = next((s for s in summaries if s["kind"] == "categories" and 0 < s["distinct"] <= MAX_COLOURS), None)
    if palette is None:
        return
    labels = sample.column(palette["column"]).to_pylist()
    for summary in summaries:
        if summary["kind"] == "vectors" and summary["projection"] is not None:
            points = len(summary["projection"]["points"])
            summary["projection"]["colour_by"] = palette["column"]
            summary["projection"]["colours"] = [None if v is None else str(v) for v in labels[:points]]


def _tokenizer(model_dir: Path | None):
    """The model's fast tokenizer from ``tokenizer.json`` (the ``tokenizers`` library: no torch), or ``None``."""
    path = Path(model_dir) / "tokenizer.json" if model_dir else None
    if path is None or not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.no_truncation()  # the input's own lengths, not the model's cut
        tokenizer.no_padding()
        return tokenizer
    except Exception:  # a report detail must never fail a run
        log.debug("could not load %s; text lengths are in characters", path, exc_info=True)
        return None
