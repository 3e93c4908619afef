"""Hostile table names and paths on the real local Hive metastore and Delta: quoted right, or refused before compute.

The local session catalog (``spark_catalog``) accepts letters, digits and ``_`` only, so what it can hold is
tested end to end here (reserved words, three-part names, derived errors and staging tables); names only
Unity Catalog accepts are refused in one line before any compute. Delta paths take any character, so a
path with a space, unicode and a backtick goes through Delta's SQL end to end.
"""

from __future__ import annotations

import pytest

from lakescore.jobs.cli import main
from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.steps.staging import Staging
from tests.integration.test_score_job import read_output, reviews_frame

ROWS = 12


def _job(minilm_dir, source: str, output: str, **flags):
    return load_config(
        flags={
            "input": source,
            "output": output,
            "model.source": str(minilm_dir),
            "id_col": "review_id",
            "text_col": "body",
            **flags,
        }
    )


def test_reserved_words_and_three_part_names_are_quoted_everywhere(spark, minilm_dir):
    spark.sql("CREATE DATABASE IF NOT EXISTS `select`")
    spark.createDataFrame(reviews_frame(ROWS, seed=6)).write.format("delta").mode("overwrite").saveAsTable(
        "`select`.`order`"
    )
    output = "spark_catalog.select.from"  # three parts, all SQL keywords: unquoted, Spark could not even parse it
    first = run_scoring(_job(minilm_dir, "select.order", output, run_id="r1"), spark)
    assert first.status == "succeeded" and first.errors_table == "spark_catalog.select.from_errors"
    assert first.chunks["staging"].startswith("spark_catalog.select.from__lakescore_staging_")
    # What an interrupted run of another key left (its rows to score): r2's publish removes it.
    left = Staging.for_output(spark, output, None, "0" * 20 + "_rows", 1)
    left.write(spark.range(3))
    again = run_scoring(_job(minilm_dir, "select.order", output, run_id="r2"), spark)
    assert (again.previous_delta_version, again.delta_version) == (0, 1)
    out = spark.table("`spark_catalog`.`select`.`from`").toPandas()
    assert len(out) == ROWS and set(out["run_id"]) == {"r2"}
    errors = spark.table("`select`.`from_errors`")
    assert errors.count() == 0 and "review_id" in errors.columns
    tables = {r.tableName for r in spark.sql("SHOW TABLES IN `select`").collect()}
    assert tables == {"order", "from", "from_errors"}  # the staging tables were dropped after each publish, left's too
    assert again.staging_removed == [left.location]


@pytest.mark.parametrize(
    "output, message",
    [
        ("it.`review scores`", "output 'it.`review scores`' cannot be created in Spark's session catalog"),
        ("`sales-eu`.scores", "output '`sales-eu`.scores' cannot be created in Spark's session catalog"),
        ("it.`évaluations`", "'évaluations' has characters other than letters, digits and _"),
        ("it.`a``b`", "output 'it.`a``b`' cannot be created"),
        ("it..scores", "output 'it..scores' is not a table name: empty name part at character 4"),
        ("a.b.c.d", "output 'a.b.c.d' has 4 name parts"),
    ],
)
def test_names_the_metastore_refuses_fail_before_compute(tmp_path, spark, minilm_dir, capsys, output, message):
    source = tmp_path / "reviews.parquet"
    reviews_frame(ROWS).to_parquet(source)
    code = main(
        [
            "score",
            "--input",
            str(source),
            "--output",
            output,
            "--model",
            str(minilm_dir),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("lakescore: error: ") and message in err, err
    assert not spark.catalog.tableExists("`it`.`review scores`")


def test_a_delta_path_with_spaces_unicode_and_a_backtick(tmp_path, spark, minilm_dir):
    from lakescore.jobs.platform.tables import check_output_target
    from lakescore.schemas.output import output_schema

    source = tmp_path / "reviews.parquet"
    reviews_frame(ROWS, seed=9).to_parquet(source)
    output = tmp_path / "out dir ü`x" / "scores"
    report = run_scoring(_job(minilm_dir, str(source), str(output), run_id="p1"), spark)
    assert report.status == "succeeded" and report.delta_version == 0  # DESCRIBE HISTORY delta.`...` read it back
    out = read_output(spark, str(output))
    assert len(out) == ROWS and set(out["run_id"]) == {"p1"}
    assert not (output.parent / "_lakescore_staging").exists()  # the staging table and its empty folders are gone
    schema = output_schema("embed", spark.read.parquet(str(source)).schema["review_id"])
    assert check_output_target(spark, str(output), schema) == 0  # what a rerun checks first: it exists, Delta, v0
    assert (
        check_output_target(spark, str(output), schema, version=False) is None
    )  # the errors table's check: no history
