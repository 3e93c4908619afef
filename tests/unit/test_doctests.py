"""The examples in the docstrings of the report, console, progress, table, column name and scoring modules run as
written."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "lakescore.jobs.platform.spark.console",
        "lakescore.jobs.platform.spark.progress",
        "lakescore.jobs.platform.tables.refs",
        "lakescore.jobs.report.model",
        "lakescore.schemas.column_names",
        "lakescore.jobs.cost",
        "lakescore.jobs.references",
        "lakescore.udfs.remote.message_batches",
        "lakescore.udfs.remote.completions",
        "lakescore.udfs.remote.messages",
        "lakescore.udfs.options.remote",
        "lakescore.udfs.options.generate",
        "lakescore.jobs.steps.score",
    ],
)
def test_docstring_examples(module):
    failed, attempted = doctest.testmod(importlib.import_module(module))
    assert attempted > 0 and failed == 0
