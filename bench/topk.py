"""W6: top-K recommendations (issue 37): ``lakescore score --task tabular`` with ``rank`` against the same job by hand;
W7: the same rows through a program that returns its first feature, no ranking (issue 46): lakescore's overhead itself.

``users`` x ``candidates`` rows (:func:`make_w6_data`: seeded Parquet, ``user_id``, ``item_id`` and
:data:`FEATURES` float32, written with pyarrow a row group at a time, :data:`~bench.data.FILES` files of contiguous
users) are scored by a seeded TorchScript MLP (:func:`make_w6_model`), and each user's best ``top_k`` rows are kept:

1. ``lakescore``: ``lakescore score --task tabular`` with ``id_col`` ``[user_id, item_id]`` and ``rank``
   (``partition_by: [user_id]``, ``order_by: prediction``, descending, ``top_k``) end to end, default settings
   otherwise (validation on), one whole process;
2. ``window``: :mod:`bench.peers.topk_window`, one whole process: ``predict_batch_udf`` with the program, a window
   ``row_number()`` per user, a Delta overwrite.

They run alternately (round-robin, ``repeats`` each) in the same sitting; figures are medians. Then lakescore runs
once more on a tenth of the users, for its peak memory at two sizes. Targets (printed with met / NOT met, never
enforced): the window job's wall time over lakescore's >= :data:`WALL_TARGET`; lakescore's peak RSS at full size <=
:data:`MEMORY_TARGET` x its peak at a tenth; both outputs hold the same (``user_id``, ``item_id``, ``rank``) rows with
scores within :data:`SCORE_TOLERANCE`.

W7 (:func:`run_w7`) reuses W6's candidate rows and harness: the program (:func:`make_w7_model`) costs next to nothing,
so each peer's seconds per row are what it does besides the model. ``lakescore`` is W6's command without ``rank``;
``batch`` is :mod:`bench.peers.topk_window` with ``--top-k 0``: ``predict_batch_udf`` and a Delta overwrite. Target:
the hand job's wall time over lakescore's >= :data:`W7_TARGET`; both outputs hold the same (``user_id``, ``item_id``)
rows with the same scores.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.alternating import PeerRun, PeerRuns, compare_first_good, run_alternately
from bench.data import FILES
from bench.equivalence import delta_files
from bench.fast_path import verdict

__all__ = [
    "W6",
    "W6_USERS",
    "W6_CANDIDATES",
    "W6_TOP_K",
    "W6_REPEATS",
    "W6Result",
    "FEATURES",
    "w6_chunks",
    "make_w6_data",
    "make_w6_model",
    "rate_text",
    "lakescore_command",
    "peer_commands",
    "run_w6",
    "compare_top",
    "outputs_line",
    "rows_per_second",
    "w6_lines",
    "W7",
    "W7Result",
    "make_w7_model",
    "run_w7",
    "compare_scores",
    "w7_lines",
]

W6 = "W6"
W6_USERS, W6_CANDIDATES, W6_TOP_K, W6_REPEATS = 200_000, 50, 10, 2
W6_SEED = 20261210
FEATURES = tuple(f"f{i}" for i in range(8))
USER_FEATURES = 3
"""The first features are the user's (the same on each of its candidates), the rest the (user, item) pair's."""
HIDDEN = (64, 32)
CATALOG, ITEM_STEP = 1_000_003, 7_919
"""Item ids: a user's candidates are ``(start + c * ITEM_STEP) % CATALOG`` for a seeded start; ``CATALOG`` is prime,
so they are distinct."""
CHUNK_USERS = 20_000
"""Users generated and written at a time (one Parquet row group)."""
TENTH = 10
WALL_TARGET, MEMORY_TARGET, SCORE_TOLERANCE = 1.0, 1.25, 1e-5  # issue 46: W6 >= 1.0x the hand job
W7 = "W7"
W7_TARGET = 1.0


def w6_chunks(
    users: int, candidates: int, seed: int = W6_SEED, first_user: int = 0, chunk_users: int = CHUNK_USERS
) -> Iterator[pa.Table]:
    """W6's candidate rows of users ``first_user .. first_user + users - 1`` (ids from 1), ``chunk_users`` users a
    table, each drawn from a generator seeded by ``seed`` and its first user: the same rows for the same arguments."""
    for start in range(first_user, first_user + users, chunk_users):
        stop = min(start + chunk_users, first_user + users)
        rng = np.random.default_rng([seed, start])
        n = stop - start
        user_ids = np.repeat(np.arange(start + 1, stop + 1, dtype=np.int64), candidates)
        offsets = rng.integers(0, CATALOG, size=n, dtype=np.int64)
        items = (offsets[:, None] + np.arange(candidates, dtype=np.int64)[None, :] * ITEM_STEP) % CATALOG
        per_user = np.repeat(rng.standard_normal((n, USER_FEATURES), dtype=np.float32), candidates, axis=0)
        per_pair = rng.standard_normal((n * candidates, len(FEATURES) - USER_FEATURES), dtype=np.float32)
        columns = np.hstack([per_user, per_pair])
        yield pa.table(
            {
                "user_id": user_ids,
                "item_id": items.reshape(-1),
                **{name: columns[:, i] for i, name in enumerate(FEATURES)},
            }
        )


def make_w6_data(path: Path, users: int, candidates: int = W6_CANDIDATES, files: int = FILES) -> int:
    """Write W6's ``users`` x ``candidates`` rows under ``path`` as ``files`` Parquet files of contiguous users, a row
    group per :data:`CHUNK_USERS` users (never the whole table in memory); return the rows written."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    bounds = np.linspace(0, users, num=max(1, min(files, users)) + 1).astype(int)
    rows = 0
    for part, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        with pq.ParquetWriter(path / f"part-{part:05d}.parquet", _schema()) as writer:
            for chunk in w6_chunks(int(stop - start), candidates, first_user=int(start)):
                writer.write_table(chunk)
                rows += chunk.num_rows
    return rows


