"""Step 3c, changes (``write.mode: incremental``): which input rows need the model this run, and which ids left.

Every scorable row gets an :data:`~lakescore.schemas.output.DIGEST_COLUMN`: the SHA-256 (Spark's ``sha2``) of
exactly what the model sees, the text, an image's bytes (a file's, for an image column of paths), or the feature
values as a JSON array of doubles in the model's order. An output of an image column of paths also stores each file's
path, length and modification time, and a file with all three unchanged keeps its stored digest unread (so, like
rsync's quick check, a file rewritten with the same length and its time set back counts as unchanged). The output as
it was before this run (read at its pinned version) is joined on the id: a row is scored when its id is not in the
output, its digest differs, or its output row carries other weights (``model_sha256``) or another scoring spec
(``spec_digest``, :class:`~lakescore.jobs.steps.context.ScoringSpec`: every setting that changes the numbers, the
digests of the model's files besides its weights as the executors loaded them, and
:data:`~lakescore.schemas.output.OUTPUT_VERSION`). Every other row is kept as it is. Output ids no longer in the input
are counted (and deleted at publish with ``write.delete_missing``). A run on a missing output, or with
``write.full_rescore``, scores every row. With ``rank`` the comparison is by key instead
(:func:`~lakescore.jobs.steps.rank.key_digest`): every row of a key with a new, changed or deleted row is scored, the
other keys' rows are kept.

A row the errors table holds from the last run with a reason of the row's own
(:func:`~lakescore.schemas.output.carries`) under the same digest, weights and spec is carried instead of scored: its
dead letter goes to this run's errors table as it was, marked ``carried`` (``write.retry_failed`` scores it again;
not with ``rank``, whose keys are scored whole).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakescore.jobs.platform.files.hadoop_files import file_bytes
from lakescore.jobs.platform.spark import adapter as spark_adapter
from lakescore.jobs.platform.tables import column, delta_history, read_input
from lakescore.jobs.steps.context import Changes, RunContext, ScoringSpec
from lakescore.jobs.steps.dead_letter import CARRIED
from lakescore.jobs.steps.ids import id_columns, same_values
from lakescore.jobs.steps.rank import key_digest
from lakescore.jobs.steps.staging import Staging
from lakescore.schemas.contracts import FILE_COLUMN, IMAGE_COLUMN, PROMPT_COLUMN
from lakescore.schemas.id_columns import CHUNK_INDEX
from lakescore.schemas.output import (
    DIGEST_COLUMN,
    FILE_COLUMNS,
    ID_REASONS,
    INCREMENTAL_COLUMNS,
    KEY_DIGEST_COLUMN,
    SERVER_REASONS,
)

__all__ = ["CHANGES_LAYOUT", "input_digest", "recorded_spec", "find_changes"]

SPEC_COLUMN = INCREMENTAL_COLUMNS[1]
_PREVIOUS = {
    name: f"__lakescore_previous_{name}"
    for name in (DIGEST_COLUMN, "model_sha256", SPEC_COLUMN, KEY_DIGEST_COLUMN, *FILE_COLUMNS)
}
_KEY_DIGEST = "__lakescore_key_digest"
_MISSING = "__lakescore_missing"
"""The changes table's flag: ``True`` on an output id missing from the input, ``False`` on an input row."""
_KEPT = "__lakescore_kept"
"""The changes table's flag on an input row whose file was read and digested and found current: kept, not scored
(:func:`_changed_or_missing` says why it is in the table at all)."""
_DEAD_LETTER = ("input", "reason", "error", "first_run_id")
"""The fields of the changes table's :data:`~lakescore.jobs.steps.dead_letter.CARRIED` dead letter."""
DISTINCT_RSD = 0.01
"""Relative standard deviation of the distinct-input estimate (Spark's HyperLogLog++ then keeps 2^14 registers, about
13 KiB a task)."""
CHANGES_LAYOUT = 4
"""What the changes table holds, part of its key: 4, the rows to score, the missing ids, the rows kept after their
file was read and the rows carried with their dead letter, flagged (3 had no rows carried, 2 no rows kept, 1 held the
rows to score alone). A run resumed by a release with another
layout joins again instead of misreading the table."""


