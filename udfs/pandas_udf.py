"""An iterator-style pandas UDF over the same scoring loop as the job's ``mapInArrow`` function.

For ``df.select(...)`` / ``withColumn`` in notebooks: ``Iterator[pd.Series] -> Iterator[pd.Series]``
(one output column, e.g. ``embedding``) or ``Iterator[pd.DataFrame]`` (a struct of the task's
output columns, e.g. ``label``, ``score``, ``probs``). Feature tasks take one ``pd.Series`` per
feature column (``Iterator[Tuple[pd.Series, ...]]``). The model loads once per Python worker
(:mod:`lakescore.udfs.models.model_cache`); rows are length-sorted and cut by the token budget inside
each Arrow batch, and returned in input order (:func:`lakescore.udfs.scoring_udf.score_batches`).

Slower than the job's ``mapInArrow`` path by construction: Spark converts every Arrow batch to
pandas and back (a Python object per array cell on the way out, e.g. per embedding), and a
``select`` cannot carry a resource profile. Rows that cannot be scored are null, without the
reason the job's errors table records.
"""

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import DataType, StructType

from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from lakescore.udfs.scoring_udf import score_batches

__all__ = ["make_pandas_udf", "return_type"]


def return_type(task: str, options: Any = None) -> DataType:
    """The UDF's Spark type: the task's one output column's type, else a struct of its output columns (those its
    settings ``options`` ask for included)."""
    fields = get_task(task).staged_fields_for(options)
    return fields[0].dataType if len(fields) == 1 else StructType(fields)


def make_pandas_udf(spec: ModelSpec, *, max_tokens: int | None, max_rows: int):
    """An iterator-style pandas UDF scoring ``spec``'s task; call it on the input column(s).

    ``spec.feature_cols`` names the features of a feature task (one UDF argument each,
    in that order); text and image tasks take one column (strings, encoded image bytes). Raises ``ValueError`` for an
    unknown task.
    """
    task = get_task(spec.task)
    options = task.options_of(spec)
    spark_type = return_type(spec.task, options)
    fields = task.staged_fields_for(options)
    arrow_types = task.output_arrow_types_for(options)
    names = [f"x{i}" for i in range(1 if task.input_kind.one_column else len(spec.feature_cols))]

    def outputs(columns: Iterator[tuple[pd.Series, ...]]):
        batches = (
            pa.RecordBatch.from_arrays([pa.array(c, from_pandas=True) for c in cols], names=names) for cols in columns
        )
        for batch, scored in score_batches(spec, names, batches, arrow_types, max_tokens, max_rows):
            arrays = scored.predictions if scored is not None else [pa.nulls(batch.num_rows, t) for t in arrow_types]
            if len(fields) == 1:
                yield arrays[0].to_pandas()
            else:
                yield pd.DataFrame({f.name: a.to_pandas() for f, a in zip(fields, arrays)})

    one_column = task.input_kind.one_column

    def udf(inputs):
        return outputs(((column,) for column in inputs) if one_column else inputs)

    # PySpark reads the UDF's kind from its type hints: one series or a tuple of them in,
    # a series (one output column) or a frame (a struct of them) out.
    udf.__annotations__ = {
        "inputs": Iterator[pd.Series] if one_column else Iterator[tuple[pd.Series, ...]],
        "return": Iterator[pd.Series] if len(fields) == 1 else Iterator[pd.DataFrame],
    }
    return pandas_udf(udf, spark_type)
