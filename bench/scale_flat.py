"""W3T: an incremental run's time is flat in the table's size (issue 38): the same 0.1% change scored incrementally
on a tabular input of ``W3T_ROWS`` rows (default 1,000,000) and of :data:`SMALL_ROWS` rows; the large run's median
time over the small's, target <= :data:`FLAT_TARGET`.

The model is a seeded 4-feature MLP (TorchScript), so the runs measure what incremental mode adds to a run (reading
the input, finding the changed rows by digest, the ``MERGE``), not the model. Per size, one whole ``lakescore score``
process each: a full run with ``--write-mode incremental`` into a fresh output; then the changed table (:data:`CHANGES`
of the rows edited, added and deleted: 0.1% in all) with ``--write-mode incremental --delete-missing`` into a fresh
copy of that output and its errors table, as a nightly run finds them, ``repeats`` times, small and large alternating.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench import data
from bench.alternating import PeerRun, PeerRuns, run_alternately
from bench.fast_path import verdict

__all__ = [
    "W3T",
    "W3T_ROWS",
    "SMALL_ROWS",
    "CHANGES",
    "FLAT_TARGET",
    "W3TResult",
    "tabular_tables",
    "run_w3t",
    "w3t_lines",
]

W3T = "W3T"
W3T_ROWS = 1_000_000
SMALL_ROWS = 10_000
"""The small table's rows (or ``W3T_ROWS`` when fewer)."""
FLAT_TARGET = 1.3
CHANGES = {"edit": 0.0005, "insert": 0.00025, "delete": 0.00025}
FEATURES = ("feature_a", "feature_b", "feature_c", "feature_d")
_SEED = 20261201


@dataclass
class W3TResult(PeerRuns):
    """W3T's incremental runs by size (``small``, ``large``; ``self.runs``), its full runs, and the tables' shapes."""

    rows: dict[str, int]
    changes: dict[str, dict[str, int]]
    full: dict[str, list[PeerRun]] = field(default_factory=dict)
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return super().ok and all(r.ok for runs in self.full.values() for r in runs)


