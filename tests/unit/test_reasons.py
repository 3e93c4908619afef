"""Every dead-letter reason the code can write is spelled once (``lakescore.schemas.reasons``) and README's table lists
exactly those; the docs name no other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lakescore.schemas.reasons import REASONS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "udfs", "schemas", "lakescore")


def _table_reasons(text: str) -> list[str]:
    """The first column of every Markdown table whose header is ``| reason | ...``, in order."""
    found, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\|\s*reason\s*\|", line):
            inside = True
        elif inside and line.startswith("|"):
            name = re.match(r"^\|\s*`([a-z_]+)`\s*\|", line)
            if name:
                found.append(name.group(1))
        else:
            inside = False
    return found


def test_readme_lists_every_reason_once_in_the_registry_order():
    assert _table_reasons((ROOT / "README.md").read_text()) == list(REASONS)


def test_the_docs_tables_name_only_registered_reasons():
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert set(_table_reasons(doc.read_text())) <= set(REASONS), doc.name


def test_the_code_spells_no_reason_outside_the_registry():
    """A reason written as text elsewhere could drift from the table: the code uses the registry's constants."""
    spelled = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "schemas" / "reasons.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in REASONS:
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert spelled == []
