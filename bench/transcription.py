"""W12: transcription (issue 69): ``lakescore score --task transcribe`` over a folder of recordings against
``transformers.pipeline("automatic-speech-recognition")`` in a plain loop over the same files.

A seeded Whisper of :data:`MODEL_SHAPE` (30-second windows, as every Whisper's; random weights, its byte-level BPE
tokenizer trained on the W1 reviews: :func:`tests.tiny_audio.save_whisper`) is saved into the bench's data dir;
nothing is downloaded. ``rows`` recordings of :data:`SECONDS` seconds each (seeded tones and noise,
:func:`tests.tiny_audio.recording`, 16 kHz WAV) are written to a folder, and each peer transcribes the whole folder
in one whole process:

1. ``lakescore``: ``lakescore score --task transcribe --input-format audio`` (Spark local, Delta, validation);
2. ``loop``: :mod:`bench.peers.asr_loop`, one process, the pipeline over each file in turn.

They run alternately (``repeats`` each); figures are medians of whole-process wall time, each process tree's peak RSS
(:mod:`bench.proctree`), and the texts compared row by row. Target (printed, never enforced): lakescore's whole
process >= 1.0x the loop's. Not in ``make bench``'s default workloads: ``python -m bench.transcription --rows 200``.
The issue's peers on Daft and Ray Data are not run here (neither ships a speech reader of its own: their published
transcription runs call the same pipeline inside a UDF).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.generation import LOOP_ENV  # the loop's OpenMP threads sleep at a barrier, as W4's loop runs

W12 = "W12"
W12_ROWS = 1000
W12_SEED = 20261129
SECONDS = (5, 30)
"""The shortest and longest recording, in seconds: each one Whisper window."""
MODEL_SHAPE = {
    "d_model": 256,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024,
}
MAX_LENGTH = 24
"""Tokens a window's text has at most (random weights never stop on their own)."""


def make_w12_model(target: Path) -> Path:
    """W12's seeded Whisper, saved in ``target``."""
    from tests.tiny_audio import save_whisper

    return save_whisper(target, seed=W12_SEED, window_s=30, max_length=MAX_LENGTH, **MODEL_SHAPE)


def make_w12_data(target: Path, rows: int) -> Path:
    """``rows`` WAV files of :data:`SECONDS` seconds (seeded lengths) in the folder ``target``."""
    import random

    from tests.tiny_audio import encoded, recording

    target.mkdir(parents=True, exist_ok=True)
    lengths = random.Random(W12_SEED)
    for i in range(rows):
        seconds = lengths.uniform(*SECONDS)
        path = target / f"call-{i:05d}.wav"
        if not path.is_file():
            path.write_bytes(encoded(recording(seconds, seed=W12_SEED + i), 16_000, "WAV"))
    return target


def commands(folder: Path, model: Path, run_dir: Path) -> dict[str, list[str]]:
    return {
        "lakescore": [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            "--input",
            str(folder),
            "--input-format",
            "audio",
            "--output",
            str(run_dir / "delta"),
            "--task",
            "transcribe",
            "--model",
            str(model),
            "--report",
            str(run_dir / "report.json"),
            "--set",
            f"spark.warehouse_dir={run_dir / 'warehouse'}",
            "--set",
            f"spark.metastore_dir={run_dir / 'metastore_db'}",
            "--set",
            f"model.cache_dir={run_dir / 'model_cache'}",
        ],
        "loop": [
            sys.executable,
            "-m",
            "bench.peers.asr_loop",
            "--input",
            str(folder),
            "--model",
            str(model),
            "--output",
            str(run_dir / "texts.parquet"),
            "--timings",
            str(run_dir / "timings.json"),
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    import pandas as pd
    import pyarrow.parquet as pq

    from bench.equivalence import delta_files
    from bench.proctree import run_measured

    parser = argparse.ArgumentParser(prog="bench.transcription")
    parser.add_argument("--rows", type=int, default=W12_ROWS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dir", default="build/bench/w12")
    args = parser.parse_args(argv)
    root = Path(args.dir).resolve()
    model = make_w12_model(root / "model") if not (root / "model" / "config.json").is_file() else root / "model"
    folder = make_w12_data(root / f"calls_{args.rows}", args.rows)
    audio_s = sum(os.path.getsize(p) - 44 for p in folder.iterdir()) / 2 / 16_000
    walls: dict[str, list[float]] = {"lakescore": [], "loop": []}
    peaks: dict[str, list[float]] = {"lakescore": [], "loop": []}
    for repeat in range(args.repeats):
        for peer in ("lakescore", "loop"):
            run_dir = root / "runs" / f"{peer}-{repeat}"
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            run_dir.mkdir(parents=True)
            measured = run_measured(
                commands(folder, model, run_dir)[peer],
                env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(LOOP_ENV if peer == "loop" else {})},
                cwd=Path(__file__).resolve().parents[1],
                log_path=run_dir / "log.txt",
            )
            if measured.returncode != 0:
                raise SystemExit(f"{W12} {peer} failed (exit {measured.returncode}); see {run_dir / 'log.txt'}")
            walls[peer].append(measured.wall_seconds)
            peaks[peer].append(measured.peak_rss_bytes / 2**20)
            print(
                f"{W12} {peer} run {repeat + 1}: {walls[peer][-1]:.1f} s whole process, peak tree RSS "
                f"{peaks[peer][-1]:,.0f} MiB",
                flush=True,
            )
    ours = pq.read_table(delta_files(root / "runs" / "lakescore-0" / "delta"), columns=["path", "text"]).to_pandas()
    ours["path"] = ours["path"].str.removeprefix("file:")
    theirs = pd.read_parquet(root / "runs" / "loop-0" / "texts.parquet")
    both = ours.merge(theirs, on="path", suffixes=("_lakescore", "_loop"))
    equal = int((both["text_lakescore"] == both["text_loop"]).sum())
    ratio = statistics.median(walls["loop"]) / statistics.median(walls["lakescore"])
    report = json.loads((root / "runs" / "lakescore-0" / "report.json").read_text())
    print(
        f"{W12}: {args.rows} recordings, {audio_s / 60:.1f} min of audio; whole process lakescore "
        f"{statistics.median(walls['lakescore']):.1f} s (scoring stage {report['step_seconds']['score_stage']:.1f} s), "
        f"loop {statistics.median(walls['loop']):.1f} s: {ratio:.2f}x ({'met' if ratio >= 1.0 else 'NOT met'}, target "
        f">= 1.0x); peak tree RSS lakescore {statistics.median(peaks['lakescore']):,.0f} MiB, loop "
        f"{statistics.median(peaks['loop']):,.0f} MiB; texts equal on {equal} of {len(both)} rows; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
