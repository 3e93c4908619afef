"""The run's model as the executors serve it, owned by one object from its preflight to the last scored row.

:class:`ServedModel` is entered once by :func:`~lakescore.jobs.score_job.run_scoring`. It starts the preflight with
the paid request of a model served elsewhere deferred (:meth:`ServedModel.preflight`: the executors load the model,
a head over an endpoint only reads its ``/v1/models``), keeps the output's last listing through an outage of that
listing (:meth:`ServedModel.identity`), sends the deferred sample once the plan has rows to send
(:meth:`ServedModel.probe`), and stops the engines the run's executors started (``generate.server``,
``embed.server``) once the rows are scored (:meth:`ServedModel.stop`) or the run failed (on exit).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from types import TracebackType

from pyspark.sql import functions as F

from lakescore.jobs.platform.spark.adapter import default_parallelism
from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.context import ModelIdentity, Plan, RunContext, Targets
from lakescore.jobs.steps.incremental import recorded_spec
from lakescore.jobs.steps.preflight import ExecutorPreflight, preflight_model, remote_options, summed_traffic
from lakescore.udfs.options.remote import MODELS_LISTING
from lakescore.udfs.remote.engine import stop_engines_task
from lakescore.udfs.remote.head import endpoint_identity

__all__ = ["ServedModel"]

log = logging.getLogger(__name__)


class ServedModel:
    """Context manager: the run's model on its executors, from the preflight to the last scored row; on exit (the
    run's rows scored, or the run failed) the engines the run started are stopped, once."""

    def __init__(self, run: RunContext) -> None:
        self._run = run
        self._stopped = False

    def __enter__(self) -> ServedModel:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def preflight(self) -> ExecutorPreflight:
        """The executors load the model while the driver checks
        (:class:`~lakescore.jobs.steps.preflight.ExecutorPreflight`); a head over an endpoint only reads its
        ``/v1/models`` there: its paid request waits for a plan with rows to score (:meth:`probe`)."""
        return ExecutorPreflight(self._run, probe=False)

    def identity(self, targets: Targets, identity: ModelIdentity) -> ModelIdentity:
        """``identity``, or, for a model served elsewhere whose ``/v1/models`` did not answer the preflight while it
        answered the output's last run, the identity under that run's listing: a failed listing is no news (the
        workers treat it so mid-run), so a passing outage neither rescores nor re-bills the table. The workers, whose
        own ask failed too, score under it (:mod:`~lakescore.udfs.models.model_cache`)."""
        run = self._run
        listing = identity.model_files.get(MODELS_LISTING)
        if (
            listing is None
            or json.loads(listing).get("answered")
            or run.cfg.write.mode != "incremental"
            or targets.previous_version is None
        ):
            return identity
        previous = (recorded_spec(run.spark, run.cfg.output_ref(), targets.previous_version) or {}).get("files") or {}
        kept = previous.get(MODELS_LISTING)
        if not isinstance(kept, str) or not json.loads(kept).get("answered"):
            return identity
        endpoint = run.cfg.endpoint()
        if endpoint is None:  # only a model served elsewhere has a listing to take
            return identity
        log.warning(
            "the endpoint's %s did not answer; the model is taken as the output's last run listed it", MODELS_LISTING
        )
        return dataclasses.replace(
            identity,
            sha256=endpoint_identity(endpoint.model, kept, endpoint.revision),
            model_files={**identity.model_files, MODELS_LISTING: kept},
        )

    def probe(self, plan: Plan) -> Plan:
        """``plan``, after the second part of the preflight of a model served elsewhere: the executors send the sample
        with every setting of the run (:class:`~lakescore.udfs.remote.answers.EndpointRefused` naming what happened,
        before any row), and the plan's identity counts those requests in the run's figures and cost. Only when the
        plan has chunks left to score whose rows have an input to send: a run with nothing to score (or only null
        inputs, which are dead-lettered without a request) sends the endpoint nothing. Other models probed already."""
        run = self._run
        if not plan.identity.probe_deferred or not _rows_to_send(run, plan):
            return plan
        probed = preflight_model(run.spark, plan.spec, run.layout)
        traffic = summed_traffic(json.dumps(t) for t in (plan.identity.traffic, probed.traffic))
        identity = dataclasses.replace(plan.identity, traffic=traffic, probe_deferred=False)
        return dataclasses.replace(plan, identity=identity)

    def stop(self) -> None:
        """With a served engine (``generate.server``, ``embed.server``), once: stop the engines the run's executors
        started (one small task per scoring slot, under the scoring stage's resource profile, as the preflight started
        them); an engine belongs to its executor, so another run's engine on the same host is never stopped
        (:func:`~lakescore.udfs.remote.engine.stop_engines`). Where a task misses a host, the engine's watchdog stops
        it with the executor. A failure here is logged, never the run's."""
        run = self._run
        if self._stopped or remote_options(run.spec, "server") is None:
            return
        self._stopped = True
        tasks = run.layout.partitions or default_parallelism(run.spark)
        try:
            stopped = (
                run.spark.range(tasks, numPartitions=tasks)
                .mapInArrow(stop_engines_task, "stopped int", profile=run.layout.profile)
                .collect()
            )
            log.info("stopped %d served engine(s)", sum(r.stopped for r in stopped))
        except Exception as exc:  # noqa: BLE001 (the run's outcome is decided; the watchdogs stop what is left)
            log.warning("could not stop the served engines: %s", exc)


def _rows_to_send(run: RunContext, plan: Plan) -> bool:
    """Whether ``plan`` has chunks left whose rows include one with an input (a null one is ``null_input``, never sent).
    Rows behind the refused-id anti join are taken to: finding out would cost a shuffle of the input."""
    if not plan.scorable_rows or len(plan.done) == plan.chunks:
        return False
    if plan.changes is None and plan.split.ids.refused_rows:
        return True
    present = F.coalesce(*[column(c) for c in run.input_cols]).isNotNull()
    return bool(plan.scorable.where(present).limit(1).count())