def input_digest(input_cols: tuple[str, ...], one_column: bool, pair: bool = False) -> Column:
    """SHA-256 (hex) of what the model sees: the text itself, an image's bytes, a text pair's two sides as a JSON
    array (``pair``), or the features as a JSON array of doubles in model order.

    The digest sees every input it is given, so rows that differ in any input never share a digest (nor, under dedup,
    a dead letter): a pair's null side is JSON ``null`` in its array, an image read from a path (``input_cols``: the
    bytes, then the path) that is missing digests its path, and an image with its prompt digests the prompt whatever
    the image. Only a row whose every input is null (one text, one image) digests to null: dedup scores such a row
    on its own, and null-safe comparison keeps it apart from any value.
    """
    if pair:  # to_json writes a null side as null and a side "null" as "null"; rows with both sides digest as before
        return F.sha2(F.to_json(F.array(*[column(c) for c in input_cols])), 256)
    if one_column:
        prompted = input_cols[-1] == PROMPT_COLUMN and len(input_cols) > 1  # an image with its prompt: both count
        files = input_cols[:-1] if prompted else input_cols
        digest = F.sha2(column(files[0]), 256)
        if len(files) > 1:
            digest = F.coalesce(digest, F.sha2(F.concat(F.lit("missing file: "), column(files[1])), 256))
        if prompted:  # a null image (and no path) still digests its prompt: the prompt is that row's own input
            digest = F.sha2(
                F.concat(
                    F.coalesce(digest, F.lit("null image")),
                    F.lit("\n"),
                    F.coalesce(F.sha2(column(PROMPT_COLUMN), 256), F.lit("")),
                ),
                256,
            )
        return digest
    return F.sha2(F.to_json(F.array(*[column(c).cast("double") for c in input_cols])), 256)


def recorded_spec(spark, output: str, version: int) -> dict | None:
    """The scoring spec's parts the newest lakescore commit of ``output`` at or before ``version`` recorded in its
    ``userMetadata`` (:func:`~lakescore.jobs.platform.tables.run_metadata`); ``None`` when none did. The latest
    commit is read first: the whole history only when another writer committed after lakescore's publish."""
    for limit in (1, None):
        for entry in delta_history(spark, output, limit):
            if entry.version <= version and entry.spec is not None:
                return entry.spec
    return None


def find_changes(
    run: RunContext,
    scorable: DataFrame,
    scorable_rows: int,
    refused: DataFrame | None,
    model_sha256: str,
    spec: ScoringSpec,
    previous_version: int | None,
    changed: Staging,
    errors: str | None = None,
) -> Changes:
    """Split ``scorable`` (``scorable_rows`` rows) into rows to score and rows kept against the output at
    ``previous_version`` for weights ``model_sha256`` and scoring ``spec``, and find the output's ids missing from the
    input (``refused``: the input rows refused for a null or duplicated id, ``None`` when there are none). With
    ``write.full_rescore`` (or no output yet) every row is to score and nothing is compared. ``errors``: the errors
    table whose dead letters of the row's own fault are carried (:func:`_dead_letters`), ``None`` when there is none
    with the carry columns; nothing is carried with ``write.retry_failed`` or ``rank``.

    When the output exists, one full outer join of the scorable rows with the output's ids finds both (for an image
    column of paths, with a pre-check of each file's path, length and modification time that reads only the files
    it does not find unchanged: :func:`_changed_or_missing`): its new and changed rows, and the output ids no scorable
    row has (flagged :data:`_MISSING`), are written once to ``changed`` (a private table of this run's key, dropped
    with staging after the publish), counted by that write. The dedup sample, the scoring and the publish's deletions
    read that small table, and a rerun of the same run finds it, counts it and joins nothing.
    An output id whose input row was refused for a null or duplicated id is not missing (it is in the input).
    """
    cfg = run.cfg
    if previous_version is None or cfg.write.full_rescore:
        digested = scorable.withColumn(
            DIGEST_COLUMN, input_digest(run.input_cols, cfg.column_setting is not None, cfg.text_pair_col is not None)
        )
        no_ids = run.source.select(*id_columns(cfg.id_cols)).limit(0)  # planned empty: no Python RDD, no job
        return Changes(
            to_score=digested,
            rows_to_score=scorable_rows,
            rows_kept=0,
            rows_missing=0,
            missing_ids=no_ids,
            distinct_to_score=None,
            spec=spec,
            spec_changes=None,
            model_sha256=model_sha256,
            previous_version=previous_version,
        )
    counts = None
    if not changed.exists():
        compare = _changed_keys_or_missing if cfg.rank.enabled else _changed_or_missing
        rows = compare(run, scorable, previous_version, model_sha256, spec.digest)
        carrying = errors is not None and not cfg.write.retry_failed and not cfg.rank.enabled
        dead = _dead_letters(run, errors, model_sha256, spec.digest) if carrying and errors is not None else None
        counts = _write_counting(changed, _with_carried(cfg.id_cols, rows, dead))
    table = changed.table()
    to_score = table.where(_to_score()).drop(_MISSING, _KEPT, CARRIED)
    missing = table.where(F.col(_MISSING)).select(*id_columns(cfg.id_cols))
    if counts is None:  # a rerun found the table, or a Connect session, which counts in a job of its own
        counts = spark_adapter.one_row(table.agg(*_count_columns())).asDict()
    rows_to_score, rows_missing, rows_carried = int(counts["to_score"]), int(counts["missing"]), int(counts["carried"])
    carried_reasons = {}
    if rows_carried:  # a small job over the carried rows only, for the report's reasons
        by_reason = table.where(F.col(CARRIED).isNotNull()).groupBy(F.col(f"{CARRIED}.reason")).count().collect()
        carried_reasons = {r[0]: int(r[1]) for r in by_reason}
    if refused is not None:
        ours = _renamed(cfg.id_cols, "input_id")
        missing = missing.join(
            refused.select(*[column(c).alias(ours[c]) for c in cfg.id_cols]),
            same_values(cfg.id_cols, ours),
            "left_anti",
        )
        rows_missing = missing.count()
    # A changed spec makes every output row one to score: with none to score, there is no change to explain.
    spec_changes = (
        spec.changes_since(recorded_spec(run.spark, cfg.output_ref(), previous_version)) if rows_to_score else None
    )
    kept = scorable_rows - rows_to_score - rows_carried
    return Changes(
        to_score=to_score,
        rows_to_score=rows_to_score,
        rows_kept=kept,
        rows_missing=rows_missing,
        missing_ids=missing,
        distinct_to_score=int(counts["distinct"] or 0),
        spec=spec,
        spec_changes=spec_changes,
        model_sha256=model_sha256,
        previous_version=previous_version,
        table=changed,
        rows_carried=rows_carried,
        carried_reasons=dict(sorted(carried_reasons.items())),
    )


