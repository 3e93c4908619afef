"""Column names Delta refuses: found by name, and escaped reversibly for lakescore's private tables (no Spark)."""

from __future__ import annotations

from lakescore.jobs.platform.delta_names import original_name, refused_name, storable_name

NAMES = [
    "review text", "price (eur)", "a=b", "x,y;z", "{nested}", "tab\there", "new\nline", "50%", "review%20text", "%25",
    "%2", "body", "évaluation 日本", "évaluation_日本", "a.b", "`quoted`", "",
]


def test_every_name_is_stored_under_a_name_delta_accepts_and_read_back_as_it_was():
    for name in NAMES:
        stored = storable_name(name)
        assert refused_name([stored]) is None, stored
        assert original_name(stored) == name


def test_distinct_names_stay_distinct_and_names_delta_accepts_without_a_percent_are_kept():
    assert len({storable_name(name) for name in NAMES}) == len(NAMES)
    for name in ("body", "évaluation_日本", "a.b", "`quoted`", ""):
        assert storable_name(name) == name


def test_the_first_refused_name_is_named():
    assert refused_name(["review_id", "review text", "a=b"]) == "review text"
    assert refused_name(["review_id", "body", "50%"]) is None
    assert refused_name([]) is None
