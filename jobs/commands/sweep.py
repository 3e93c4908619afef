"""``lakescore sweep``: find the token budget that scores *your* rows fastest on *this* hardware.

Runs the real model on a sample of the real input, on the driver, once per
token budget (ascending), with the thread count a Spark task would get, and
reports rows/s and peak memory per setting. It stops at the first
out-of-memory and recommends the fastest setting (a smaller budget wins ties
within 3%, since it needs less memory).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import cast

from lakescore.jobs.config import ConfigError, JobConfig

__all__ = ["SweepPoint", "run_sweep", "recommend", "format_sweep", "sweep_report", "DEFAULT_BUDGETS", "PeakMemory"]

log = logging.getLogger(__name__)

SAMPLE_ROWS = 1000
"""Rows the sweep samples unless told otherwise."""

DEFAULT_BUDGETS = {
    "cpu": (512, 1024, 2048, 4096, 8192, 16384, 32768),
    "cuda": (8192, 16384, 32768, 65536, 131072, 262144, 524288),
}


@dataclass(frozen=True)
class SweepPoint:
    """One setting's outcome; ``error`` is set (and figures are None) when it ran out of memory."""

    max_batch_tokens: int
    max_batch_rows: int
    rows: int
    rows_per_second: float | None
    peak_memory_mib: float | None
    error: str | None = None


def recommend(points: Sequence[SweepPoint], tie: float = 0.03) -> SweepPoint | None:
    """The fastest point that ran; the smallest budget within ``tie`` of the fastest."""
    ran = [(p, rate) for p in points if (rate := p.rows_per_second)]
    if not ran:
        return None
    best = max(rate for _, rate in ran)
    return min((p for p, rate in ran if rate >= (1 - tie) * best), key=lambda p: p.max_batch_tokens)


def format_sweep(points: Sequence[SweepPoint]) -> str:
    """A plain-text table of the sweep, with the recommendation at the end."""
    lines = [f"{'max_batch_tokens':>16} {'max_batch_rows':>14} {'rows/s':>9} {'peak MiB':>9}"]
    for p in points:
        if p.error:
            lines.append(f"{p.max_batch_tokens:>16} {p.max_batch_rows:>14}  stopped: {p.error}")
        else:
            lines.append(
                f"{p.max_batch_tokens:>16} {p.max_batch_rows:>14} {p.rows_per_second:>9.1f} {p.peak_memory_mib:>9.0f}"
            )
    chosen = recommend(points)
    if chosen is not None:
        lines.append(f"recommended: --set scoring.max_batch_tokens={chosen.max_batch_tokens}")
    return "\n".join(lines)


def run_sweep(
    cfg: JobConfig, sample_rows: int = SAMPLE_ROWS, budgets: Sequence[int] | None = None, spark=None
) -> list[SweepPoint]:
    """Sweep ``budgets`` over ``sample_rows`` rows of ``cfg.input``'s ``cfg.text_col``."""
    from lakescore.jobs.platform.spark.session import get_or_create_session
    from lakescore.jobs.platform.tables import read_input
    from lakescore.jobs.steps.read import model_spec
    from lakescore.udfs.batching import BatchPolicy, TextHead, is_out_of_memory, score_texts
    from lakescore.udfs.models.model_cache import get_model

    options = cfg.task_options()
    if options is not None and options.remote:  # before the missing settings: an endpoint run names no model files
        raise ConfigError(
            "sweep tunes the token budget of a model loaded here; with an endpoint or a served engine the "
            "server batches the requests itself, so there is nothing to sweep"
        )
    missing = [
        k for k, v in (("input", cfg.input), ("model.source", cfg.model.source), ("text_col", cfg.text_col)) if not v
    ]
    if missing:
        raise ConfigError("missing required setting(s) for sweep: " + ", ".join(missing))
    if sample_rows < 1:
        raise ConfigError(f"--sample-rows must be >= 1, got {sample_rows}")
    device = cfg.model.device.split(":")[0]
    budgets = sorted(budgets or DEFAULT_BUDGETS.get(device, DEFAULT_BUDGETS["cpu"]))

    spec = model_spec(cfg)
    model, _ = get_model(spec)
    head = cast(TextHead, model.scorer)  # sweep runs text tasks in process: the batching core's head
    if spark is None:
        spark, _ = get_or_create_session(cfg.spark, (cfg.input,))
    text_col = cfg.text_col
    assert text_col is not None  # checked with the other missing settings above
    texts = _sample_texts(read_input(spark, cfg.input_ref(), cfg.input_format), text_col, sample_rows)
    if not texts:
        raise ConfigError(f"input {cfg.input!r} has no non-null {cfg.text_col!r} values to sweep over")
    threads = int(spark.conf.get("spark.task.cpus", "1"))
    import torch

    torch.set_num_threads(threads)
    log.info("sweeping %d budgets over %d sampled rows with %d torch thread(s)", len(budgets), len(texts), threads)

    score_texts(texts[:32], head, BatchPolicy(budgets[0], cfg.scoring.max_batch_rows))  # warm-up
    points = []
    for budget in budgets:
        policy = BatchPolicy(budget, cfg.scoring.max_batch_rows)
        try:
            with PeakMemory(device) as memory:
                started = time.perf_counter()
                score_texts(texts, head, policy)
                seconds = time.perf_counter() - started
        except Exception as exc:  # an OOM ends the sweep; anything else is a real failure
            if not is_out_of_memory(exc):
                raise
            points.append(SweepPoint(budget, policy.max_rows, len(texts), None, None, error="out of memory"))
            break
        points.append(
            SweepPoint(budget, policy.max_rows, len(texts), round(len(texts) / seconds, 2), round(memory.peak_mib, 1))
        )
        log.info("max_batch_tokens=%d: %.1f rows/s, peak %.0f MiB", budget, points[-1].rows_per_second, memory.peak_mib)
    return points


def _sample_texts(df, text_col: str, rows: int) -> list[str]:
    from lakescore.jobs.platform.tables import column

    text = column(text_col)
    present = df.select(text.alias("text")).where(text.isNotNull())
    total = present.count()
    if total > rows:
        present = present.sample(fraction=min(1.0, 1.5 * rows / total), seed=7)
    return [r["text"] for r in present.limit(rows).collect()]


class PeakMemory:
    """Peak memory during a block: CUDA allocator peak on GPU, else this process's RSS (sampled)."""

    def __init__(self, device: str) -> None:
        self._device = device
        self.peak_mib = 0.0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        if self._device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        else:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._device == "cuda":
            import torch

            self.peak_mib = torch.cuda.max_memory_allocated() / 2**20
        else:
            self._stop.set()
            self._thread.join()

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while True:
            with open("/proc/self/statm") as statm:
                rss = int(statm.read().split()[1]) * page / 2**20
            self.peak_mib = max(self.peak_mib, rss)
            if self._stop.wait(0.02):
                return


def sweep_report(points: Sequence[SweepPoint]) -> dict:
    """The sweep as JSON-ready data."""
    chosen = recommend(points)
    return {
        "points": [asdict(p) for p in points],
        "recommended_max_batch_tokens": chosen.max_batch_tokens if chosen else None,
    }
