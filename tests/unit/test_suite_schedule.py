"""The suite's own schedule (``tests/conftest.py``): the longest files start first on ``make test``'s two processes."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLOWEST_FIRST

TESTS = Path(__file__).resolve().parents[1]


def test_every_file_named_slowest_first_exists_once():
    assert [name for name in SLOWEST_FIRST if not (TESTS / name).is_file()] == []
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)


def test_xdist_keeps_the_collection_order_that_puts_the_slowest_files_first(pytestconfig):
    # pytest-xdist's default (--loadscope-reorder) sorts the files by their number of tests, whatever the order.
    assert pytestconfig.getoption("loadscopereorder") is False
