"""What a run used and what it cost: core-seconds and GPU-seconds of its scoring stage and of the whole run.

The definitions, in one place (the report's ``cost``, the summary line, the HTML page, ``lakescore history`` and
``lakescore plan`` all use them):

* **cores of the session**: the executors' cores (Spark's default parallelism) plus the driver's
  (``spark.driver.cores``, 1 unless set); a ``local[…]`` master runs the driver and its executor in one process on the
  same cores, which count once. **GPUs of the session**: the GPUs the executors' preflight loaded the model on.
* **whole run**: the run's wall seconds times the session's cores (and GPUs): what the run held, busy or not.
* **scoring stage**: the stage's wall seconds times the cores its tasks held (the scoring slots times the CPUs per
  task) and the session's GPUs: what the stage held, busy or not, as for the whole run.
* **model**: the workers' seconds in the model's forward passes (every batch of every task, summed) times the CPUs,
  and the GPUs when the model ran on one, that each scoring task holds: the part of the stage the model kept busy.
* **rows per core-second**: rows scored over the whole run's core-seconds.
* **cost**, when ``resources.price_per_core_hour`` or ``price_per_gpu_hour`` is set: the whole run's core-hours and
  GPU-hours at those prices (an unset price counts as zero), and that per million rows scored; with
  ``generate.endpoint.price``, plus the endpoint's price of the tokens its responses' ``usage`` reported
  (**token cost**).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SessionResources", "session_cores", "session_resources", "run_cost", "cost_text"]


@dataclass(frozen=True)
class SessionResources:
    """The session's cores (driver + executors), its scoring slots and what each scoring task holds."""

    cores: int
    executor_cores: int
    task_cpus: int
    task_gpus: float = 0.0

    @property
    def slots(self) -> int:
        """Scoring tasks that run at once: the executors' cores over the CPUs per task (at least one)."""
        return max(1, self.executor_cores // max(1, self.task_cpus))

    @property
    def stage_cores(self) -> int:
        """The cores the scoring stage's tasks hold at once: its slots times the CPUs per task."""
        return self.slots * max(1, self.task_cpus)


def session_cores(master: str | None, executor_cores: int, driver_cores: int = 1) -> int:
    """The session's cores: ``executor_cores`` plus ``driver_cores``, except on a ``local[…]`` master, whose driver
    shares its executor's cores.

    >>> session_cores("local[2]", 2), session_cores("local-cluster[2,1,1024]", 2), session_cores("yarn", 16, 4)
    (2, 3, 20)
    """
    local = (master or "").startswith("local[") or master == "local"
    return max(1, executor_cores) if local else max(1, executor_cores) + max(0, driver_cores)


def session_resources(spark, cfg, profiled: bool) -> SessionResources:
    """:class:`SessionResources` of ``spark`` for the run ``cfg`` describes; ``profiled``: the scoring stage runs on
    ``resources.scoring``'s profile (its ``task_cpus`` / ``task_gpus``), else on the session's task settings."""
    from lakescore.jobs.platform.spark.adapter import default_parallelism, session_facts

    def conf_number(key: str, default: float) -> float:
        try:
            return float(spark.conf.get(key, None) or default)
        except Exception:  # a platform that hides the key (serverless), or no number: the default
            return default

    executors = default_parallelism(spark)
    scoring = cfg.resources.scoring
    task_cpus = (scoring.task_cpus if profiled else None) or int(conf_number("spark.task.cpus", 1))
    task_gpus = (scoring.task_gpus if profiled else None) or conf_number("spark.task.resource.gpu.amount", 0)
    cores = session_cores(session_facts(spark).get("master"), executors, int(conf_number("spark.driver.cores", 1)))
    return SessionResources(cores, executors, task_cpus, float(task_gpus))


def run_cost(
    *,
    seconds: float,
    stage_seconds: float,
    worker_seconds: float,
    rows_scored: int,
    resources: SessionResources,
    gpus: int = 0,
    price_per_core_hour: float | None = None,
    price_per_gpu_hour: float | None = None,
    token_cost: float | None = None,
    token_cost_unmetered: int = 0,
) -> dict[str, Any]:
    """The report's ``cost`` of a run that ran ``seconds`` (wall), its scoring stage ``stage_seconds`` (wall), whose
    workers scored ``rows_scored`` rows in ``worker_seconds`` of forward passes (summed over tasks), on a session of
    ``resources`` with ``gpus`` GPUs (0: the model ran on CPUs): ``cores``, ``stage_cores``, ``gpus``,
    ``core_seconds`` and ``gpu_seconds`` (``run``, ``score_stage``, ``model``: module docstring),
    ``rows_per_core_second`` and, with a price set, ``cost`` and ``cost_per_million_rows``; ``token_cost``: what an
    endpoint charged for the run's tokens (``None``: no endpoint price), part of ``cost``; ``token_cost_unmetered``:
    answers that came without ``usage``, whose tokens the token cost cannot hold (recorded, so the cost says it is
    incomplete).

    >>> c = run_cost(seconds=20, stage_seconds=8, worker_seconds=6, rows_scored=1000,
    ...              resources=SessionResources(2, 2, 1), price_per_core_hour=0.36)
    >>> c["core_seconds"], c["rows_per_core_second"], c["cost"], c["cost_per_million_rows"]
    ({'run': 40.0, 'score_stage': 16.0, 'model': 6.0}, 25.0, 0.004, 4.0)
    """
    task_gpus = (resources.task_gpus or 1.0) if gpus else 0.0
    core_seconds = {
        "run": round(float(seconds * resources.cores), 3),
        "score_stage": round(float(stage_seconds * resources.stage_cores), 3),
        "model": round(float(worker_seconds * resources.task_cpus), 3),
    }
    gpu_seconds = {
        "run": round(float(seconds * gpus), 3),
        "score_stage": round(float(stage_seconds * gpus), 3),
        "model": round(float(worker_seconds * task_gpus), 3),
    }
    cost: dict[str, Any] = {
        "cores": resources.cores,
        "stage_cores": resources.stage_cores,
        "gpus": gpus,
        "core_seconds": core_seconds,
        "gpu_seconds": gpu_seconds,
        "rows_per_core_second": round(rows_scored / core_seconds["run"], 3)
        if rows_scored and core_seconds["run"]
        else None,
    }
    if price_per_core_hour is None and price_per_gpu_hour is None and token_cost is None:
        return cost
    total = (
        core_seconds["run"] * (price_per_core_hour or 0.0) + gpu_seconds["run"] * (price_per_gpu_hour or 0.0)
    ) / 3600
    if token_cost is not None:
        cost["token_cost"] = round(token_cost, 6)
        total += token_cost
        if token_cost_unmetered:
            cost["token_cost_unmetered"] = int(token_cost_unmetered)
    cost.update(
        price_per_core_hour=price_per_core_hour,
        price_per_gpu_hour=price_per_gpu_hour,
        cost=round(total, 6),
        cost_per_million_rows=round(total * 1e6 / rows_scored, 4) if rows_scored else None,
    )
    return cost


def cost_text(cost: Mapping[str, Any]) -> str:
    """A report's ``cost`` as one line naming each figure: ``core-s: 40.0 whole run (2 cores), 16.0 scoring stage
    (2 cores), 6.0 in model forward passes; 25.0 rows/core-s (whole run); cost 0.004 (4 per million rows)``."""
    text = "core-s: " + _held(cost["core_seconds"], cost["cores"], cost.get("stage_cores"), "core")
    if cost.get("gpus"):
        text += "; GPU-s: " + _held(cost.get("gpu_seconds") or {}, cost["gpus"], cost["gpus"], "GPU")
    if cost.get("rows_per_core_second"):
        text += f"; {cost['rows_per_core_second']:,.1f} rows/core-s (whole run)"
    if cost.get("cost") is not None:
        per_million = cost.get("cost_per_million_rows")
        text += f"; cost {cost['cost']:,.4g}" + (
            f" ({per_million:,.4g} per million rows)" if per_million is not None else ""
        )
        if cost.get("token_cost") is not None:
            text += f", of which {cost['token_cost']:,.4g} the endpoint's tokens"
            if cost.get("token_cost_unmetered"):
                text += f" (incomplete: {cost['token_cost_unmetered']} answers had no usage)"
    return text


def _held(seconds: Mapping[str, float], run_units: int, stage_units: int | None, unit: str) -> str:
    """``40.0 whole run (2 cores), 16.0 scoring stage (2 cores), 6.0 in model forward passes`` (a figure the
    report lacks is left out: reports written before the model's figure was split from the stage's)."""

    def held(units: int | None) -> str:
        return f" ({units} {unit}{'s' if units != 1 else ''})" if units else ""

    parts = [
        f"{seconds['run']:,.1f} whole run{held(run_units)}",
        f"{seconds['score_stage']:,.1f} scoring stage{held(stage_units)}",
    ]
    if seconds.get("model") is not None:
        parts.append(f"{seconds['model']:,.1f} in model forward passes")
    return ", ".join(parts)