def _schema() -> pa.Schema:
    return pa.schema([("user_id", pa.int64()), ("item_id", pa.int64()), *[(name, pa.float32()) for name in FEATURES]])


def make_w6_model(target: Path) -> Path:
    """W6's seeded MLP (:data:`FEATURES` -> :data:`HIDDEN` with ReLU -> one score) saved as TorchScript in ``target``
    (``model.pt``); return the file. The same seed gives the same weights on every machine."""
    import torch

    torch.manual_seed(W6_SEED)
    widths = (len(FEATURES), *HIDDEN)
    layers: list = []
    for width_in, width_out in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(width_in, width_out), torch.nn.ReLU()]
    module = torch.nn.Sequential(*layers, torch.nn.Linear(widths[-1], 1)).eval()
    target.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module), str(target / "model.pt"))
    return target / "model.pt"


def rows_per_second(report: dict) -> float:
    """Rows over lakescore's scoring stage (its report), or over the window job's seconds from read to write."""
    if "job_seconds" in report:
        return report["rows"] / report["job_seconds"]
    return (report.get("workers") or {}).get("rows_scored", 0) / report["step_seconds"]["score_stage"]


@dataclass
class W6Result(PeerRuns):
    """Every W6 run by peer (``lakescore``, ``window``) in run order, lakescore's run at a tenth of the users, and the
    comparison of the two outputs."""

    users: int
    candidates: int
    top_k: int
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)
    tenth: PeerRun | None = None
    equal: dict | None = None

    @property
    def ok(self) -> bool:
        return super().ok and (self.tenth is None or self.tenth.ok)


def rate_text(peer: str, rate: float) -> str:
    """A run's rate as its line prints it: lakescore's over its scoring stage, a hand job's from read to written
    table."""
    return f"{rate:,.0f} rows/s ({'scoring stage' if peer == 'lakescore' else 'read to written table'})"


def lakescore_command(source: Path, model: Path, run_dir: Path, *task_args: str) -> list[str]:
    """``lakescore score`` of a ranking workload over ``source`` with ``model``, ids ``[user_id, item_id]`` and
    ``task_args`` (the task, its input columns, ``rank``); its output, report, warehouse, metastore and model cache go
    under ``run_dir``."""
    return [
        str(Path(sys.prefix) / "bin" / "lakescore"),
        "score",
        "--input",
        str(source),
        "--output",
        str(run_dir / "delta"),
        "--model",
        str(model),
        "--id-col",
        "user_id,item_id",
        *task_args,
        "--report",
        str(run_dir / "report.json"),
        # a fresh warehouse and Derby metastore per run: embedded Derby is single-process
        "--set",
        f"spark.warehouse_dir={run_dir / 'warehouse'}",
        "--set",
        f"spark.metastore_dir={run_dir / 'metastore_db'}",
        "--set",
        f"model.cache_dir={run_dir / 'model_cache'}",
    ]


