"""W3: incremental scoring and deduplication, as a nightly job sees them (issue 12's targets).

A 60,000-row review table in which about a fifth of the rows share their text with another row
(:data:`bench.data.W3_STOCK_SHARE` stock one-liners) is scored four ways, each one whole
``lakescore score`` process (:func:`bench.suite.peer_command`, peer (d), plus flags):

1. ``full``: the first nightly run, ``--write-mode incremental`` into a fresh output (a full run that
   writes the digest columns), ``scoring.dedup`` at its default ``auto``;
2. ``full-nodedup``: the same with ``--set scoring.dedup=off``, into another fresh output;
3. ``incremental``: the next night: the table after 1% of rows were edited, 0.5% added and 0.5%
   deleted (:func:`bench.data.changed_table`), scored with ``--write-mode incremental --delete-missing``
   into a copy of (1)'s output and errors table, as a nightly run finds them (a fresh copy for every repeat);
4. ``rescore``: the same changed table scored in full into a fresh output with the default settings:
   what the night costs without incremental mode.

The targets (printed with met / NOT met, never enforced): incremental >= 8x faster than the rescore,
end to end; the incremental output equals the rescore's (same ids, per-id cosine >= 0.9999, one and
the same ``model_sha256``); the dedup run makes as many forward passes as there are distinct texts,
and runs faster than ``dedup: off`` by at least 80% of the share of tokens in repeated texts (issue 38: a forward
pass costs by its tokens, and repeated texts are mostly short one-liners, so the share of rows overstates it).
"""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from bench import data
from bench.delta_export import read_delta
from bench.equivalence import delta_files, min_cosine
from bench.fast_path import verdict
from bench.model import model_dir
from bench.proctree import Measurement, run_measured
from bench.suite import PEERS, peer_command

__all__ = [
    "W3",
    "W3_ROWS",
    "CHANGES",
    "W3Result",
    "make_w3_data",
    "run_w3",
    "w3_lines",
    "token_counts",
    "repeated_share",
]

W3 = "W3"
W3_ROWS = 60_000
W3_SEED = 20261124
CHANGES = {"edit": 0.01, "insert": 0.005, "delete": 0.005}
SPEEDUP_TARGET = 8.0
COSINE_TARGET = 0.9999
DEDUP_SHARE_OF_REPETITION = 0.8

_LAKESCORE = next(peer for peer in PEERS if peer.key == "d")


@dataclass
class W3Result:
    """Every W3 run (name -> measurements and reports, in run order) and the comparisons made after them."""

    rows: int
    changed_rows: int
    changes: dict[str, int]
    distinct_texts: int
    repetition: str
    repeated_token_share: float
    """Tokens (as the model sees them) in rows whose text an earlier row already had, over all tokens: what dedup can
    save of the model's work."""
    runs: dict[str, list[tuple[Measurement, dict | None]]] = field(default_factory=dict)
    equivalence: dict | None = None

    def walls(self, name: str) -> list[float]:
        return [m.wall_seconds for m, _ in self.runs.get(name, []) if m.returncode == 0]

    def median_wall(self, name: str) -> float | None:
        walls = self.walls(name)
        return statistics.median(walls) if walls else None

    def report(self, name: str) -> dict | None:
        return next((r for m, r in self.runs.get(name, []) if m.returncode == 0 and r), None)

    @property
    def ok(self) -> bool:
        return all(m.returncode == 0 for runs in self.runs.values() for m, _ in runs)


def make_w3_data(data_dir: Path, rows: int = W3_ROWS) -> tuple[Path, Path, dict[str, int], list[str]]:
    """Write W3 and its changed version; return their paths, the change counts and W3's texts."""
    first, changed = data_dir / "w3", data_dir / "w3_changed"
    bodies = list(data.review_bodies(rows, seed=W3_SEED, stock_share=data.W3_STOCK_SHARE))
    data.write_table(iter(bodies), first)
    counts = data.changed_table(first, changed, **CHANGES)
    return first, changed, counts, bodies


