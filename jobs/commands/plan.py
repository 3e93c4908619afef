"""``lakescore plan``: what a ``lakescore score`` run with the same settings will do and take, before it runs.

It checks the config and the input as ``score`` does (the same errors, before any compute), counts the input's rows,
reads a sample of them (:data:`SAMPLE_ROWS`, with ``limit``: never the whole table) and prepares it on the driver
with the runtime's own runner (:mod:`lakescore.udfs.runners`: the head's tokenizer, the image decoder, the prompt
template), so its token counts are the ones scoring sees. It predicts, for a run that scores every input row:

* rows, tokens (each row's cost as the batching core counts it: tokens; prompt plus new tokens for ``generate``;
  one per image or feature row), forward batches and padded tokens (:func:`~lakescore.udfs.batching.plan_batches`
  with the run's token budget);
* the scoring stage's seconds from the model's cost per padded token on this hardware: from the output's newest
  earlier run of the same model when it has one (its workers' forward seconds per row, and its time outside the
  forward), else from a short calibration forward on the driver, with the torch threads a scoring task gets;
* the run's fixed cost (its time outside the scoring stage: that earlier run's, else :data:`FIXED_SECONDS`, which
  on a local master this host's load per CPU stretches), the total for the session's executors, and the peak memory
  per worker (the driver's process while it scores the
  calibration batches: the model, the runtime and the largest batch, as in a worker);
* what the run will use and cost (:mod:`lakescore.jobs.cost`).

The prediction itself (:func:`predict`) is a pure function of the sample's shape and the per-token cost.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lakescore.jobs.config import JobConfig
from lakescore.jobs.cost import SessionResources, run_cost

__all__ = [
    "SAMPLE_ROWS",
    "FIXED_SECONDS",
    "STAGE_SECONDS_PER_CHUNK",
    "UnitCost",
    "SampleShape",
    "sample_shape",
    "predict",
    "history_cost",
    "host_load",
    "run_plan",
    "format_plan",
]

log = logging.getLogger(__name__)

SAMPLE_ROWS = 2000
"""Input rows ``lakescore plan`` reads and prepares unless told otherwise."""
CALIBRATION_SECONDS = 2.0
"""The calibration forward scores random slices of the sample until it has run this long (or scored
:data:`CALIBRATION_ROWS` rows)."""
CALIBRATION_ROWS = 512
CALIBRATION_SLICE = 64
MIN_HISTORY_ROWS = 100
"""An earlier run that scored fewer rows says too little about the per-row cost; calibrate instead."""
FIXED_SECONDS = {"local": 12.0, "cluster": 30.0}
"""A run's time outside its scoring stage (session start, id check, validation, publish) on this host's own masters
(``local[…]``, ``local-cluster[…]``) and elsewhere, until the output has an earlier run to measure it from
(BENCHMARKS.md's F200 measures the local figure)."""
STAGE_SECONDS_PER_CHUNK = {"local": 3.0, "cluster": 8.0}
"""The scoring stage's time per chunk besides the forward (tasks, Arrow transfer, the staging commit), likewise."""


@dataclass(frozen=True)
class SampleShape:
    """What the sample holds: ``rows`` read, ``costs`` of the rows to score (tokens as batching counts them),
    ``batches`` and ``padded`` tokens of the forward batches they make, and ``prepare_seconds`` it took to prepare.
    Recordings (``transcribe``) are scored as windows: ``costs`` are then the windows', ``recordings`` the rows to
    score and ``audio_seconds`` their length, read from the files' headers."""

    rows: int
    costs: np.ndarray
    batches: int
    padded: int
    prepare_seconds: float
    recordings: int | None = None
    audio_seconds: float | None = None

    @property
    def scored_rows(self) -> int:
        """The rows to score: the recordings, else one per cost."""
        return len(self.costs) if self.recordings is None else self.recordings


@dataclass(frozen=True)
class UnitCost:
    """The cost figures a prediction scales: forward seconds per padded token on one task's CPUs, the stage's seconds
    per chunk besides the forward, the run's time outside the stage, and where they came from."""

    seconds_per_token: float
    stage_seconds_per_chunk: float
    fixed_seconds: float
    source: str


def sample_shape(
    costs: Sequence[int] | np.ndarray,
    rows: int,
    policy,
    prepare_seconds: float = 0.0,
    recordings: int | None = None,
    audio_seconds: float | None = None,
) -> SampleShape:
    """The :class:`SampleShape` of a sample of ``rows`` rows whose rows to score cost ``costs``, batched by ``policy``
    (a :class:`~lakescore.udfs.batching.BatchPolicy`); for recordings, ``costs`` are their windows'."""
    from lakescore.udfs.batching import padded_cost, plan_batches

    costs = np.asarray(costs, dtype=np.int64)
    batches = plan_batches(costs, policy)
    return SampleShape(
        rows, costs, len(batches), padded_cost(costs, batches), prepare_seconds, recordings, audio_seconds
    )


def predict(
    shape: SampleShape,
    input_rows: int,
    unit: UnitCost,
    resources: SessionResources,
    chunks: int = 1,
    peak_memory_mib: float | None = None,
) -> dict[str, Any]:
    """The plan of scoring ``input_rows`` rows shaped like ``shape`` at ``unit``'s costs on ``resources``' slots, in
    ``chunks`` chunks: every figure of the sample scaled by ``input_rows / shape.rows``; the stage's seconds are
    its task-seconds (forward plus preparation) over the slots, plus ``unit.stage_seconds_per_chunk`` per chunk.

    >>> from lakescore.jobs.cost import SessionResources
    >>> shape = SampleShape(rows=100, costs=np.full(100, 10), batches=2, padded=1000, prepare_seconds=0.1)
    >>> p = predict(shape, 1000, UnitCost(0.001, 2.0, 10.0, "test"), SessionResources(2, 2, 1))
    >>> p["rows"], p["tokens"], p["forward_batches"], p["predicted_seconds"]
    (1000, 10000, 20, {'score_stage': 7.5, 'fixed': 10.0, 'total': 17.5})
    """
    scale = input_rows / shape.rows if shape.rows else 0.0
    scored_rows = round(shape.scored_rows * scale)
    forward = shape.padded * scale * unit.seconds_per_token  # task-seconds of forward
    prepare = shape.prepare_seconds * scale
    stage = chunks * unit.stage_seconds_per_chunk + (forward + prepare) / resources.slots
    seconds = {"score_stage": round(stage, 2), "fixed": round(unit.fixed_seconds, 2)}
    seconds["total"] = round(stage + unit.fixed_seconds, 2)
    return {
        "rows": input_rows,
        "rows_to_score": scored_rows,
        "tokens": round(float(shape.costs.sum()) * scale),
        "forward_batches": math.ceil(shape.batches * scale),
        "padded_tokens": round(shape.padded * scale),
        "chunks": chunks,
        "slots": resources.slots,
        "seconds_per_padded_token": unit.seconds_per_token,
        "cost_from": unit.source,
        "predicted_seconds": seconds,
        "peak_memory_mib": None if peak_memory_mib is None else round(peak_memory_mib),
        **(
            {"audio_seconds": round(shape.audio_seconds * scale, 1), "windows": round(len(shape.costs) * scale)}
            if shape.audio_seconds is not None
            else {}
        ),
    }


def history_cost(report: Mapping[str, Any], shape: SampleShape, slots: int) -> UnitCost | None:
    """The :class:`UnitCost` an earlier run's ``report`` (its JSON) measured, for rows shaped like ``shape`` (the
    output's earlier runs read the same table): its workers' forward seconds per row spread over the sample's padded
    tokens per row, its scoring stage's seconds per chunk besides that forward on ``slots`` slots, and its time
    outside the stage. ``None`` for a run that did not succeed or scored under :data:`MIN_HISTORY_ROWS` rows.

    >>> report = {"run_id": "r1", "status": "succeeded", "seconds": 30.0, "step_seconds": {"score_stage": 12.0},
    ...           "chunks": {"total": 1}, "workers": {"rows_scored": 1000, "model_seconds": 16.0}}
    >>> shape = SampleShape(rows=100, costs=np.full(100, 10), batches=2, padded=1000, prepare_seconds=0.0)
    >>> history_cost(report, shape, slots=2)
    UnitCost(seconds_per_token=0.0016, stage_seconds_per_chunk=4.0, fixed_seconds=18.0, source='history: run r1')
    """
    workers, steps = report.get("workers") or {}, report.get("step_seconds") or {}
    rows, forward, stage = workers.get("rows_scored") or 0, workers.get("model_seconds"), steps.get("score_stage")
    seconds = report.get("seconds")
    if (
        report.get("status") != "succeeded"
        or rows < MIN_HISTORY_ROWS
        or not forward
        or stage is None
        or seconds is None
    ):
        return None
    padded_per_row = shape.padded / max(1, shape.scored_rows)
    prepare = shape.prepare_seconds / max(1, shape.rows) * rows
    chunks = max(1, int((report.get("chunks") or {}).get("total") or 1))
    besides = max(0.0, stage - (forward + prepare) / max(1, slots)) / chunks
    return UnitCost(
        round(forward / rows / padded_per_row, 9),
        round(besides, 3),
        round(max(0.0, seconds - stage), 3),
        f"history: run {report.get('run_id')}",
    )


def run_plan(cfg: JobConfig, sample_rows: int = SAMPLE_ROWS, spark=None) -> dict[str, Any]:
    """Plan a ``lakescore score`` run of ``cfg`` (module docstring): the JSON-ready prediction.

    Raises what ``score`` raises before compute (:class:`~lakescore.jobs.config.ConfigError`, a bad input, a missing
    model), and ``ConfigError`` for ``sample_rows < 1`` or an input with no rows.
    """
    from lakescore.jobs.config import ConfigError
    from lakescore.jobs.cost import session_resources
    from lakescore.jobs.platform.spark.adapter import session_facts
    from lakescore.jobs.steps.read import open_input
    from lakescore.jobs.steps.staging import planned_chunks
    from lakescore.udfs.audio_runner import AudioRunner

    if sample_rows < 1:
        raise ConfigError(f"--sample-rows must be >= 1, got {sample_rows}")
    cfg.require_for_scoring()
    run = open_input(cfg, spark)
    if run.worker_start is not None:
        run.worker_start.cancel()  # nothing runs on the executors: the plan scores on the driver
    rows = run.source.count()
    if rows == 0:
        raise ConfigError(f"input {cfg.input!r} has no rows to plan for")
    resources = session_resources(run.spark, cfg, run.layout.profile is not None)
    where = "local" if (session_facts(run.spark).get("master") or "").startswith("local") else "cluster"
    table = _sample(run, sample_rows)
    model, runner, policy, device = _runner(run, cfg)
    started = time.perf_counter()
    prepared = None
    if isinstance(runner, AudioRunner):  # recordings are measured from their headers: none is decoded here
        audio = runner.sample(_one_batch(table))
        shape = sample_shape(
            audio.window_costs, table.num_rows, policy, time.perf_counter() - started, audio.recordings, audio.seconds
        )
    else:
        prepared = runner.prepare(_one_batch(table))
        shape = sample_shape(runner.row_costs(prepared), table.num_rows, policy, time.perf_counter() - started)
    if not len(shape.costs):
        raise ConfigError(f"the first {table.num_rows} rows of {cfg.input!r} hold nothing to score (all null)")
    with _task_threads(resources.task_cpus), _peak_memory(device) as memory:  # the peak memory comes from it either way
        calibrated = _calibrate(runner, table, policy)
    # The defaults describe a host with its CPUs to itself; a local run shares this host with whatever else runs on
    # it, so the host's load per CPU stretches them (the calibration, measured on this host now, has it already).
    load = host_load()
    stretch = max(1.0, load) if where == "local" else 1.0
    unit = _from_history(run, cfg, model.sha256, shape, resources.slots) or UnitCost(
        calibrated,
        STAGE_SECONDS_PER_CHUNK[where] * stretch,
        FIXED_SECONDS[where] * stretch,
        "calibration on the driver",
    )
    row_seconds = (shape.padded * unit.seconds_per_token + shape.prepare_seconds) / shape.rows  # task-seconds a row
    chunks = planned_chunks(rows, cfg.write.chunk_rows, cfg.write.chunk_seconds, row_seconds, resources.slots)
    plan = predict(shape, rows, unit, resources, chunks, memory.peak_mib)
    gpus = math.ceil(resources.slots * (resources.task_gpus or 1)) if device.startswith("cuda") else 0  # held at once
    plan["calibrated_seconds_per_padded_token"] = calibrated
    plan["host_load_per_cpu"] = round(load, 2)
    plan["cost"] = run_cost(
        seconds=plan["predicted_seconds"]["total"],
        stage_seconds=plan["predicted_seconds"]["score_stage"],
        worker_seconds=shape.padded * rows / shape.rows * unit.seconds_per_token,
        rows_scored=plan["rows_to_score"],
        resources=resources,
        gpus=gpus,
        price_per_core_hour=cfg.resources.price_per_core_hour,
        price_per_gpu_hour=cfg.resources.price_per_gpu_hour,
    )
    plan.update(sample_rows=table.num_rows, device=device, max_batch_tokens=policy.max_tokens, cores=resources.cores)
    from lakescore.udfs.chunking import PreparedDocuments

    if isinstance(prepared, PreparedDocuments):  # a chunked run (embed.chunk): the rows to score are documents
        plan["chunks_to_embed"] = plan["rows_to_score"]  # each costing its chunks
        plan["rows_to_score"] = round(len(np.unique(prepared.owner)) * rows / table.num_rows)
    if cfg.write.mode == "incremental":
        plan["note"] = "incremental: every row counted; a run scores only the new and changed ones"
    return plan


def format_plan(plan: Mapping[str, Any]) -> str:
    """The plan as a short table (rich), for a terminal."""
    import io

    from rich.console import Console
    from rich.table import Table

    from lakescore.jobs.cost import cost_text

    seconds = plan["predicted_seconds"]
    table = Table(title="lakescore plan", show_header=False, box=None)
    memory = plan.get("peak_memory_mib")
    rows = (
        [
            ("rows", f"{plan['rows']:,} ({plan['rows_to_score']:,} to score; {plan['sample_rows']:,} sampled)"),
        ]
        + (
            [("chunks", f"{plan['chunks_to_embed']:,} to embed (embed.chunk)")]
            if plan.get("chunks_to_embed") is not None
            else []
        )
        + (
            [("audio", f"{plan['audio_seconds']:,.1f} s in {plan['windows']:,} windows")]
            if plan.get("audio_seconds") is not None
            else []
        )
        + [
            (
                "tokens",
                f"{plan['tokens']:,} ({plan['padded_tokens']:,} padded, budget {plan['max_batch_tokens']:,} per batch)",
            ),
            ("forward batches", f"{plan['forward_batches']:,} in {plan['chunks']} chunk(s) on {plan['slots']} slot(s)"),
            ("scoring stage", f"{seconds['score_stage']:,.1f} s ({plan['cost_from']})"),
            ("fixed cost", f"{seconds['fixed']:,.1f} s"),
            ("total", f"{seconds['total']:,.1f} s"),
            ("peak memory per worker", f"{memory:,} MiB ({plan['device']})" if memory is not None else "-"),
            ("uses", cost_text(plan["cost"])),
        ]
        + ([("note", plan["note"])] if plan.get("note") else [])
    )
    for name, value in rows:
        table.add_row(name, value)
    out = io.StringIO()
    Console(file=out, width=120, no_color=True).print(table)
    return out.getvalue().rstrip()


def _sample(run, sample_rows: int):
    """The first ``sample_rows`` rows' model input as an Arrow table (``c0``, ``c1``, ...), then, for a runner keyed by
    the row, its key as the job passes it (:func:`~lakescore.jobs.steps.ids.row_key`: a composite id's JSON)."""
    from lakescore.jobs.platform.tables import column
    from lakescore.jobs.steps.ids import row_key

    columns = [column(c) for c in run.input_cols]
    if run.cfg.input_kind.row_keys:
        columns.append(row_key(run.cfg.id_cols))
    return run.source.select(*[c.alias(f"c{i}") for i, c in enumerate(columns)]).limit(sample_rows).toArrow()


def _runner(run, cfg: JobConfig):
    """The model loaded in this process as a worker loads it, its runner for the sample's columns, the batch policy a
    scoring task uses, and the device it resolved."""
    from lakescore.udfs.scoring_udf import batch_policy, model_for_this_worker

    model, resolved, _ = model_for_this_worker(run.spec)
    kind = cfg.input_kind
    options = {name: getattr(cfg.scoring, name) for name in kind.runner_settings}
    columns = tuple(f"c{i}" for i in range(len(run.input_cols)))
    if kind.row_keys:  # the key follows the input columns in the sample (_sample)
        options["key_col"] = f"c{len(run.input_cols)}"
    runner = kind.runner(model.scorer, columns, **options)
    return (
        model,
        runner,
        batch_policy(model, resolved.device, cfg.scoring.max_batch_tokens, cfg.scoring.max_batch_rows),
        resolved.device,
    )


def _from_history(run, cfg: JobConfig, sha256: str, shape: SampleShape, slots: int) -> UnitCost | None:
    """The :class:`UnitCost` of the output's newest earlier run of this model and task that measured one, or
    ``None``."""
    from lakescore.jobs.commands.history import run_history
    from lakescore.jobs.platform.tables import TableError

    try:
        records = run_history(run.spark, cfg.output_ref(), cfg.errors_ref(), 20)
    except TableError:  # no output yet
        return None
    for record in records:
        report = record.report or {}
        if report.get("model_sha256") == sha256 and report.get("task") == cfg.task:
            unit = history_cost(report, shape, slots)
            if unit is not None:
                return unit
    return None


def _calibrate(runner, table, policy) -> float:
    """Forward seconds per padded token: random slices of the sample through ``runner`` (after a warm-up slice) until
    :data:`CALIBRATION_SECONDS` or :data:`CALIBRATION_ROWS` rows."""
    from lakescore.udfs.batching import AdaptiveBudget, padded_cost, plan_batches

    rng = np.random.default_rng(7)
    order = rng.permutation(table.num_rows)
    runner.score(runner.prepare(_one_batch(table.take(order[:8]))), AdaptiveBudget(policy))
    seconds, padded, done = 0.0, 0, 0
    while done < min(CALIBRATION_ROWS, table.num_rows) and seconds < CALIBRATION_SECONDS:
        rows = (
            order[done : done + CALIBRATION_SLICE]
            if done + CALIBRATION_SLICE <= table.num_rows
            else order[-CALIBRATION_SLICE:]
        )
        prepared = runner.prepare(_one_batch(table.take(rows)))
        costs = runner.row_costs(prepared)
        started = time.perf_counter()
        runner.score(prepared, AdaptiveBudget(policy))
        seconds += time.perf_counter() - started
        padded += padded_cost(costs, plan_batches(costs, policy))
        done += len(rows)
    return seconds / max(1, padded)


def host_load() -> float:
    """This host's load per CPU: runnable threads over the last minute (the 1-minute load average) per CPU; 0 where
    the platform has no load average."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return 0.0


def _one_batch(table):
    """``table`` (at least one row) as one Arrow record batch, as a scoring task receives its rows."""
    return table.combine_chunks().to_batches()[0]


class _task_threads:
    """Torch (when loaded) runs with ``threads`` threads in the block, as a scoring task does; restored after."""

    def __init__(self, threads: int) -> None:
        self._threads = threads

    def __enter__(self) -> _task_threads:
        self._torch = sys.modules.get("torch")
        if self._torch is not None:
            self._previous = self._torch.get_num_threads()
            self._torch.set_num_threads(self._threads)
        return self

    def __exit__(self, *exc) -> None:
        if self._torch is not None:
            self._torch.set_num_threads(self._previous)


def _peak_memory(device: str):
    from lakescore.jobs.commands.sweep import PeakMemory

    return PeakMemory(device.split(":")[0])