def _to_score() -> Column:
    """The changes table's rows to score: neither a missing id, a row kept after its file was read nor one carried."""
    return ~F.col(_MISSING) & ~F.col(_KEPT) & F.col(CARRIED).isNull()


def _count_columns() -> list[Column]:
    """The changes table's counts: rows to score, missing ids, rows carried, distinct inputs among the rows to score (a
    null input counting as one)."""
    scored = _to_score()
    return [
        F.count(F.when(scored, 1)).alias("to_score"),
        F.count(F.when(F.col(_MISSING), 1)).alias("missing"),
        F.count(F.col(CARRIED)).alias("carried"),
        (
            F.approx_count_distinct(F.when(scored, column(DIGEST_COLUMN)), DISTINCT_RSD)
            + F.max(F.when(scored, column(DIGEST_COLUMN).isNull().cast("int")))
        ).alias("distinct"),
    ]


def _write_counting(changed: Staging, rows: DataFrame) -> dict | None:
    """Write ``rows`` to ``changed`` and return :func:`_count_columns` of them, computed by the write itself
    (:func:`~lakescore.jobs.platform.spark.adapter.observed`: no second job over the table); ``None`` where the
    session cannot (Spark Connect: the caller counts the table)."""
    observed_rows, counts = spark_adapter.observed(rows, *_count_columns())
    changed.write(observed_rows)
    return counts()


def _dead_letters(run: RunContext, errors: str, model_sha256: str, spec: str) -> DataFrame:
    """The rows of the errors table ``errors`` (at its current version: only a publish of this output rewrites it)
    that a run with weights ``model_sha256`` and scoring spec ``spec`` carries when their input is unchanged: a reason
    of the row's own (:func:`~lakescore.schemas.output.carries`), found under the same weights and spec. Their id
    columns renamed (:func:`_renamed`, ``dead_id``), their digest and :data:`_DEAD_LETTER`; one row per id."""
    ids = run.cfg.id_cols
    theirs = _renamed(ids, "dead_id")
    rows = read_input(run.spark, errors, "delta").where(
        ~F.col("reason").isin(*sorted(ID_REASONS | SERVER_REASONS))
        & (F.col("model_sha256") == F.lit(model_sha256))
        & (F.col("spec_digest") == F.lit(spec))
    )
    first = F.coalesce(F.col("first_run_id"), F.col("run_id")).alias(_DEAD["first_run_id"])
    return rows.select(
        *[column(c).alias(theirs[c]) for c in ids],
        F.col("input_digest").alias(_DEAD_DIGEST),
        *[F.col(name).alias(_DEAD[name]) for name in _DEAD_LETTER[:-1]],
        first,
    ).dropDuplicates(list(theirs.values()))


