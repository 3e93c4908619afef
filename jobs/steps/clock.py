"""The step clock: the wall seconds of the run's named steps, what the run knows so far, and where a run that raised
stopped (:class:`RunStop`), for whoever records the failure (the report, the metrics row, the CLI's line).

The steps are ``startup``, ``read_check``, ``prepare``, ``score_stage``, ``validate``, ``report_data`` and ``publish``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from lakescore.jobs.testing_hooks import at_step

__all__ = ["RunStop", "StepClock"]


@dataclass(frozen=True)
class RunStop:
    """Where a run that raised stopped: the step its error went through, what the run knew then (run id, staging
    location, chunk count) and, when it stopped while scoring, the chunks staged of the total (what a rerun resumes
    from)."""

    step: str
    facts: dict[str, Any]
    chunks_staged: tuple[int, int] | None = None


class StepClock:
    """Wall seconds per named step, and of the whole run since its first step started; where the run stopped."""

    def __init__(self) -> None:
        self._start()
        self._running = False
        self.seconds: dict[str, float] = {}
        self.facts: dict[str, Any] = {}
        """What the run knows so far (run id, staging location), for the report of a run that fails later."""
        self._stop: tuple[BaseException, RunStop] | None = None
        self._staged: tuple[int, int] | None = None

    def note(self, **facts: Any) -> None:
        """Remember ``facts`` for the report of a run that fails later (:meth:`stop_of`)."""
        self.facts.update(facts)

    def stopped_while_scoring(self, staged: int, chunks: int) -> None:
        """The scoring step stopped with ``staged`` of ``chunks`` chunks staged: its error's :class:`RunStop` says
        so."""
        self._staged = (staged, chunks)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the block as step ``name`` (added to the step's earlier time, if any); an error it raises is the run's
        stop in this step (:meth:`stop_of`). The clock's run starts with its first step.

        Test-only hooks (:mod:`lakescore.jobs.testing_hooks`) run first, outside the timing.
        """
        if not self._running:  # a clock made ahead of the run (the CLI's) counts from the run's first step
            self._start()
            self._running = True
        start = time.perf_counter()
        try:
            at_step(name)  # what a hook raises (a test's interrupt at a barrier) stops the run in this step too
            start = time.perf_counter()
            yield
        except BaseException as exc:
            if self.stop_of(exc) is None:  # the failure report names the step the run died in
                self._stop = (exc, RunStop(name, dict(self.facts), self._staged))
            raise
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def _start(self) -> None:
        self.started = time.perf_counter()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def stop_of(self, exc: BaseException) -> RunStop | None:
        """Where the run stopped, when ``exc`` is the error that stopped it in one of its steps; else ``None``."""
        return self._stop[1] if self._stop is not None and self._stop[0] is exc else None

    def elapsed(self) -> float:
        return time.perf_counter() - self.started
