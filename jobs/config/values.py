"""The config's value types: what YAML, ``--set``, flags and the Python API may hand each kind of job setting, and the
choices they are checked against (the executors' sections take theirs from :mod:`lakescore.udfs.options.base`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator

from lakescore.udfs.options.base import Fraction, Number, Text, as_text, checked, invalid
from lakescore.udfs.registry import TASK_NAMES

TASKS = TASK_NAMES
"""Scoring tasks this version can run (:mod:`lakescore.udfs.registry`)."""
WRITE_MODES = ("overwrite", "replace_run", "incremental")
RUN_ID_MAX = 128
RUN_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_ID_MAX - 1}}}")
"""What a run id may be: safe as a partition directory name, in a SQL string literal and on one log line."""
INPUT_FORMATS = ("auto", "delta", "parquet", "images", "audio")
FOLDER_FORMATS = {"images": "image_col", "audio": "audio_col"}
"""The ``input_format`` values that read a folder of files, each with the column setting of the input kind it is
for."""
FILE_COLUMNS = {"id_col": "path", "image_col": "content"}
"""``input_format`` ``images``: the columns of Spark's ``binaryFile`` source the id and the image default to (each
file's path and its bytes); ``audio``: the same, ``audio_col`` for ``image_col``."""
DEDUP_MODES = ("auto", "on", "off")
LOG_LEVELS = ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF", "TRACE")


def comma_items(value: Any) -> Any:
    if isinstance(value, str):  # --feature-cols a,b,c
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return tuple(value) if isinstance(value, list) else value


def _id_columns(value: Any) -> Any:
    """One id column stays a string; several (a YAML list, ``--id-col user_id,item_id``, the API's list) a tuple. A
    comma cannot be in a column name Delta stores, so splitting on it is unambiguous."""
    if isinstance(value, str) and "," in value:
        value = comma_items(value)
    if isinstance(value, list):
        value = tuple(as_text(v) for v in value)
    return value[0] if isinstance(value, tuple) and len(value) == 1 else value


def _id_columns_problem(value: Any) -> str | None:
    if isinstance(value, tuple):
        if not value:
            return "must name at least one column"
        repeated = sorted({c for c in value if value.count(c) > 1})
        if repeated:
            return f"names {repeated[0]!r} twice"
    return None


def _string_keys(value: Any) -> Any:
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else value


def _spark_conf_value(value: Any) -> Any:
    """Spark confs are strings on the JVM side; YAML may have parsed ``8`` or ``true``."""
    if isinstance(value, (Mapping, list)) or value is None:
        raise invalid(f"must be a single value (Spark conf keys are written whole), got {value!r}")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _min_max(bounds: tuple[float, ...]) -> tuple[float, ...]:
    if len(bounds) != 2 or bounds[0] > bounds[1]:
        raise invalid(f"must be [min, max] with min <= max, got {list(bounds)}")
    return bounds


Names = Annotated[tuple[Text, ...], BeforeValidator(comma_items)]
TaskName = Literal[TASK_NAMES]
OnOff = Annotated[Literal[DEDUP_MODES], BeforeValidator(lambda v: ("on" if v else "off") if isinstance(v, bool) else v)]
"""``on`` / ``off``, which YAML 1.1 reads as booleans."""
LogLevel = Annotated[Literal[LOG_LEVELS], BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)]
SparkConf = Annotated[dict[str, Annotated[str, BeforeValidator(_spark_conf_value)]], BeforeValidator(_string_keys)]
ValueRanges = Annotated[
    dict[str, Annotated[tuple[Number, ...], BeforeValidator(comma_items), AfterValidator(_min_max)]],
    BeforeValidator(_string_keys),
]
NullFractions = Annotated[dict[str, Fraction], BeforeValidator(_string_keys)]


IdColumns = Annotated[Text | tuple[Text, ...], BeforeValidator(_id_columns), checked(_id_columns_problem)]
"""An id: one column's name, or a list of names that together identify a row (composite id)."""


def shown(value: str, limit: int = 60) -> str:
    """``value`` for a one-line message: repr (control characters escaped), cut at ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} characters)"