_DEAD_DIGEST = "__lakescore_dead_digest"
_DEAD = {name: f"__lakescore_dead_{name}" for name in _DEAD_LETTER}
"""Private names of the dead letter's columns beside the input's (whose own may be named ``input`` or ``error``)."""


def _with_carried(id_cols, rows: DataFrame, dead: DataFrame | None) -> DataFrame:
    """``rows`` (the changes table's) with :data:`CARRIED`: the dead letter of ``dead`` (:func:`_dead_letters`) whose id
    and digest an input row to score has; null elsewhere, and everywhere when ``dead`` is ``None``."""
    kind = "struct<" + ",".join(f"{name}:string" for name in _DEAD_LETTER) + ">"
    if dead is None:
        return rows.withColumn(CARRIED, F.lit(None).cast(kind))
    theirs = _renamed(id_cols, "dead_id")
    scored = ~F.col(_MISSING) & ~F.col(_KEPT)
    on = same_values(id_cols, theirs) & column(DIGEST_COLUMN).eqNullSafe(F.col(_DEAD_DIGEST)) & scored
    joined = rows.join(dead, on, "left")
    letter = F.when(
        F.col(_DEAD["reason"]).isNotNull(), F.struct(*[F.col(_DEAD[name]).alias(name) for name in _DEAD_LETTER])
    )
    return joined.select(*[column(c) for c in rows.columns], letter.alias(CARRIED))


def _renamed(names, prefix: str) -> dict[str, str]:
    """Private aliases for ``names`` on the other side of a join: ``__lakescore_<prefix>_<i>``."""
    return {name: f"__lakescore_{prefix}_{i}" for i, name in enumerate(names)}


def _changed_or_missing(
    run: RunContext, scorable: DataFrame, previous_version: int, model_sha256: str, spec: str
) -> DataFrame:
    """``scorable``'s rows that are new or not current (other digest, weights or spec), and the output ids with no
    row in ``scorable`` (every other column null), each with :data:`_MISSING` saying which it is, and their
    :data:`DIGEST_COLUMN`.

    An image column of paths compared with an output that stores each file's path, length and modification time
    (:data:`~lakescore.schemas.output.FILE_COLUMNS`) checks those first, like rsync and make: a row whose output row
    has the same path, length and time, and current weights and spec, is current without its file being read (its
    stored digest stands). So a file rewritten with the same length and its modification time set back is taken as
    unchanged. Every other row's file is read and digested; a row whose digest then matches (a file touched, or its
    status not stored) is kept but in the table, flagged :data:`_KEPT`, its bytes dropped, because a filter on the
    digest would be pushed below the read and read each changed file twice."""
    cfg = run.cfg
    theirs = _renamed(cfg.id_cols, "previous_id")
    output = read_input(run.spark, cfg.output_ref(), "delta", version=previous_version)
    if (
        CHUNK_INDEX in output.columns
    ):  # a chunked output: a document's rows share its digest; its first chunk stands for it
        output = output.where(F.col(CHUNK_INDEX) == 0)
    # an image read with a prompt changes with its prompt too, which the file's status does not tell: read every file
    prechecked = (
        FILE_COLUMN in scorable.columns
        and set(FILE_COLUMNS) <= set(output.columns)
        and PROMPT_COLUMN not in run.input_cols
    )
    stored = [DIGEST_COLUMN, "model_sha256", SPEC_COLUMN, *(FILE_COLUMNS if prechecked else [])]
    previous = output.select(
        *[column(c).alias(theirs[c]) for c in cfg.id_cols], *[column(name).alias(_PREVIOUS[name]) for name in stored]
    )
    digest = input_digest(run.input_cols, cfg.column_setting is not None, cfg.text_pair_col is not None)
    # With the pre-check the files are read after the join, only for the rows it leaves; else every row's before it.
    rows = scorable.drop(IMAGE_COLUMN) if prechecked else scorable.withColumn(DIGEST_COLUMN, digest)
    joined = rows.join(previous, same_values(cfg.id_cols, theirs), "full_outer")
    is_missing = column(cfg.id_cols[0]).isNull()  # scorable rows never have a null id: null here means no input row
    current_model = (
        F.col(theirs[cfg.id_cols[0]]).isNotNull()
        & (F.col(_PREVIOUS["model_sha256"]) == F.lit(model_sha256))
        & (F.col(_PREVIOUS[SPEC_COLUMN]) == F.lit(spec))
    )
    current = F.coalesce(
        current_model & column(DIGEST_COLUMN).eqNullSafe(F.col(_PREVIOUS[DIGEST_COLUMN])), F.lit(False)
    )

    def columns(kept: Column) -> list[Column]:
        """``scorable``'s columns and the digest, an id from either side; the bytes of a ``kept`` row dropped."""
        out = []
        for c in [*scorable.columns, DIGEST_COLUMN]:
            value = (
                F.coalesce(column(c), F.col(theirs[c]).cast(scorable.schema[c].dataType)) if c in theirs else column(c)
            )
            out.append((F.when(~kept, value) if c == IMAGE_COLUMN and prechecked else value).alias(c))
        return [*out, is_missing.alias(_MISSING), kept.alias(_KEPT)]

    if not prechecked:
        return joined.where(is_missing | ~current).select(*columns(F.lit(False)))
    file, before = F.col(FILE_COLUMN), lambda name: F.col(_PREVIOUS[name])
    path, length, modified = FILE_COLUMNS
    unchanged = F.coalesce(
        current_model
        & before(DIGEST_COLUMN).isNotNull()
        & (file["path"] == before(path))
        & (file["length"] == before(length))
        & (file["modified"] == before(modified)),
        F.lit(False),
    )
    bytes_ = file_bytes(run.spark, column(run.input_cols[1]), cfg.scoring.arrow_max_bytes_per_batch)
    digested = joined.where(is_missing | ~unchanged).withColumn(IMAGE_COLUMN, bytes_).withColumn(DIGEST_COLUMN, digest)
    return digested.select(*columns(~is_missing & current))