def run_w3(
    data_dir: Path, runs_dir: Path, env: dict[str, str], repo: Path, repeats: int, rows: int = W3_ROWS
) -> W3Result:
    """Run W3's four kinds of run (the incremental one ``repeats`` times), print a line per run, compare outputs."""
    first, changed, counts, bodies = make_w3_data(data_dir, rows)
    result = W3Result(
        rows=rows,
        changed_rows=sum(pq.read_metadata(str(f)).num_rows for f in changed.glob("*.parquet")),
        changes=counts,
        distinct_texts=len(set(bodies)),
        repetition=data.repetition(bodies),
        repeated_token_share=repeated_share(bodies, token_counts(bodies, model_dir())),
    )
    print(f"W3: {rows:,} rows ({result.repetition}); next night: {counts}", flush=True)
    incremental = ("--write-mode", "incremental")
    plan = [
        ("full", first, incremental, None),
        ("full-nodedup", first, (*incremental, "--set", "scoring.dedup=off"), None),
    ]
    plan += [("incremental", changed, (*incremental, "--delete-missing"), "full")] * repeats
    plan += [("rescore", changed, (), None)]
    for name, source, flags, seed_from in plan:
        run_dir = runs_dir / f"{W3}-{name}-{len(result.runs.get(name, [])) + 1}"
        run_dir.mkdir(parents=True)
        if seed_from is not None:
            base = runs_dir / f"{W3}-{seed_from}-1"
            if not (base / "delta").is_dir():
                print(f"[{W3} {name}] skipped: the {seed_from} run left no output", flush=True)
                continue
            for table in ("delta", "delta_errors"):  # the output and its errors table, as a nightly run finds them
                if (base / table).is_dir():
                    shutil.copytree(base / table, run_dir / table)
        measured = run_measured(
            [*peer_command(_LAKESCORE, source, run_dir), *flags], env=env, cwd=repo, log_path=run_dir / "process.log"
        )
        report_path = run_dir / "report.json"
        report = json.loads(report_path.read_text()) if report_path.is_file() else None
        result.runs.setdefault(name, []).append((measured, report))
        print(
            f"[{W3} {name}] {measured.wall_seconds:.1f} s, peak RSS {measured.peak_rss_bytes / 2**20:.0f} MiB: "
            f"{'ok' if measured.returncode == 0 else f'FAILED (exit {measured.returncode})'}",
            flush=True,
        )
    incremental_out, rescore_out = runs_dir / f"{W3}-incremental-1" / "delta", runs_dir / f"{W3}-rescore-1" / "delta"
    if result.report("incremental") and result.report("rescore"):
        try:
            result.equivalence = compare_outputs(incremental_out, rescore_out)
        except (OSError, ValueError) as exc:
            print(f"W3 equivalence check failed: {exc}", flush=True)
    return result


def token_counts(bodies: list[str], model: Path) -> dict[str, int]:
    """Tokens per distinct text as the model at ``model`` sees them: its fast tokenizer (``tokenizer.json``), special
    tokens included, cut at its ``max_seq_length`` (sentence-transformers' config, which is what it runs with; the
    file's own truncation can differ)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.no_padding()
    config = model / "sentence_bert_config.json"
    limit = json.loads(config.read_text()).get("max_seq_length") if config.is_file() else None
    if limit:
        tokenizer.enable_truncation(int(limit))
    else:
        tokenizer.no_truncation()
    distinct = list(dict.fromkeys(bodies))
    return {text: len(encoded.ids) for text, encoded in zip(distinct, tokenizer.encode_batch(distinct))}


def repeated_share(bodies: list[str], tokens: dict[str, int]) -> float:
    """Tokens in rows whose text an earlier row already had, over all rows' tokens (``tokens``: per text)."""
    seen: set[str] = set()
    repeated = total = 0
    for text in bodies:
        total += tokens[text]
        if text in seen:
            repeated += tokens[text]
        seen.add(text)
    return repeated / max(1, total)


def _read_output(table: Path) -> pd.DataFrame:
    """The output's ids, vectors and weights digests: from the Delta log alone where it can say which rows are live,
    else (the incremental output: deletion vectors) through Delta in a Spark process."""
    columns = ["review_id", "embedding", "model_sha256"]
    try:
        return pq.read_table(delta_files(table), columns=columns).to_pandas()
    except ValueError:
        return read_delta(table, columns)


def compare_outputs(incremental: Path, rescore: Path) -> dict:
    """Per-id cosine of the incremental output (a) to the rescore's (b); ids missing either side; weights digests."""
    a, b = _read_output(incremental), _read_output(rescore)
    found = min_cosine(
        a["review_id"].to_numpy(),
        np.stack(a["embedding"].to_numpy()),
        b["review_id"].to_numpy(),
        np.stack(b["embedding"].to_numpy()),
    )
    found["model_sha256"] = sorted(set(a["model_sha256"]) | set(b["model_sha256"]))
    return found


