"""The examples in the docstrings of the report, console, Delta column name, progress and table modules run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("module", [
    "lakescore.jobs.platform.console", "lakescore.jobs.platform.delta_names", "lakescore.jobs.platform.progress",
    "lakescore.jobs.platform.tables",
    "lakescore.jobs.report",
])
def test_docstring_examples(module):
    failed, attempted = doctest.testmod(importlib.import_module(module))
    assert attempted > 0 and failed == 0
