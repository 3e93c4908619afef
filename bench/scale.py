"""Figures at honest scale (issue 38): per machine, a run's fixed cost (F200), the scoring stage's rows/s of lakescore
(d) and of the plain loop (a), and the row count from which (d)'s whole process overtakes (a)'s; W3's incremental run
stated against F200.

Pure arithmetic over finished runs. A whole process is modelled as its fixed cost plus its rows over its stage rate:
(d)'s fixed cost is F200's (wall less its scoring stage), (a)'s its own wall less the time inside ``encode`` (process
start, imports, reading the table, loading the model, saving the vectors), each stage rate the workload's rows over
the median stage seconds. Like :mod:`bench.report`, nothing here asserts: a target is printed with ``met`` / ``NOT
met``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bench.fast_path import FAST_TARGETS, FIXED_WORKLOAD, LARGE_WORKLOAD, fixed_cost, verdict

__all__ = ["break_even", "stage_rate", "scale_lines", "incremental_line"]


def break_even(fixed_d: float, rate_d: float, fixed_a: float, rate_a: float) -> float | None:
    """Rows from which (d)'s whole process (``fixed_d + n / rate_d`` seconds) is faster than (a)'s (``fixed_a + n /
    rate_a``); 0 when (d) is never slower; ``None`` when (d)'s stage is not the faster (never at these rates).

    >>> break_even(14.0, 300.0, 6.0, 200.0)  # 8 s more fixed cost, 1/600 s a row less: 4,800 rows
    4800.0
    >>> break_even(14.0, 200.0, 6.0, 200.0) is None
    True
    """
    if rate_d <= rate_a:
        return None
    return max(0.0, (fixed_d - fixed_a) / (1 / rate_a - 1 / rate_d))


def stage_rate(summary) -> float | None:
    """A job's rows over its median scoring-stage seconds (``score_stage`` in its report), or ``None``."""
    seconds = summary.step_seconds.get("score_stage") if summary is not None else None
    return summary.job.rows / seconds if seconds else None


def _machine(facts: Mapping[str, str]) -> str:
    return f"{facts.get('cpu', 'unknown CPU')}, {facts.get('cores', '?')} cores"


def scale_lines(summaries: Sequence, facts: Mapping[str, str]) -> list[str]:
    """Per workload of W1 and W1L where (a) and (d) both ran: the machine, (d)'s fixed cost (F200's, or the
    workload's own when F200 did not run) with F200's target, both stage rates, (a)'s fixed cost, the break-even row
    count and the d/a these figures give at the workload's rows."""
    by = {(s.job.workload, s.job.peer.key): s for s in summaries}
    f200 = fixed_cost(by.get((FIXED_WORKLOAD, "d")))
    lines = []
    for workload in ("W1", LARGE_WORKLOAD):
        d, a = by.get((workload, "d")), by.get((workload, "a"))
        rate_d, rate_a, fixed_a = stage_rate(d), stage_rate(a), fixed_cost(a)
        fixed_d = f200 if f200 is not None else fixed_cost(d)
        if None in (rate_d, rate_a, fixed_a, fixed_d):
            continue
        if f200 is not None:
            limit = FAST_TARGETS["fixed_seconds"]
            fixed = f"{FIXED_WORKLOAD} fixed cost {fixed_d:.1f} s (target <= {limit:g} s: {verdict(fixed_d <= limit)})"
        else:
            fixed = f"(d)'s fixed cost {fixed_d:.1f} s ({FIXED_WORKLOAD} did not run: {workload}'s wall less its stage)"
        n = break_even(fixed_d, rate_d, fixed_a, rate_a)
        rows = d.job.rows
        modelled = (fixed_a + rows / rate_a) / (fixed_d + rows / rate_d)
        lines.append(
            f"{workload} at scale on {_machine(facts)}: {fixed}; scoring stage (d) {rate_d:.0f} rows/s, plain loop (a) "
            f"{rate_a:.0f} rows/s inside encode, (a)'s fixed cost {fixed_a:.1f} s (process start, imports, table and "
            f"model load, save); break-even, where (d)'s whole process overtakes (a)'s: "
            + ("never at these rates ((d)'s stage is not the faster)" if n is None else f"{n:,.0f} rows")
            + f"; these figures give d/a {modelled:.2f} at {rows:,} rows"
        )
    return lines


def incremental_line(w3, summaries: Sequence) -> str | None:
    """W3's incremental run (median wall) over F200's whole run (median wall), and what the ratio means; ``None``
    unless both ran."""
    f200 = next((s for s in summaries if s.job.workload == FIXED_WORKLOAD and s.job.peer.key == "d"), None)
    incremental = w3.median_wall("incremental") if w3 is not None else None
    if f200 is None or not f200.wall_seconds or not incremental:
        return None
    ratio = incremental / f200.wall_seconds
    scored = (w3.report("incremental") or {}).get("rows_scored")
    return (
        f"W3 incremental run over {FIXED_WORKLOAD}'s wall: {incremental:.1f} s / {f200.wall_seconds:.1f} s = "
        f"{ratio:.2f}x: the nightly run that scores {scored if scored is not None else '?'} changed rows of "
        f"{w3.rows:,} costs {ratio:.2f} times a {f200.job.rows}-row run, which is almost all fixed cost "
        f"(1.00x: an incremental nightly costs no more than starting a run)"
    )
