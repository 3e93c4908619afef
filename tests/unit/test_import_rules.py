"""Imports flow one way (docs/design.md, CONTRIBUTING's layout): no cycle between the package's modules, and no arrow
back up. Read from the code's syntax trees: every import counts, at the top, inside a function or for type checking."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "lakescore.udfs": ("lakescore.jobs",),
    # the remote heads know requests and answers, not the scoring loop that drives every head
    "lakescore.udfs.remote": ("lakescore.udfs.scoring_udf", "lakescore.udfs.runners", "lakescore.udfs.pandas_udf"),
    # the settings load without the HTTP client, the engine's launcher or a head (the config and the driver read them)
    "lakescore.udfs.options": (
        "lakescore.udfs.remote",
        "lakescore.udfs.heads",
        "lakescore.udfs.scoring_udf",
        "lakescore.udfs.runners",
        "lakescore.udfs.pandas_udf",
    ),
    "lakescore.schemas": ("lakescore.jobs", "lakescore.udfs"),
    "lakescore.jobs.platform": (
        "lakescore.jobs.steps",
        "lakescore.jobs.commands",
        "lakescore.jobs.cli",
        "lakescore.jobs.api",
        "lakescore.jobs.score_job",
        "lakescore.jobs.testing_hooks",
    ),
    # the session and its adapter are what table I/O and file staging stand on, never the other way
    "lakescore.jobs.platform.spark": ("lakescore.jobs.platform.tables", "lakescore.jobs.platform.files"),
    # the test hooks stand alone: the steps call them, they call nothing of the job
    "lakescore.jobs.testing_hooks": ("lakescore.jobs", "lakescore.udfs", "lakescore.schemas"),
    "lakescore.jobs.config": ("lakescore.jobs.platform", "lakescore.jobs.steps", "lakescore.jobs.commands"),
    "lakescore.jobs.steps": (
        "lakescore.jobs.commands",
        "lakescore.jobs.cli",
        "lakescore.jobs.api",
        "lakescore.jobs.score_job",
    ),
}
"""Module prefix -> the prefixes its modules must not import."""


def _modules() -> dict[str, Path]:
    """Every module of the installed package by its dotted name, found where ``pyproject.toml`` maps each package."""
    folders = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in folders.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            found[".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports (``from a import b``: ``a.b`` when that is a module, else ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_graph_is_read_whole():
    graph = _graph()
    assert len(graph) > 80
    assert "lakescore.jobs.steps.read" in graph["lakescore.jobs.score_job"]
    assert "lakescore.udfs.models.model_source" in graph["lakescore.udfs.models.model_cache"]
    assert {"lakescore.udfs.remote.client", "lakescore.udfs.remote.engine"} <= graph["lakescore.udfs.remote.head"]


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def test_no_import_back_up():
    arrows = sorted(
        f"{name} -> {target}"
        for name, targets in _graph().items()
        for prefix, refused in FORBIDDEN.items()
        if _within(name, prefix)
        for target in targets
        if any(_within(target, other) for other in refused)
    )
    assert arrows == []


def test_a_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
