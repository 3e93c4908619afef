"""A reference is read once into a ``TableRef`` (path or parsed name), and the one MERGE renders one way per runner."""

import os

import pytest

from lakescore.jobs.platform.tables import MERGE_OP, TableRef, write_delta
from lakescore.jobs.platform.tables.writes import _MergeClauses
from lakescore.jobs.references import TableNameError


@pytest.mark.parametrize(
    "ref, is_path, sql",
    [
        ("/data/x", True, "delta.`/data/x`"),
        ("s3a://bucket/a`b", True, "delta.`s3a://bucket/a``b`"),
        ("sales.reviews", False, "`sales`.`reviews`"),
        ("main.`sales/eu`.`we``ird`", False, "`main`.`sales/eu`.`we``ird`"),
    ],
)
def test_a_reference_is_parsed_once_into_path_or_name(ref, is_path, sql):
    parsed = TableRef.parse(ref)
    assert (parsed.is_path, parsed.sql, str(parsed)) == (is_path, sql, ref)
    assert (parsed.name is None) is is_path
    assert TableRef.parse(parsed) is parsed  # a parsed reference is not parsed again


def test_a_bare_name_that_exists_locally_is_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reviews.parquet").mkdir()
    parsed = TableRef.parse("reviews.parquet")
    assert parsed.is_path and parsed.text == os.path.join(str(tmp_path), "reviews.parquet")
    assert not TableRef.parse("reviews.delta").is_path


def test_a_bad_table_name_fails_where_it_is_parsed_naming_its_role():
    with pytest.raises(TableNameError, match=r"^output 'db\.' is not a table name"):
        TableRef.parse("db.", "output")


def test_the_merge_is_built_once_and_rendered_as_sql_with_every_column_quoted():
    clauses = _MergeClauses.upsert_or_delete(["my id"], ["my id", "score"])
    assert clauses.assignments == {"`my id`": "s.`my id`", "`score`": "s.`score`"}
    assert clauses.sql("delta.`/out`", "`changes`") == (
        f"MERGE INTO delta.`/out` AS t USING `changes` AS s ON t.`my id` = s.`my id` "
        f"WHEN MATCHED AND s.{MERGE_OP} = 'delete' THEN DELETE "
        f"WHEN MATCHED AND s.{MERGE_OP} = 'upsert' THEN UPDATE SET t.`my id` = s.`my id`, t.`score` = s.`score` "
        f"WHEN NOT MATCHED AND s.{MERGE_OP} = 'upsert' THEN INSERT (`my id`, `score`) VALUES (s.`my id`, s.`score`)"
    )
    composite = _MergeClauses.upsert_or_delete(["user_id", "item id"], ["user_id", "item id", "score"])
    assert composite.on == "t.`user_id` = s.`user_id` AND t.`item id` = s.`item id`"


def test_an_unknown_write_mode_is_refused_before_any_spark_work():
    with pytest.raises(ValueError, match="write mode 'upsert' is not one of"):
        write_delta(None, "/out", "upsert")
