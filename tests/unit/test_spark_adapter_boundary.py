"""Classic-only Spark calls live in one module, so the job runs over Spark Connect (checked on the code's syntax
tree)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ADAPTER = REPO / "jobs" / "platform" / "spark" / "adapter.py"
PACKAGES = ("lakescore", "jobs", "udfs", "schemas", "bench")

CLASSIC_ONLY = {
    "sparkContext",
    "_jvm",
    "_jsc",
    "_jsparkSession",
    "rdd",
    "accumulator",
    "Accumulator",
    "addFile",
    "addPyFile",
    "statusTracker",
    "setJobGroup",
    "cancelJobGroup",
    "SparkContext",
    "hadoopConfiguration",
    "_jo",
}
"""Attributes and names a Spark Connect session does not have."""


def _classic_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if isinstance(node, ast.alias):
            name = node.name.rsplit(".", 1)[-1]
        if name in CLASSIC_ONLY:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    return found


def test_no_classic_only_call_outside_the_adapter():
    sources = [p for package in PACKAGES for p in (REPO / package).rglob("*.py") if p != ADAPTER]
    assert len(sources) > 40
    assert [use for path in sources for use in _classic_uses(path)] == []


def test_the_adapter_is_where_they_are():
    assert {use.rsplit(": ", 1)[1] for use in _classic_uses(ADAPTER)} >= {
        "sparkContext",
        "_jvm",
        "_jsc",
        "rdd",
        "accumulator",
    }
