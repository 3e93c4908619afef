"""The resource profile of the scoring stage (Spark stage-level scheduling, ``pyspark.resource``).

What each master gets for a configured ``resources.scoring`` (Spark 4.x rules,
``ResourceProfileManager.isSupported``):

- ``local`` / ``local[...]``: no profile (Spark rejects them there); the stage
  runs on the default resources and a warning says so.
- Standalone (``spark://``), ``local-cluster``, YARN, Kubernetes with dynamic
  allocation on: a full profile, executor requests (GPUs, memory overhead,
  discovery script) and task requests; Spark starts matching executors.
- The same masters with dynamic allocation off: a task-only profile (CPUs and
  GPUs per task) on the executors that already exist; executor requests cannot
  apply and are logged as ignored, and task GPUs need the default executors to
  have GPUs (``spark.executor.resource.gpu.amount``), else :class:`ProfileError`
  (the tasks could never be scheduled, and Spark would wait forever).
- Any other master: no profile, with a warning.

:func:`plan_profile` decides from the master and the Spark conf alone (no
SparkContext), :func:`build_profile` turns a plan into a ``ResourceProfile``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.resource import ExecutorResourceRequests, ResourceProfile, ResourceProfileBuilder, TaskResourceRequests

from lakescore.jobs.config import ConfigError, ScoringResources

__all__ = ["ProfilePlan", "ProfileError", "plan_profile", "build_profile", "scoring_profile", "supports_profiles"]

log = logging.getLogger(__name__)

GPU = "gpu"


class ProfileError(ConfigError):
    """The configured profile cannot run on this cluster as it is configured (found before any compute)."""


@dataclass(frozen=True)
class ProfilePlan:
    """What the scoring stage asks for: ``None`` requests mean "use the default profile"."""

    task: Mapping[str, float] | None = None
    """``cpus`` and/or ``gpu`` per task."""
    executor: Mapping[str, object] = field(default_factory=dict)
    """``gpu`` (amount), ``discovery_script`` and ``memory_overhead`` per executor; empty for a task-only profile."""
    warnings: tuple[str, ...] = ()
    """Why (part of) the configured profile is not applied; the caller logs them."""

    @property
    def applies(self) -> bool:
        return self.task is not None


def supports_profiles(master: str) -> bool:
    """Whether Spark accepts stage resource profiles on ``master`` (standalone, local-cluster, YARN, Kubernetes)."""
    return master.startswith(("spark://", "local-cluster", "k8s://")) or master == "yarn"


def plan_profile(resources: ScoringResources, master: str, conf: Mapping[str, str]) -> ProfilePlan:
    """Decide the scoring stage's requests for ``master`` and Spark ``conf`` (pure: no SparkContext).

    Raises :class:`ProfileError` when the task GPUs can never be scheduled: dynamic
    allocation is off and the default executors have fewer GPUs than one task needs.
    """
    if not resources.requested:
        return ProfilePlan()
    if not supports_profiles(master):
        return ProfilePlan(
            warnings=(
                f"resources.scoring is set but Spark master {master!r} cannot honour resource profiles "
                "(only standalone, local-cluster, YARN and Kubernetes can); scoring runs without the profile, "
                "on the default task resources",
            )
        )
    task: dict[str, float] = {}
    if resources.task_cpus is not None:
        task["cpus"] = resources.task_cpus
    if resources.task_gpus is not None:
        task[GPU] = resources.task_gpus
    executor: dict[str, object] = {}
    if resources.executor_gpus is not None:
        executor[GPU] = resources.executor_gpus
        if resources.discovery_script:
            executor["discovery_script"] = resources.discovery_script
    if resources.executor_memory_overhead is not None:
        executor["memory_overhead"] = resources.executor_memory_overhead.strip()

    if str(conf.get("spark.dynamicAllocation.enabled", "false")).strip().lower() == "true":
        if GPU in task and GPU not in executor:
            raise ProfileError(
                "resources.scoring.task_gpus is set and dynamic allocation is on, so Spark starts new executors "
                "for the scoring stage: set resources.scoring.executor_gpus (and discovery_script) so they have GPUs"
            )
        return ProfilePlan(task=task, executor=executor)

    warnings = []
    if executor:
        warnings.append(
            "dynamic allocation is off, so the scoring stage gets a task-only profile on the existing executors; "
            f"ignored per-stage executor request(s) {sorted(executor)} (set spark.executor.* cluster-wide instead)"
        )
    if GPU in task:
        have = _number(conf.get("spark.executor.resource.gpu.amount"))
        if have < task[GPU]:
            raise ProfileError(
                f"resources.scoring.task_gpus is {task[GPU]:g} but dynamic allocation is off and the executors have "
                f"spark.executor.resource.gpu.amount={conf.get('spark.executor.resource.gpu.amount', 'unset')}: "
                "no scoring task could ever be scheduled. Give the executors GPUs "
                "(spark.executor.resource.gpu.amount and .discoveryScript) or enable dynamic allocation"
            )
    if not task:  # only executor requests, none of which can apply
        return ProfilePlan(warnings=tuple(warnings))
    return ProfilePlan(task=task, warnings=tuple(warnings))


def build_profile(plan: ProfilePlan) -> ResourceProfile | None:
    """The ``ResourceProfile`` for ``plan`` (``None`` when it does not apply). Works without a SparkContext."""
    if plan.task is None:  # the plan does not apply
        return None
    builder = ResourceProfileBuilder()
    task = TaskResourceRequests()
    if "cpus" in plan.task:
        task = task.cpus(int(plan.task["cpus"]))
    if GPU in plan.task:
        task = task.resource(GPU, float(plan.task[GPU]))
    builder.require(task)
    if plan.executor:
        executor = ExecutorResourceRequests()
        if GPU in plan.executor:
            executor = executor.resource(GPU, int(plan.executor[GPU]), str(plan.executor.get("discovery_script", "")))
        if "memory_overhead" in plan.executor:
            executor = executor.memoryOverhead(str(plan.executor["memory_overhead"]))
        builder.require(executor)
    return builder.build


def scoring_profile(spark, resources: ScoringResources) -> ResourceProfile | None:
    """The profile the scoring stage runs with on ``spark``'s cluster, logging whatever is not applied."""
    conf = dict(spark.conf.getAll)  # the cluster's settings too, in classic and Connect sessions alike
    plan = plan_profile(resources, conf.get("spark.master", ""), conf)
    for warning in plan.warnings:
        log.warning(warning)
    return build_profile(plan)


def _number(value: str | None) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
