"""W9: (query, passage) pairs reranked (issue 59): a cross-encoder scores every pair and each query's best passages are
kept, lakescore against the same job by hand.

``queries`` x ``passages`` rows (:func:`make_w9_data`: seeded Parquet of :data:`~bench.data.FILES` files of contiguous
queries; ``user_id`` the query's id and ``item_id`` the passage's, the id names of W6 so that the shared hand job and
comparison (:mod:`bench.peers.topk_window`, :func:`bench.topk.compare_top`) run unchanged; ``query`` a short W2-like
question of 4-12 words, ``text`` a W1 review body of log-normal length as the passage) are scored as pairs by
all-MiniLM-L6-v2's body under W6T's seeded one-logit head (:func:`bench.topk_text.make_w6t_model`), and each query's
best ``top_k`` passages by the logit's sigmoid are kept:

1. ``lakescore``: ``lakescore score --task classify --text-col query --text-pair-col text`` with ``id_col``
   ``[user_id, item_id]`` and ``rank`` (``partition_by: [user_id]``, ``order_by: score``, ``top_k``), every guarantee
   on;
2. ``window``: :mod:`bench.peers.rerank_pairs_window`, ``predict_batch_udf`` over the two text columns in batches of
   :data:`W9_WINDOW_BATCH` pairs (the tokenizer pads each to its longest pair), a window ``row_number()`` per query, a
   Delta overwrite.

They run alternately (``repeats`` each) in the same sitting; figures are medians. Target: the hand job's wall time over
lakescore's >= :data:`W9_WALL_TARGET`; both outputs hold the same (``user_id``, ``item_id``, ``rank``) rows with scores
within :data:`~bench.topk_text.SCORE_TOLERANCE`. Peak memory of both is reported.
"""

from __future__ import annotations

import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.alternating import PeerRun, PeerRuns, compare_first_good, run_alternately
from bench.data import FILES, review_bodies, short_bodies
from bench.topk import compare_top, lakescore_command, outputs_line, rate_text, rows_per_second
from bench.topk_text import SCORE_TOLERANCE, make_w6t_model

__all__ = [
    "W9",
    "W9_QUERIES",
    "W9_PASSAGES",
    "W9_TOP_K",
    "W9_WALL_TARGET",
    "W9Result",
    "make_w9_data",
    "peer_commands",
    "run_w9",
    "w9_lines",
]

W9 = "W9"
W9_QUERIES, W9_PASSAGES, W9_TOP_K = 1000, 50, 5
W9_WALL_TARGET = 1.5  # issue 59: the hand job's wall time over lakescore's
W9_SEED = 20261129
W9_WINDOW_BATCH = 64
"""The hand job's rows per forward: at lakescore's default of 256, a batch padded to one long passage's 512 tokens
holds gigabytes of attention per Python worker, and the kernel killed the job on the 24 GiB bench machine."""


def make_w9_data(path: Path, queries: int, passages: int = W9_PASSAGES, files: int = FILES) -> int:
    """Write W9's ``queries`` x ``passages`` rows under ``path`` as ``files`` Parquet files of contiguous queries (ids
    from 1; a query's passage ids 0..passages-1); return the rows written. The same arguments give the same rows."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    rng = random.Random(W9_SEED)
    questions = [" ".join(body.split()[: rng.randint(4, 12)]) + "?" for body in short_bodies(queries, seed=W9_SEED)]
    query_ids = np.repeat(np.arange(1, queries + 1, dtype=np.int64), passages)
    passage_ids = np.tile(np.arange(passages, dtype=np.int64), queries)
    table = pa.table(
        {
            "user_id": query_ids,
            "item_id": passage_ids,
            "query": pa.array([q for q in questions for _ in range(passages)], pa.string()),
            "text": pa.array(list(review_bodies(queries * passages, seed=W9_SEED)), pa.string()),
        }
    )
    bounds = np.linspace(0, queries, num=max(1, min(files, queries)) + 1).astype(int) * passages
    for part, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        pq.write_table(table.slice(int(start), int(stop - start)), path / f"part-{part:05d}.parquet")
    return table.num_rows


@dataclass
class W9Result(PeerRuns):
    """Every W9 run by peer (``lakescore``, ``window``) in run order and the comparison of the two outputs."""

    queries: int
    passages: int
    top_k: int
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)
    equal: dict | None = None


def peer_commands(source: Path, model: Path, run_dir: Path, top_k: int) -> dict[str, list[str]]:
    """Each W9 peer's command line over ``source``; its files go under ``run_dir``."""
    return {
        "lakescore": lakescore_command(
            source,
            model,
            run_dir,
            "--task",
            "classify",
            "--text-col",
            "query",
            "--text-pair-col",
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
            "bench.peers.rerank_pairs_window",
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
            "--batch",
            str(W9_WINDOW_BATCH),
        ],
    }


def run_w9(
    data_dir: Path,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    repeats: int,
    queries: int = W9_QUERIES,
    passages: int = W9_PASSAGES,
    top_k: int = W9_TOP_K,
) -> W9Result:
    """Build W9's model and pairs, run both peers alternately ``repeats`` times each (a line per run), and compare the
    first good outputs row by row."""
    model = make_w6t_model(data_dir / "w9_model")
    source = data_dir / "w9"
    rows = make_w9_data(source, queries, passages)
    print(
        f"W9: {queries:,} queries x {passages} passages = {rows:,} pairs, top {top_k} per query; model {model}",
        flush=True,
    )

    commands = {
        peer: (lambda run_dir, peer=peer: peer_commands(source, model, run_dir, top_k)[peer])
        for peer in ("lakescore", "window")
    }
    result = W9Result(queries=queries, passages=passages, top_k=top_k)
    result.runs = run_alternately(
        W9,
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
        W9,
        result.runs,
        {"lakescore": "delta", "window": "delta"},
        lambda ours, theirs: compare_top(ours, theirs, score_col="score"),
    )
    return result


def w9_lines(result: W9Result) -> list[str]:
    """The W9 figures (peak memory in each peer's line) and its targets with met / NOT met."""
    rows = result.queries * result.passages
    lines = [
        f"W9 data: {result.queries:,} queries x {result.passages} W1 review passages = {rows:,} pairs; "
        f"all-MiniLM-L6-v2 body, seeded one-logit head; top {result.top_k} per query by its sigmoid"
    ]
    for peer, what in (("lakescore", "pairs/s of its scoring stage"), ("window", "pairs/s from read to written table")):
        line = result.peer_line(W9, peer, what, 0)
        lines += [line] if line else []
    lines += filter(None, [result.whole_line(W9, "window", "the predict_batch_udf window job's", W9_WALL_TARGET)])
    lines += outputs_line(
        result.equal,
        W9,
        "the window job",
        "(user_id, item_id, rank)",
        f"the same rows, scores within {SCORE_TOLERANCE:g}",
        SCORE_TOLERANCE,
    )
    return lines
