"""Table names: one parser, one quoting function, derived names from parsed parts, one-line errors (no Spark)."""

from __future__ import annotations

import pytest

from lakescore.jobs.config import ConfigError, load_config
from lakescore.jobs.references import TableNameError, parse_table_name, quote_identifier, require_catalog_accepts
from lakescore.jobs.steps.staging import staging_location

HOSTILE = [
    # (as written, parts, what Spark receives)
    ("reviews", ("reviews",), "`reviews`"),
    ("sales.reviews", ("sales", "reviews"), "`sales`.`reviews`"),
    ("main.sales.reviews", ("main", "sales", "reviews"), "`main`.`sales`.`reviews`"),
    ("main.`sales-eu`.`review scores`", ("main", "sales-eu", "review scores"), "`main`.`sales-eu`.`review scores`"),
    ("main.sales-eu.review_scores", ("main", "sales-eu", "review_scores"), "`main`.`sales-eu`.`review_scores`"),
    ("`db.with.dots`.t", ("db.with.dots", "t"), "`db.with.dots`.`t`"),
    ("db.`we``ird`", ("db", "we`ird"), "`db`.`we``ird`"),
    ("db.````", ("db", "`"), "`db`.````"),
    ("db.`bobby'; DROP TABLE x; --`", ("db", "bobby'; DROP TABLE x; --"), "`db`.`bobby'; DROP TABLE x; --`"),
    ("ventes.`évaluations 日本`", ("ventes", "évaluations 日本"), "`ventes`.`évaluations 日本`"),
    ("select.from", ("select", "from"), "`select`.`from`"),  # reserved words: quoted, so never parsed as SQL
    ("db.`a/b:c`", ("db", "a/b:c"), "`db`.`a/b:c`"),
]


@pytest.mark.parametrize("text, parts, quoted", HOSTILE)
def test_parse_and_quote_round_trip(text, parts, quoted):
    name = parse_table_name(text)
    assert name.parts == parts and name.quoted == quoted
    assert parse_table_name(str(name)) == name  # the display form reads back to the same parts
    assert parse_table_name(name.quoted) == name


@pytest.mark.parametrize(
    "text, message",
    [
        ("a..b", "empty name part at character 3"),
        ("db.", "empty name part at character 4"),
        ("`a", "unterminated backtick at character 1"),
        ("db.`a`b", "text after the closing backtick at character 6"),
        ("a`b", "a backtick inside an unquoted part"),
        ("a.b.c.d", "has 4 name parts; a table is [catalog.][schema.]table"),
        (" sales.reviews", "space at the start or end of ' sales'"),
        ("db.`tab\nle`", "control character"),
        ("db." + "x" * 256, "a part is over 255 characters"),
        ("db.``", "empty name part at character 4"),
    ],
)
def test_illegal_names_fail_in_one_line(text, message):
    with pytest.raises(TableNameError, match="^output ") as caught:
        parse_table_name(text, "output")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert isinstance(caught.value, ConfigError)  # exit 2, before compute


def test_the_one_quoting_function_doubles_backticks():
    assert quote_identifier("a`b") == "`a``b`" and quote_identifier("") == "``"


def test_errors_and_staging_names_derive_from_the_parsed_output():
    assert (
        load_config(flags={"output": "main.`sales-eu`.`my scores`"}).errors_ref()
        == "main.`sales-eu`.`my scores_errors`"
    )
    assert load_config(flags={"output": "db.`we``ird`"}).errors_ref() == "db.`we``ird_errors`"
    assert load_config(flags={"output": "it.scores"}).errors_ref() == "it.scores_errors"
    assert load_config(flags={"output": "/data/scores/"}).errors_ref() == "/data/scores_errors"
    assert (
        staging_location("main.`sales-eu`.`my scores`", None, "k1")
        == "main.`sales-eu`.`my scores__lakescore_staging_k1`"
    )
    assert staging_location("it.scores", "cat.stage.`run-`", "k1") == "cat.stage.`run-_k1`"
    assert staging_location("it.scores", "/tmp/stage/", "k1") == "/tmp/stage/k1"
    assert staging_location("/data/out/scores", None, "k1") == "/data/out/_lakescore_staging/scores/k1"
    with pytest.raises(TableNameError, match="write.staging 'cat..x'"):
        staging_location("it.scores", "cat..x", "k1")


class _Catalog:
    def __init__(self, current):
        self.current = current

    def currentCatalog(self):
        return self.current


class _Session:
    def __init__(self, current="spark_catalog"):
        self.catalog = _Catalog(current)


def test_the_session_catalog_rule_applies_only_to_spark_catalog():
    require_catalog_accepts(_Session(), parse_table_name("it.`select`"), "output")  # reserved words are fine there
    with pytest.raises(TableNameError, match=r"^output 'it.`my scores`' cannot be created in Spark's session catalog"):
        require_catalog_accepts(_Session(), parse_table_name("it.`my scores`"), "output")
    with pytest.raises(TableNameError, match="'sales-eu' has characters other than"):
        require_catalog_accepts(_Session("main"), parse_table_name("spark_catalog.sales-eu.t"), "errors")
    require_catalog_accepts(_Session(), parse_table_name("main.`sales-eu`.`my scores`"), "output")  # Unity Catalog
    require_catalog_accepts(_Session("main"), parse_table_name("`sales-eu`.`my scores`"), "output")


@pytest.mark.parametrize(
    "ref, path",
    [
        ("reviews", False),
        ("sales.reviews", False),
        ("main.`sales/eu`.`a:b`", False),
        ("it..scores", False),
        ("/data/x", True),
        ("./x", True),
        ("s3a://bucket/x", True),
        ("dbfs:/x", True),
        ("/data/v1.2/x", True),
        ("/tmp/out dir ü`x/scores", True),  # a backtick in a path does not make it a table
    ],
)
def test_a_separator_outside_quoted_parts_makes_a_path(ref, path):
    from lakescore.jobs.platform.tables import is_path

    assert is_path(ref) is path
