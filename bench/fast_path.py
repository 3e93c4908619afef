"""The backend targets: the fastest lakescore configuration against the plain loops, the fixed cost of a
run, peak memory, and every backend's per-row cosine to float32.

Like :mod:`bench.report`, nothing here asserts: each target is printed with ``met`` / ``NOT met``.
The fastest configuration is the fastest of (d) torch float32, (o) ONNX float32, (q) ONNX int8 and
(k) torch bfloat16 that ran; (q) and (k) are within their tolerance by construction (their runs refuse to
score otherwise, :mod:`lakescore.udfs.models.quantize`), and their cosine to (a) is printed beside them. Its
like-for-like peer is the plain single-process loop on the same backend and precision (:data:`PLAIN_LOOP_OF`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "FIXED_WORKLOAD",
    "LARGE_WORKLOAD",
    "FAST_TARGETS",
    "fast_path_lines",
    "cosine_lines",
    "target_lines",
    "verdict",
    "fixed_cost",
]

FIXED_WORKLOAD = "F200"
"""The first 200 W1 rows through (d): a run's cost besides scoring."""
LARGE_WORKLOAD = "W1L"
"""W1's generator at 60,000 rows, (a) and (d) by default (issue 38): where a run's fixed cost no longer decides."""

FAST_TARGETS = {
    "fastest/a": 2.0,
    "fastest/e": 1.0,
    "W1L fastest/e": 1.0,
    "fixed_seconds": 12.0,
    "peak_rss_mib": 2560.0,
    "int8_p1_cosine": 0.99,
}
LAKESCORE_PEERS = ("d", "o", "q", "k", "u")
PLAIN_LOOP_OF = {"d": "a", "o": "a", "q": "e", "k": "f", "u": "a"}
"""Each lakescore configuration's plain single-process loop on the same backend and precision; for (u), the automatic
path, the float32 loop its choice is meant to beat (issue 70: >= 1.4x on an EPYC, >= 1.6x on an AMX Xeon)."""
LOSSY_PEERS = ("q", "e", "k", "f", "u")
"""Reduced-precision peers: held to the int8 / bfloat16 tolerance (1st-percentile cosine), not to float32's."""
_BACKENDS = {
    "d": "torch float32",
    "o": "ONNX float32",
    "q": "ONNX int8",
    "k": "torch bfloat16",
    "e": "plain ORT int8 loop",
    "f": "plain torch bfloat16 loop",
    "u": "auto CPU path",
}


def verdict(ok: bool | None) -> str:
    """A target's outcome as the bench prints it: ``met``, ``NOT met``, or ``-`` when it could not be measured."""
    return "-" if ok is None else "met" if ok else "NOT met"


def fast_path_lines(summaries: Sequence) -> list[str]:
    """W1: fastest lakescore configuration over (a) and (e); W2: each lakescore peer over (c); F200 fixed
    cost; W1 peak RSS of each lakescore peer."""
    by = {(s.job.workload, s.job.peer.key): s for s in summaries}
    lines = []
    # W1 holds the fastest configuration to (a) and to its own plain loop; W1L only to its own loop, and only when a
    # fast pair ran there ((d) against (a) is W1L's d/a target already)
    for workload, targets in (("W1", ("fastest/a", "fastest/e")), (LARGE_WORKLOAD, ("W1L fastest/e",))):
        ran = [by[(workload, k)] for k in LAKESCORE_PEERS if (workload, k) in by and by[(workload, k)].median]
        if not ran or (workload == LARGE_WORKLOAD and not any(s.job.peer.key in "oqku" for s in ran)):
            continue
        fastest = max(ran, key=lambda s: s.median)
        key = fastest.job.peer.key
        for name in targets:
            other = "a" if name == "fastest/a" else PLAIN_LOOP_OF[key]
            peer = by.get((workload, other))
            if peer is not None and peer.median:
                ratio = fastest.median / peer.median
                same = " (the plain loop on its backend and precision)" if name != "fastest/a" else ""
                lines.append(
                    f"{workload} fastest lakescore config ({key}: {_BACKENDS[key]}) / ({other}){same} = "
                    f"{ratio:.2f}   target >= {FAST_TARGETS[name]:g}: {verdict(ratio >= FAST_TARGETS[name])}"
                )
    c = by.get(("W2", "c"))
    for key in LAKESCORE_PEERS[1:]:
        mine = by.get(("W2", key))
        if c is not None and mine is not None and c.median and mine.median:
            lines.append(f"W2 {key}/c = {mine.median / c.median:.2f}   target >= 1: {verdict(mine.median >= c.median)}")
    for key in LAKESCORE_PEERS:
        s = by.get(("W1", key))
        if s is not None and s.peak_rss_mib:
            limit = FAST_TARGETS["peak_rss_mib"]
            lines.append(
                f"W1 ({key}) {_BACKENDS[key]} peak RSS (whole process tree) {s.peak_rss_mib:.0f} MiB   "
                f"target <= {limit:.0f} MiB: {verdict(s.peak_rss_mib <= limit)}"
            )
    return lines + _fixed_lines(by)