def peer_commands(source: Path, model: Path, run_dir: Path, top_k: int) -> dict[str, list[str]]:
    """Each W6 peer's command line over ``source``; its files go under ``run_dir``. ``top_k`` 0: W7's, no ranking
    (the hand job then only scores and writes)."""
    rank = (
        [
            "--set",
            "rank.partition_by=user_id",
            "--set",
            "rank.order_by=prediction",
            "--set",
            "rank.descending=true",
            "--set",
            f"rank.top_k={top_k}",
        ]
        if top_k
        else []
    )
    return {
        "lakescore": lakescore_command(
            source, model, run_dir, "--task", "tabular", "--feature-cols", ",".join(FEATURES), *rank
        ),
        "window": [
            sys.executable,
            "-m",
            "bench.peers.topk_window",
            "--input",
            str(source),
            "--features",
            ",".join(FEATURES),
            "--model",
            str(model),
            "--output",
            str(run_dir / "delta"),
            "--timings",
            str(run_dir / "timings.json"),
            "--top-k",
            str(top_k),
        ],
    }


def run_w6(
    data_dir: Path,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    repeats: int,
    users: int = W6_USERS,
    candidates: int = W6_CANDIDATES,
    top_k: int = W6_TOP_K,
) -> W6Result:
    """Build W6's model and candidates, run both peers alternately ``repeats`` times each (a line per run), lakescore
    once more on a tenth of the users, and compare the first good outputs row by row."""
    model = make_w6_model(data_dir / "w6_model")
    sources = {W6: data_dir / "w6", f"{W6}-tenth": data_dir / "w6_tenth"}
    rows = make_w6_data(sources[W6], users, candidates)
    make_w6_data(sources[f"{W6}-tenth"], max(1, users // TENTH), candidates)
    result = W6Result(users=users, candidates=candidates, top_k=top_k)
    print(
        f"W6: {users:,} users x {candidates} candidates = {rows:,} rows, top {top_k} per user; model {model}",
        flush=True,
    )
    written = {"lakescore": "report.json", "window": "timings.json"}

    def commands(source: Path, peers: tuple[str, ...]) -> dict:
        return {peer: (lambda run_dir, peer=peer: peer_commands(source, model, run_dir, top_k)[peer]) for peer in peers}

    result.runs = run_alternately(
        W6,
        commands(sources[W6], ("lakescore", "window")),
        written,
        rows_per_second,
        rate_text,
        runs_dir,
        env,
        {},
        repo,
        repeats,
    )
    tenth = run_alternately(
        f"{W6}-tenth",
        commands(sources[f"{W6}-tenth"], ("lakescore",)),
        written,
        rows_per_second,
        rate_text,
        runs_dir,
        env,
        {},
        repo,
        1,
    )
    result.tenth = tenth["lakescore"][0]
    result.equal = compare_first_good(runs_dir, W6, result.runs, {"lakescore": "delta", "window": "delta"}, compare_top)
    return result


def compare_top(
    ours: Path, theirs: Path, key: tuple[str, ...] = ("user_id", "item_id", "rank"), score_col: str = "prediction"
) -> dict:
    """lakescore's ranked rows (its Delta output, its score in ``score_col``) against the window job's (``score``), on
    (``user_id``, ``item_id``, ``rank``): rows in both, rows only in either, and the largest score difference over the
    rows in both."""
    key = list(key)
    mine = pq.read_table(delta_files(ours), columns=[*key, score_col]).to_pandas().rename(columns={score_col: "ours"})
    other = pq.read_table(delta_files(theirs), columns=[*key, "score"]).to_pandas().rename(columns={"score": "theirs"})
    both = mine.merge(other, on=key)
    return {
        "matched": len(both),
        "only_lakescore": len(mine) - len(both),
        "only_window": len(other) - len(both),
        "max_score_delta": float((both["ours"] - both["theirs"]).abs().max()) if len(both) else None,
    }


def _peak_mib(run: PeerRun) -> float:
    return run.measured.peak_rss_bytes / 2**20


def w6_lines(result: W6Result) -> list[str]:
    """The W6 figures and its three targets with met / NOT met."""
    rows = result.users * result.candidates
    lines = [
        f"W6 data: {result.users:,} users x {result.candidates} candidates = {rows:,} rows, {len(FEATURES)} float32 "
        f"features; TorchScript MLP {len(FEATURES)}-{'-'.join(map(str, HIDDEN))}-1; top {result.top_k} per user"
    ]
    for peer, what in (("lakescore", "rows/s of its scoring stage"), ("window", "rows/s from read to written table")):
        line = result.peer_line(W6, peer, what, 0)
        lines += [line] if line else []
    report = next((r.report for r in result.good("lakescore")), None)
    if report:
        workers = report.get("workers") or {}
        lines.append(
            f"W6 lakescore's report: {workers.get('rows_scored')} rows scored in {workers.get('arrow_batches')} "
            f"Arrow batches, {report.get('output_rows')} published, {report.get('ranked_out')} ranked out, "
            f"{report.get('error_rows')} error rows; step seconds "
            + ", ".join(f"{k} {v:.1f}" for k, v in (report.get("step_seconds") or {}).items())
        )
    lines += filter(None, [result.whole_line(W6, "window", "the window job's", WALL_TARGET)])
    lines += _memory_lines(result)
    lines += outputs_line(
        result.equal,
        "W6",
        "the window job",
        "(user_id, item_id, rank)",
        f"the same rows, scores within {SCORE_TOLERANCE:g}",
    )
    return lines


def outputs_line(
    eq: dict | None, workload: str, peer: str, rows: str, target: str, tolerance: float = SCORE_TOLERANCE
) -> list[str]:
    """The line comparing lakescore's output rows with ``peer``'s (:func:`compare_top`'s ``eq``; scores within
    ``tolerance``), none without one."""
    if not eq:
        return []
    same = eq["only_lakescore"] == 0 and eq["only_window"] == 0
    close = eq["max_score_delta"] is not None and eq["max_score_delta"] <= tolerance
    delta = "-" if eq["max_score_delta"] is None else f"{eq['max_score_delta']:.2e}"
    return [
        f"{workload} outputs, lakescore vs {peer}: {eq['matched']:,} {rows} rows in both, {eq['only_lakescore']} "
        f"only in lakescore's, {eq['only_window']} only in {peer}'s; largest score difference {delta}   target "
        f"{target}: {verdict(same and close)}"
    ]


def _memory_lines(result: W6Result) -> list[str]:
    """Peak RSS (whole process tree) and the largest Python worker's private memory of each peer at full size, and
    lakescore's at a tenth of the users: the flat-memory target."""
    lines = []
    for peer in ("lakescore", "window"):
        good = result.good(peer)
        if good:
            worst = max(good, key=_peak_mib)
            private = max(r.measured.worker_private_bytes for r in good) / 2**20
            lines.append(
                f"W6 {peer} peak RSS at {result.users:,} users: {_peak_mib(worst):.0f} MiB (process tree), "
                f"largest Python worker's private memory {private:.0f} MiB"
            )
    full, tenth = result.good("lakescore"), result.tenth
    if full and tenth is not None and tenth.ok:
        peak, small = max(_peak_mib(r) for r in full), _peak_mib(tenth)
        lines.append(
            f"W6 lakescore peak RSS, {result.users:,} users vs {max(1, result.users // TENTH):,}: {peak:.0f} vs "
            f"{small:.0f} MiB = {peak / small:.2f}x (worker private "
            f"{max(r.measured.worker_private_bytes for r in full) / 2**20:.0f} "
            f"vs {tenth.measured.worker_private_bytes / 2**20:.0f} MiB)   target <= {MEMORY_TARGET:g}x: "
            f"{verdict(peak / small <= MEMORY_TARGET)}"
        )
    elif tenth is not None:
        lines.append(f"W6 lakescore at a tenth of the users: FAILED (exit {tenth.measured.returncode})")
    return lines


def make_w7_model(target: Path) -> Path:
    """W7's program: the first of :data:`FEATURES`, as is (``(rows, 1)``), saved as TorchScript in ``target``
    (``model.pt``); return the file. What a run spends on it is next to nothing, so the rest is overhead."""
    import torch

    class First(torch.nn.Module):
        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return features[:, :1]

    target.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.trace(First().eval(), torch.zeros(2, len(FEATURES))), str(target / "model.pt"))
    return target / "model.pt"


def _candidate_rows(path: Path, users: int, candidates: int) -> int:
    """W6's candidate rows under ``path``, written unless an earlier workload of this sitting left them there."""
    wanted = users * candidates
    files = sorted(path.glob("*.parquet")) if path.is_dir() else []
    if files and sum(pq.ParquetFile(f).metadata.num_rows for f in files) == wanted:
        return wanted
    return make_w6_data(path, users, candidates)


@dataclass
class W7Result(PeerRuns):
    """Every W7 run by peer (``lakescore``, ``batch``) in run order and the comparison of the two outputs."""

    users: int
    candidates: int
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)
    equal: dict | None = None


