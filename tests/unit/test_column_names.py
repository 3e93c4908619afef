"""Column names Delta refuses or Spark cannot resolve bare: found by name, and escaped reversibly (no Spark)."""

from __future__ import annotations

from lakescore.schemas.column_names import delta_storable_name, original_name, refused_by_delta, resolvable_name

NAMES = [
    "review text",
    "price (eur)",
    "a=b",
    "x,y;z",
    "{nested}",
    "tab\there",
    "new\nline",
    "50%",
    "review%20text",
    "%25",
    "%2",
    "body",
    "évaluation 日本",
    "évaluation_日本",
    "a.b",
    "`quoted`",
    "a`b.c d",
    "",
]


def test_every_name_escapes_to_one_its_consumer_takes_and_back_to_itself():
    for name in NAMES:
        stored, resolvable = delta_storable_name(name), resolvable_name(name)
        assert refused_by_delta([stored]) is None and not set(".`") & set(resolvable), name
        assert original_name(stored) == name and original_name(resolvable) == name


def test_distinct_names_stay_distinct_and_names_without_the_characters_or_a_percent_are_kept():
    for escape in (delta_storable_name, resolvable_name):
        assert len({escape(name) for name in NAMES}) == len(NAMES)
    for name in ("body", "évaluation_日本", ""):
        assert delta_storable_name(name) == resolvable_name(name) == name
    assert delta_storable_name("a.b") == "a.b" and resolvable_name("review text") == "review text"


def test_the_first_name_delta_refuses_is_named():
    assert refused_by_delta(["review_id", "review text", "a=b"]) == "review text"
    assert refused_by_delta(["review_id", "body", "50%", "a.b"]) is None
    assert refused_by_delta([]) is None