def _fixed_lines(by: dict) -> list[str]:
    fixed = by.get((FIXED_WORKLOAD, "d"))
    outside = fixed_cost(fixed)
    if outside is None:
        return []
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in fixed.step_seconds.items() if k != "in_job")
    return [
        f"{FIXED_WORKLOAD} fixed cost of a run ((d) on {fixed.job.rows} rows, median wall {fixed.wall_seconds:.1f} s "
        f"less its scoring stage): {outside:.1f} s   target <= {FAST_TARGETS['fixed_seconds']:g} s: "
        f"{verdict(outside <= FAST_TARGETS['fixed_seconds'])}; steps: {steps}"
    ]


def fixed_cost(summary) -> float | None:
    """A job's median process wall time less its median scoring stage (``score_stage`` in its report: lakescore's, or
    a plain loop's own clock); ``None`` when it has no good run."""
    if summary is None or not summary.wall_seconds:
        return None
    return summary.wall_seconds - summary.step_seconds.get("score_stage", 0.0)


def cosine_lines(equivalence: dict, exact_target: float) -> list[str]:
    """Per-row cosine of each peer's W1 output to (a)'s float32 vectors, with its target."""
    if not equivalence:
        return ["equivalence: not checked (needs one successful W1 run of (a) and of a lakescore peer)"]
    lines = []
    for key, found in equivalence.items():
        lossy = key in LOSSY_PEERS
        figure, target = ("p1_cosine", FAST_TARGETS["int8_p1_cosine"]) if lossy else ("min_cosine", exact_target)
        value = found.get(figure)
        lines.append(
            f"cosine to float32 (W1, ({key}) {_BACKENDS[key]} vs (a), per review_id): min "
            f"{_fmt(found.get('min_cosine'))}, "
            f"1st percentile {_fmt(found.get('p1_cosine'))} over {found.get('matched')} matched rows; missing "
            f"{found.get('missing_in_b')}, extra {found.get('missing_in_a')}   target {figure} >= {target}: "
            f"{verdict(None if value is None else value >= target)}"
        )
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.7f}"


def target_lines() -> list[str]:
    """The targets this module reports (and C1's, :mod:`bench.classifier`), for the Markdown's target list."""
    from lakescore.udfs.models.quantize import Tolerance

    limits = Tolerance()
    return [
        f"- W1: the fastest lakescore configuration within tolerance >= {FAST_TARGETS['fastest/a']:g}x (a) and >= "
        f"{FAST_TARGETS['fastest/e']:g}x the plain loop on its backend and precision ((e) for int8, (f) for bfloat16)",
        f"- {LARGE_WORKLOAD}: the fastest CPU configuration within tolerance >= "
        f"{FAST_TARGETS['W1L fastest/e']:g}x its plain loop ((e) or (f)), when `W1L_PEERS` includes that pair",
        "- W2: each lakescore configuration >= 1x (c)",
        f"- {FIXED_WORKLOAD}: a run's time outside its scoring stage <= {FAST_TARGETS['fixed_seconds']:g} s",
        f"- W1: peak RSS of the whole process tree <= {FAST_TARGETS['peak_rss_mib']:.0f} MiB",
        f"- int8 and bfloat16: per-row cosine to float32 >= {FAST_TARGETS['int8_p1_cosine']} at the 1st percentile",
        f"- int8 and bfloat16 classifiers (C1): label agreement >= {limits.min_agreement:g} and 99th-percentile "
        f"probability difference <= {limits.max_prob_delta:g} against float32",
    ]
