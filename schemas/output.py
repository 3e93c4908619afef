"""Output schemas per task: what the scoring function returns, what lands in Delta, what is dead-lettered."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from lakescore.schemas.contracts import InputContractError
from lakescore.schemas.id_columns import CHUNK_INDEX
from lakescore.schemas.reasons import DUPLICATE_ID, ENDPOINT_ERROR, ENDPOINT_UNFINISHED, NULL_ID
from lakescore.schemas.traffic import Traffic

__all__ = [
    "PREDICTIONS",
    "ASKED_PREDICTIONS",
    "IDENTITY_COLUMNS",
    "INCREMENTAL_COLUMNS",
    "DIGEST_COLUMN",
    "FILE_COLUMNS",
    "RANK_COLUMN",
    "KEY_DIGEST_COLUMN",
    "CHUNK_COLUMNS",
    "CHUNKS_COLUMN",
    "staged_prediction_fields",
    "ERROR_COLUMNS",
    "ID_REASONS",
    "SERVER_REASONS",
    "carries",
    "CARRY_COLUMNS",
    "WORKER_COLUMN",
    "WORKER_METRICS",
    "prediction_fields",
    "prediction_columns",
    "scored_schema",
    "output_schema",
    "errors_schema",
    "column_types",
]

_EMBEDDING = [StructField("embedding", ArrayType(FloatType(), containsNull=False), nullable=True)]
_LABELS = [
    StructField("label", StringType(), nullable=True),
    StructField("score", DoubleType(), nullable=True),
    StructField("probs", ArrayType(DoubleType(), containsNull=False), nullable=True),
]

PREDICTIONS: dict[str, list[StructField]] = {
    "embed": _EMBEDDING,
    "classify": _LABELS,
    "ner": [
        StructField(
            "entities",
            ArrayType(
                StructType(
                    [
                        StructField("entity_group", StringType(), nullable=True),
                        StructField("score", DoubleType(), nullable=True),
                        StructField("word", StringType(), nullable=True),
                        StructField("start", IntegerType(), nullable=True),
                        StructField("end", IntegerType(), nullable=True),
                    ]
                ),
                containsNull=False,
            ),
            nullable=True,
        )
    ],
    "image_classify": _LABELS,
    "image_embed": _EMBEDDING,
    "tabular": [
        StructField("prediction", DoubleType(), nullable=True),
        StructField("scores", ArrayType(DoubleType(), containsNull=False), nullable=True),
    ],
    "generate": [
        StructField("generated_text", StringType(), nullable=True),
        StructField("finish_reason", StringType(), nullable=True),
        StructField("prompt_tokens", IntegerType(), nullable=True),
        StructField("completion_tokens", IntegerType(), nullable=True),
        StructField("choice_logprobs", ArrayType(DoubleType(), containsNull=False), nullable=True),
    ],
    "transcribe": [
        StructField("text", StringType(), nullable=True),
        StructField("duration_s", DoubleType(), nullable=True),
        StructField("sample_rate", IntegerType(), nullable=True),
    ],
}
"""The model's output columns per task, in output order: what a head's ``columns`` returns, one array each."""

ASKED_PREDICTIONS: dict[str, list[StructField]] = {
    "generate": [
        StructField("token_logprobs", ArrayType(FloatType(), containsNull=False), nullable=True),
    ],
    "transcribe": [
        StructField(
            "segments",
            ArrayType(
                StructType(
                    [
                        StructField("start", DoubleType(), nullable=True),
                        StructField("end", DoubleType(), nullable=True),
                        StructField("text", StringType(), nullable=True),
                    ]
                ),
                containsNull=False,
            ),
            nullable=True,
        ),
    ],
}
"""Output columns a task writes only when one of its settings asks for them (the task registry's
``Task.setting_outputs`` names the setting), after its :data:`PREDICTIONS`, in this order; a run that does not ask
has no such column at all."""

CHUNK_COLUMNS = [
    StructField(CHUNK_INDEX, IntegerType(), nullable=False),
    StructField("chunk_start", IntegerType(), nullable=True),
    StructField("chunk_end", IntegerType(), nullable=True),
]
"""What a chunked run (``embed.chunk``) writes after the id column(s), before the predictions: the chunk's place in its
document (0, 1, ...; -1 for the document's own vector) and its character offsets in the input text, so that
``text[chunk_start:chunk_end]`` is the chunk. The output's rows are identified by the ids and ``chunk_index``."""

CHUNKS_COLUMN = "chunks"
"""The staged column of a chunked run: one row per document, its chunks as a list of :data:`CHUNK_COLUMNS` and
predictions; the publish writes one row per element."""

IDENTITY_COLUMNS = ("model_id", "model_revision", "model_sha256", "run_id")
"""Columns every output row carries so anyone can tell which model and run produced it."""

DIGEST_COLUMN = "input_digest"
"""Incremental mode: SHA-256 (hex) of exactly what the model saw for the row
(:mod:`lakescore.jobs.steps.incremental`)."""

INCREMENTAL_COLUMNS = (DIGEST_COLUMN, "spec_digest")
"""What an incremental output adds after :data:`IDENTITY_COLUMNS`: the input's digest and the digest of the scoring
spec (the settings that change the numbers, the model's files besides its weights, :data:`OUTPUT_VERSION`), so the
next run knows which rows are current."""

FILE_COLUMNS = {"input_path": StringType(), "input_length": LongType(), "input_modified": LongType()}
"""What an incremental output of an image column of paths adds after :data:`INCREMENTAL_COLUMNS`: the path the row's
file was read from, its length in bytes and its modification time (milliseconds since the epoch) when it was, so
that the next run takes the stored digest of a file whose path, length and time are unchanged without reading it."""

RANK_COLUMN = "rank"
"""``rank`` (top-K per key): the row's place in its key, 1 = best."""

KEY_DIGEST_COLUMN = "key_digest"
"""Incremental mode with ``rank``: SHA-256 of the rank settings and every scored row of the key (its ids and input
digests), the same on each of the key's output rows, so the next run re-ranks only keys whose rows changed."""

OUTPUT_VERSION = 1
"""The version of what lakescore's heads compute and write. Bump it when a head's values change for the same model
files and settings: it is part of every incremental row's ``spec_digest``, so such outputs are scored again once."""

ERROR_COLUMNS = ("_reason", "_error", "_input")
"""What the scoring function adds for rows it could not score: reason code, error text, raw input."""

ID_REASONS = frozenset({NULL_ID, DUPLICATE_ID})
"""Reasons of rows refused for their id before scoring: found again from the input on every run, never carried."""
SERVER_REASONS = frozenset({ENDPOINT_ERROR, ENDPOINT_UNFINISHED})
"""Reasons that may be the server's fault rather than the row's (a 5xx, a timeout, a refused connection, a rate limit
outlasting its retries, an answer the server aborted): an incremental run scores such a row again. Any other reason
is the row's own (a null or undecodable input, one too long, a forward pass that raised on the row alone): it fails
again on the same input, weights and spec, so an incremental run carries its dead letter instead (:func:`carries`)."""


def carries(reason: str) -> bool:
    """Whether an incremental run keeps a row dead-lettered with ``reason`` last run as it is, without scoring it
    again, while its input, weights and scoring spec are unchanged (``write.retry_failed`` scores it all the same).
    The one place that decides which failures are the row's own: every reason but :data:`ID_REASONS` and
    :data:`SERVER_REASONS`."""
    return reason not in ID_REASONS and reason not in SERVER_REASONS


CARRY_COLUMNS = (
    ("input_digest", StringType()),
    ("model_sha256", StringType()),
    ("spec_digest", StringType()),
    ("first_run_id", StringType()),
    ("carried", BooleanType()),
)
"""The errors table's columns in ``write.mode: incremental``, after ``run_id``: the row's input digest, the weights
and scoring spec it failed under (what the next run compares to carry it), the run that first dead-lettered it, and
whether this run carried it from an earlier one instead of scoring it."""

WORKER_COLUMN = "_worker"
"""The scoring function's per-batch worker metrics: set on each Arrow batch's first row, null on the others; or, asked
for tally rows, on a row of their own after each batch (:func:`lakescore.udfs.scoring_udf.make_scoring_function`)."""

WORKER_METRICS = StructType(
    [
        StructField("model_loads", LongType(), nullable=False),
        StructField("arrow_batches", LongType(), nullable=False),
        StructField("batch_rows", LongType(), nullable=False),
        StructField("model_seconds", DoubleType(), nullable=False),
        StructField("budget_halvings", LongType(), nullable=False),
        *(StructField(name, LongType(), nullable=False) for name in Traffic.names()),
    ]
)
"""What :data:`WORKER_COLUMN` holds: the run report's ``workers`` figures, summed over the staged rows (``batch_rows``:
the rows the batch scored, with dedup its distinct inputs; ``tokens_in`` /
``tokens_out``: prompt and generated tokens of generation heads (an embedding server's: its ``usage``'s prompt
tokens), 0 for the others, ``tokens_in_cached`` those prompt tokens a server read from its prompt cache,
``tokens_in_cache_write`` those it wrote to it (the counters of :class:`~lakescore.schemas.traffic.Traffic`);
``requests``, ``retries`` and ``rate_limited``: what a head over an endpoint sent, retried and was answered 429, 0 for
the others; ``unmetered``: its answers published without ``usage``, whose tokens are unknown). They travel
in the data, not in accumulators, so a Spark Connect session reports them too, and a retried task counts once."""


def prediction_fields(task: str, asked: Sequence[str] = ()) -> list[StructField]:
    """The prediction fields of ``task``, with the :data:`ASKED_PREDICTIONS` named in ``asked``; ``KeyError`` for an
    unknown task, ``ValueError`` for a column ``task`` cannot add."""
    extra = {f.name: f for f in ASKED_PREDICTIONS.get(task, ())}
    unknown = [name for name in asked if name not in extra]
    if unknown:
        raise ValueError(
            f"task {task!r} has no optional output column {unknown[0]!r}; it has {sorted(extra) or 'none'}"
        )
    return PREDICTIONS[task] + [f for name, f in extra.items() if name in asked]


def staged_prediction_fields(task: str, asked: Sequence[str] = (), chunked: bool = False) -> list[StructField]:
    """The prediction fields as the scoring function stages them: :func:`prediction_fields`, or for a ``chunked`` run
    the one :data:`CHUNKS_COLUMN` holding each chunk's :data:`CHUNK_COLUMNS` and predictions."""
    fields = prediction_fields(task, asked)
    if not chunked:
        return fields
    return [
        StructField(CHUNKS_COLUMN, ArrayType(StructType(CHUNK_COLUMNS + fields), containsNull=False), nullable=True)
    ]


def prediction_columns(task: str, asked: Sequence[str] = ()) -> list[str]:
    """Names of the columns holding the model's output for ``task`` (with the ``asked`` optional ones)."""
    return [f.name for f in prediction_fields(task, asked)]


def scored_schema(task: str, *kept: StructField, asked: Sequence[str] = (), chunked: bool = False) -> StructType:
    """What the scoring function returns: the ``kept`` input columns (the job: the id), predictions (with the
    ``asked`` optional ones; ``chunked``: :func:`staged_prediction_fields`), ``model_sha256``, :data:`ERROR_COLUMNS`,
    then :data:`WORKER_COLUMN`."""
    return StructType(
        [StructField(f.name, f.dataType, nullable=True) for f in kept]
        + staged_prediction_fields(task, asked, chunked)
        + [StructField("model_sha256", StringType(), nullable=False)]
        + [StructField(name, StringType(), nullable=True) for name in ERROR_COLUMNS]
        + [StructField(WORKER_COLUMN, WORKER_METRICS, nullable=True)]
    )


def output_schema(
    task: str,
    *row_fields: StructField,
    incremental: bool = False,
    ranked: bool = False,
    file_status: bool = False,
    asked: Sequence[str] = (),
    chunked: bool = False,
) -> StructType:
    """The Delta table's schema: the ``row_fields`` (the id column(s), then a ranked run's other key columns) as they
    were in the input, with ``chunked`` the :data:`CHUNK_COLUMNS`, predictions (with the ``asked`` optional ones), with
    ``ranked`` the :data:`RANK_COLUMN`, identity columns (and with ``incremental`` the :data:`INCREMENTAL_COLUMNS`, and
    with both the :data:`KEY_DIGEST_COLUMN`; with ``incremental`` and ``file_status`` the :data:`FILE_COLUMNS`).

    Raises :class:`~lakescore.schemas.contracts.InputContractError` when an id or key column's name collides
    with an output column.
    """
    taken = (
        ([f.name for f in CHUNK_COLUMNS] if chunked else [])
        + prediction_columns(task, asked)
        + list(IDENTITY_COLUMNS)
        + list(INCREMENTAL_COLUMNS)
        + list(ERROR_COLUMNS)
        + [WORKER_COLUMN]
        + ([RANK_COLUMN, KEY_DIGEST_COLUMN] if ranked else [])
    )
    files = list(FILE_COLUMNS.items()) if incremental and file_status else []
    taken += [name for name, _ in files]
    for field in row_fields:
        if field.name in taken:
            raise InputContractError(
                f"id column {field.name!r} collides with an output column ({', '.join(taken)}); rename it"
            )
    extra = [*INCREMENTAL_COLUMNS, *([KEY_DIGEST_COLUMN] if ranked else [])] if incremental else []
    return StructType(
        [StructField(f.name, f.dataType, nullable=True) for f in row_fields]
        + ([StructField(f.name, f.dataType, nullable=True) for f in CHUNK_COLUMNS] if chunked else [])
        + prediction_fields(task, asked)
        + ([StructField(RANK_COLUMN, IntegerType(), nullable=True)] if ranked else [])
        + [StructField(name, StringType(), nullable=True) for name in IDENTITY_COLUMNS]
        + [StructField(name, StringType(), nullable=True) for name in extra]
        + [StructField(name, kind, nullable=True) for name, kind in files]
    )


def errors_schema(*id_fields: StructField, incremental: bool = False) -> StructType:
    """The dead-letter table: the id column(s), raw input (text, or the features as JSON), reason code, error text,
    run id (with ``incremental``, then the :data:`CARRY_COLUMNS`)."""
    return StructType(
        [StructField(f.name, f.dataType, nullable=True) for f in id_fields]
        + [
            StructField("input", StringType(), nullable=True),
            StructField("reason", StringType(), nullable=True),
            StructField("error", StringType(), nullable=True),
            StructField("run_id", StringType(), nullable=True),
        ]
        + ([StructField(name, kind, nullable=True) for name, kind in CARRY_COLUMNS] if incremental else [])
    )


def column_types(schema: StructType) -> list[tuple[str, str]]:
    """``(name, type)`` per column, types in full (``array<float>``), nullability ignored.

    Delta and Parquet do not keep every nullability flag as written, so two schemas
    are "the same table shape" when these lists are equal.
    """
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]