def w3_lines(result: W3Result) -> list[str]:
    """The W3 figures and every issue-12 target with met / NOT met."""
    lines = [
        f"W3 data: {result.rows:,} reviews, {result.repetition}; the next night's table: {result.changed_rows:,} "
        f"rows ({result.changes['edited']:,} edited, {result.changes['inserted']:,} new, "
        f"{result.changes['deleted']:,} deleted)"
    ]
    for name in ("full", "full-nodedup", "incremental", "rescore"):
        walls = result.walls(name)
        failed = len(result.runs.get(name, [])) - len(walls)
        if walls:
            peak = max(m.peak_rss_bytes for m, _ in result.runs[name]) / 2**20
            lines.append(
                f"W3 {name}: median {statistics.median(walls):.1f} s over {len(walls)} run(s) "
                f"(min {min(walls):.1f}, max {max(walls):.1f}), peak RSS {peak:.0f} MiB"
                + (f"; {failed} FAILED" if failed else "")
            )
        elif failed:
            lines.append(f"W3 {name}: FAILED")
    incremental, rescore = result.median_wall("incremental"), result.median_wall("rescore")
    report = result.report("incremental")
    if report:
        lines.append(
            f"W3 incremental run's report: {report.get('rows_kept')} kept, {report.get('rows_scored')} scored, "
            f"{report.get('rows_missing')} missing, {report.get('rows_deleted')} deleted, "
            f"{report.get('error_rows')} errors; step seconds "
            + ", ".join(f"{k} {v:.1f}" for k, v in (report.get("step_seconds") or {}).items())
        )
    if incremental and rescore:
        ratio = rescore / incremental
        lines.append(
            f"W3 incremental vs full rescore of the changed table: {ratio:.2f}x faster end to end   "
            f"target >= {SPEEDUP_TARGET:g}: {verdict(ratio >= SPEEDUP_TARGET)}"
        )
    eq = result.equivalence
    if eq:
        same = eq["missing_in_a"] == 0 and eq["missing_in_b"] == 0 and len(eq["model_sha256"]) == 1
        cosine = eq["min_cosine"]
        lines.append(
            f"W3 incremental output vs rescore: {eq['matched']:,} ids matched, {eq['missing_in_a']} missing, "
            f"{eq['missing_in_b']} extra, model_sha256 "
            f"{'one and the same' if len(eq['model_sha256']) == 1 else eq['model_sha256']}, "
            f"min per-id cosine {cosine:.7f}   target >= {COSINE_TARGET} and nothing missing or extra: "
            f"{verdict(same and cosine is not None and cosine >= COSINE_TARGET)}"
        )
    full = result.report("full")
    if full and full.get("dedup"):
        dedup = full["dedup"]
        saved = dedup.get("forward_passes_saved") or 0
        passes = (full.get("rows_scored") or 0) - saved
        lines.append(
            f"W3 full run, dedup {dedup.get('mode')}: used={dedup.get('used')} (sample {dedup.get('sample_rows')} "
            f"rows, {dedup.get('sample_distinct')} distinct); forward passes {passes:,} for "
            f"{result.distinct_texts:,} distinct texts ({saved:,} saved)   target = distinct texts: "
            f"{verdict(passes == result.distinct_texts)}"
        )
    on, off = result.median_wall("full"), result.median_wall("full-nodedup")
    if on and off:
        share = 1 - result.distinct_texts / result.rows
        tokens = result.repeated_token_share
        lines.append(
            f"W3 what dedup can save: {share:.1%} of forward passes, but only {tokens:.1%} of the tokens (the "
            "model's tokenizer, cut where the model cuts: repeated texts are mostly short one-liners, and a "
            "forward pass costs by its tokens)"
        )
        gain = 1 - on / off
        lines.append(
            f"W3 dedup on vs off, end to end: {gain:.1%} less wall time; share of tokens in repeated texts "
            f"{tokens:.1%}   target >= {DEDUP_SHARE_OF_REPETITION:.0%} of it "
            f"({DEDUP_SHARE_OF_REPETITION * tokens:.1%}): {verdict(gain >= DEDUP_SHARE_OF_REPETITION * tokens)}"
        )
    scans = [r.get("input_scans") for _, r in result.runs.get("full", []) + result.runs.get("incremental", []) if r]
    if scans:
        lines.append(
            f"W3 input scans per run (report's input_scans, full and incremental runs): {sorted(set(scans))}   "
            f"target 1: {verdict(all(s == 1 for s in scans))}"
        )
    return lines