def run_w7(
    data_dir: Path,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    repeats: int,
    users: int = W6_USERS,
    candidates: int = W6_CANDIDATES,
) -> W7Result:
    """Run W7's two peers alternately ``repeats`` times each over W6's candidate rows (a line per run) and compare the
    first good outputs row by row."""
    model = make_w7_model(data_dir / "w7_model")
    source = data_dir / "w6"
    rows = _candidate_rows(source, users, candidates)
    print(
        f"W7: {rows:,} candidate rows (W6's) through a program returning its first feature; model {model}", flush=True
    )
    # top_k 0: W6's commands without ranking; the hand job is W6's window peer, then only predict_batch_udf + a write
    commands = {
        peer: (lambda run_dir, own=own: peer_commands(source, model, run_dir, 0)[own])
        for peer, own in (("lakescore", "lakescore"), ("batch", "window"))
    }

    result = W7Result(users=users, candidates=candidates)
    result.runs = run_alternately(
        W7,
        commands,
        {"lakescore": "report.json", "batch": "timings.json"},
        rows_per_second,
        rate_text,
        runs_dir,
        env,
        {},
        repo,
        repeats,
    )
    result.equal = compare_first_good(
        runs_dir, W7, result.runs, {"lakescore": "delta", "batch": "delta"}, compare_scores
    )
    return result