def _write(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as a directory of :data:`bench.data.FILES` Parquet files of contiguous rows, like every bench table."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for part, rows in enumerate(np.array_split(np.arange(len(frame)), max(1, min(data.FILES, len(frame))))):
        frame.iloc[rows].to_parquet(path / f"part-{part:05d}.parquet", index=False)


def _features(rng: np.random.Generator, ids: np.ndarray) -> pd.DataFrame:
    frame = pd.DataFrame(rng.normal(size=(len(ids), len(FEATURES))), columns=list(FEATURES))
    frame.insert(0, "account_id", ids.astype("int64"))
    return frame


def tabular_tables(rows: int, first: Path, changed: Path, seed: int = _SEED) -> dict[str, int]:
    """Write a seeded table of ``rows`` accounts (``account_id``, four float features) to ``first`` and the next
    night's to ``changed``: :data:`CHANGES` of its rows edited (new features), deleted, and added (new ids after the
    largest), at least one of each. Returns the counts of each change."""
    rng = np.random.default_rng(seed)
    frame = _features(rng, np.arange(1, rows + 1))
    _write(frame, first)
    edits, deletes, inserts = (max(1, round(CHANGES[k] * rows)) for k in ("edit", "delete", "insert"))
    picked = rng.permutation(rows)
    edited, deleted = picked[:edits], picked[edits : edits + deletes]
    night = frame.copy()
    night.loc[edited, list(FEATURES)] = rng.normal(size=(len(edited), len(FEATURES)))
    night = night.drop(index=deleted)
    night = pd.concat([night, _features(rng, np.arange(rows + 1, rows + 1 + inserts))], ignore_index=True)
    _write(night, changed)
    return {"edited": len(edited), "inserted": inserts, "deleted": len(deleted)}


def _model(path: Path) -> Path:
    """A seeded 4 -> 8 -> 3 MLP saved as TorchScript at ``path``."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(len(FEATURES), 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(path))
    return path


def _command(source: Path, model: Path, run_dir: Path, *flags: str) -> list[str]:
    return [
        str(Path(sys.prefix) / "bin" / "lakescore"),
        "score",
        "--input",
        str(source),
        "--output",
        str(run_dir / "delta"),
        "--task",
        "tabular",
        "--model",
        str(model),
        "--id-col",
        "account_id",
        "--feature-prefix",
        "feature_",
        "--report",
        str(run_dir / "report.json"),
        # a fresh warehouse and Derby metastore per run: embedded Derby is single-process
        "--set",
        f"spark.warehouse_dir={run_dir / 'warehouse'}",
        "--set",
        f"spark.metastore_dir={run_dir / 'metastore_db'}",
        "--write-mode",
        "incremental",
        *flags,
    ]


def _nightly(source: Path, model: Path, full_run: Path) -> Callable[[Path], list[str]]:
    """The incremental run's command for a run directory, after copying ``full_run``'s output and errors table there
    (a fresh copy for every repeat, so each run finds the output as the night before left it)."""

    def command(run_dir: Path) -> list[str]:
        for table in ("delta", "delta_errors"):
            if (full_run / table).is_dir():
                shutil.copytree(full_run / table, run_dir / table)
        return _command(source, model, run_dir, "--delete-missing")

    return command


def run_w3t(
    data_dir: Path, runs_dir: Path, env: dict[str, str], repo: Path, repeats: int, rows: int = W3T_ROWS
) -> W3TResult:
    """W3T's full run per size, then its incremental runs, ``repeats`` rounds of small and large; a line per run."""
    sizes = {"small": min(SMALL_ROWS, rows), "large": rows}
    model = _model(data_dir / "w3t" / "model.pt")
    tables = {size: (data_dir / "w3t" / size, data_dir / "w3t" / f"{size}_changed") for size in sizes}
    result = W3TResult(rows=sizes, changes={size: tabular_tables(n, *tables[size]) for size, n in sizes.items()})
    print(f"{W3T}: tabular {sizes['small']:,} and {sizes['large']:,} rows; next night: {result.changes}", flush=True)

    def rate(report: dict) -> float:
        return report["input_rows"] / report["seconds"]

    said = lambda size, r: f"{r:,.0f} input rows/s"  # noqa: E731
    result.full = run_alternately(
        f"{W3T}-full",
        {s: (lambda d, s=s: _command(tables[s][0], model, d)) for s in sizes},
        dict.fromkeys(sizes, "report.json"),
        rate,
        said,
        runs_dir,
        env,
        {},
        repo,
        1,
    )
    seeded = {s: _nightly(tables[s][1], model, runs_dir / f"{W3T}-full-{s}-1") for s in sizes if result.full[s][0].ok}
    result.runs = run_alternately(
        f"{W3T}-incremental", seeded, dict.fromkeys(seeded, "report.json"), rate, said, runs_dir, env, {}, repo, repeats
    )
    return result


def w3t_lines(result: W3TResult) -> list[str]:
    """W3T's tables, each size's incremental runs, and the large over small ratio with its target."""
    lines = [
        f"{W3T} data: tabular accounts (four float features, a seeded MLP), {result.rows['small']:,} and "
        f"{result.rows['large']:,} rows; the next night's changes: "
        + "; ".join(f"{size} {counts}" for size, counts in result.changes.items())
    ]
    for size in ("small", "large"):
        full = [r for r in result.full.get(size, []) if r.ok]
        line = result.peer_line(f"{W3T} incremental", size, "input rows/s", 0)
        if line:
            lines.append(
                line + (f"; its full run {full[0].measured.wall_seconds:.1f} s" if full else "; its full run FAILED")
            )
    small, large = result.median("small", "wall"), result.median("large", "wall")
    if small and large:
        ratio = large / small
        lines.append(
            f"{W3T} incremental run, {result.rows['large']:,} rows over {result.rows['small']:,} (0.1% changed): "
            f"{large:.1f} s / {small:.1f} s = {ratio:.2f}x   target <= {FLAT_TARGET:g}x: "
            f"{verdict(ratio <= FLAT_TARGET)}"
        )
    return lines