def _changed_keys_or_missing(
    run: RunContext, scorable: DataFrame, previous_version: int, model_sha256: str, spec: str
) -> DataFrame:
    """With ``rank``: every row of each key (``rank.partition_by``) that changed, and the output rows whose id is not
    in ``scorable`` (as :func:`_changed_or_missing` gives them, flagged :data:`_MISSING`): a gone key's, or a changed
    key's that no row to score has.

    A key changed when its :func:`~lakescore.jobs.steps.rank.key_digest` differs from the one its output rows carry (a
    row new, changed or gone, a row that failed to score last time, other rank settings), or they carry other weights or
    another spec, or it has no output row. Its rows are scored again, all of them: the rows ranked out last time have no
    stored score to rank with (the output holds the top rows only), and every row of the key must be ranked together."""
    cfg = run.cfg
    digested = scorable.withColumn(
        DIGEST_COLUMN, input_digest(run.input_cols, cfg.column_setting is not None, cfg.text_pair_col is not None)
    )
    keys = list(cfg.rank.partition_by)
    theirs = _renamed(keys, "previous_key")
    output = read_input(run.spark, cfg.output_ref(), "delta", version=previous_version)
    before = output.groupBy(*[column(k).alias(theirs[k]) for k in keys]).agg(
        *[F.max(column(name)).alias(_PREVIOUS[name]) for name in (KEY_DIGEST_COLUMN, "model_sha256", SPEC_COLUMN)]
    )
    now = digested.groupBy(*id_columns(keys)).agg(key_digest(cfg).alias(_KEY_DIGEST))
    joined = now.join(before, same_values(keys, theirs, null_safe=True), "full_outer")
    current = F.coalesce(
        (F.col(_PREVIOUS[KEY_DIGEST_COLUMN]) == F.col(_KEY_DIGEST))
        & (F.col(_PREVIOUS["model_sha256"]) == F.lit(model_sha256))
        & (F.col(_PREVIOUS[SPEC_COLUMN]) == F.lit(spec)),
        F.lit(False),
    )
    changed = joined.where(F.col(_KEY_DIGEST).isNotNull() & ~current).select(
        *[column(k).alias(theirs[k]) for k in keys]
    )
    touched = joined.where(~current).select(*[F.col(theirs[k]) for k in keys])  # changed, or gone from the input
    to_score = digested.join(changed, same_values(keys, theirs, null_safe=True), "left_semi")
    # An output row whose id left the input is missing whether its key left with it or kept other rows (then the key
    # changed): the output rows of every touched key that no row to score has.
    scored_ids = _renamed(cfg.id_cols, "scored_id")
    missing = (
        output.join(touched, same_values(keys, theirs, null_safe=True), "left_semi")
        .join(
            to_score.select(*[column(c).alias(scored_ids[c]) for c in cfg.id_cols]),
            same_values(cfg.id_cols, scored_ids),
            "left_anti",
        )
        .select(
            *[
                (column(c) if c in cfg.id_cols else F.lit(None)).cast(digested.schema[c].dataType).alias(c)
                for c in digested.columns
            ]
        )
    )
    return (
        to_score.withColumn(_MISSING, F.lit(False))
        .unionByName(missing.withColumn(_MISSING, F.lit(True)))
        .withColumn(_KEPT, F.lit(False))
    )