def compare_scores(ours: Path, theirs: Path) -> dict:
    """W7's outputs on (``user_id``, ``item_id``): :func:`compare_top` without a rank."""
    return compare_top(ours, theirs, ("user_id", "item_id"))


def _overhead_us(run: PeerRun, rows: int) -> float:
    """Microseconds a row of the whole process besides the model (lakescore: less its workers' model seconds)."""
    model = ((run.report or {}).get("workers") or {}).get("model_seconds") or 0.0
    return (run.measured.wall_seconds - model) / rows * 1e6


def w7_lines(result: W7Result) -> list[str]:
    """The W7 figures: each peer's runs, microseconds a row besides the model, and the target with met / NOT met."""
    rows = result.users * result.candidates
    lines = [f"W7 data: W6's {rows:,} candidate rows; TorchScript program returning its first feature; no ranking"]
    for peer, what in (("lakescore", "rows/s of its scoring stage"), ("batch", "rows/s from read to written table")):
        line = result.peer_line(W7, peer, what, 0)
        lines += [line] if line else []
    report = next((r.report for r in result.good("lakescore")), None)
    if report:
        lines.append(
            "W7 lakescore's step seconds: "
            + ", ".join(f"{k} {v:.1f}" for k, v in (report.get("step_seconds") or {}).items())
        )
    overhead = {peer: sorted(_overhead_us(r, rows) for r in result.good(peer)) for peer in ("lakescore", "batch")}
    if overhead["lakescore"] and overhead["batch"]:
        ours, theirs = (values[len(values) // 2] for values in (overhead["lakescore"], overhead["batch"]))
        lines.append(
            f"W7 whole process per row besides the model (fixed cost included): lakescore {ours:.1f} us, "
            f"predict_batch_udf by hand {theirs:.1f} us; lakescore's ceiling on a model of no cost "
            f"{1e6 / ours:,.0f} rows/s"
        )
    lines += filter(None, [result.whole_line(W7, "batch", "the predict_batch_udf job's", W7_TARGET)])
    lines += outputs_line(result.equal, "W7", "the hand job", "(user_id, item_id)", "the same rows and scores")
    return lines
