"""W12: transcription (issue 69): ``lakescore score --task transcribe`` over a folder of recordings against
``transformers.pipeline("automatic-speech-recognition")`` in a plain loop over the same files, and against Daft's and
Ray Data's own way of running a speech model over files.

A seeded Whisper of :data:`MODEL_SHAPE` (30-second windows, as every Whisper's; random weights, its byte-level BPE
tokenizer trained on the W1 reviews: :func:`tests.tiny_audio.save_whisper`) is saved into the bench's data dir;
nothing is downloaded. ``rows`` recordings of :data:`SECONDS` seconds each (seeded tones and noise,
:func:`tests.tiny_audio.recording`, 16 kHz WAV) are written to a folder, and each peer transcribes the whole folder
in one whole process:

1. ``lakescore``: ``lakescore score --task transcribe --input-format audio`` (Spark local, Delta, validation);
2. ``loop``: :mod:`bench.peers.asr_loop`, one process, the pipeline over each file in turn;
3. ``daft``: :mod:`bench.peers.asr_daft`, Daft's published audio transcription workload over the folder;
4. ``ray``: :mod:`bench.peers.asr_ray`, the same stages as Ray Data's published transcription runs write them.

``daft`` and ``ray`` run in the peers' environment (``--peers-python``, default ``build/peers-env/bin/python``, which
``make bench-peers`` builds); ``--peers`` picks the peers (default all four). Each peer decodes with soundfile and soxr,
so every side hears the same samples, and searches with the model's generation config (the pipeline's 5 beams are
written into it, so a plain ``generate``, as Daft's and Ray's runs call it, searches as the pipeline does).
They run alternately (``repeats`` each); figures are medians of whole-process wall time, each process tree's peak RSS
(:mod:`bench.proctree`), and each peer's texts compared row by row with lakescore's. Target (printed, never
enforced): lakescore's whole process >= 1.0x each peer's. Not in ``make bench``'s default workloads:
``python -m bench.transcription --rows 200``.
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

REPO = Path(__file__).resolve().parents[1]
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


NUM_BEAMS = 5
"""The beams ``pipeline("automatic-speech-recognition")`` adds where a model's generation config sets none, written
into W12's: lakescore and the loop search as before, and Daft's and Ray's plain ``generate`` searches as they do."""
PEERS = ("lakescore", "loop", "daft", "ray")
PEER_MODULES = {"daft": "bench.peers.asr_daft", "ray": "bench.peers.asr_ray"}
"""The peers that run in the peers' environment (Daft and Ray Data are never installed in lakescore's)."""


def make_w12_model(target: Path) -> Path:
    """W12's seeded Whisper, saved in ``target``."""
    from tests.tiny_audio import save_whisper

    return save_whisper(target, seed=W12_SEED, num_beams=NUM_BEAMS, window_s=30, max_length=MAX_LENGTH, **MODEL_SHAPE)


def w12_model(target: Path) -> Path:
    """W12's model in ``target``, saved again when what is there is not :func:`make_w12_model`'s (an older bench's
    model, without the beams in its generation config)."""
    config = target / "generation_config.json"
    if config.is_file() and json.loads(config.read_text()).get("num_beams") == NUM_BEAMS:
        return target
    return make_w12_model(target)


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


def commands(folder: Path, model: Path, run_dir: Path, peers_python: Path) -> dict[str, list[str]]:
    files = ["--input", str(folder), "--model", str(model), "--timings", str(run_dir / "timings.json")]
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
        "loop": [sys.executable, "-m", "bench.peers.asr_loop", *files, "--output", str(run_dir / "texts.parquet")],
        **{
            peer: [str(peers_python), "-m", module, *files, "--output", str(run_dir / "texts")]
            for peer, module in PEER_MODULES.items()
        },
    }


def texts(peer: str, run_dir: Path):
    """``peer``'s transcripts (``path``, ``text``) from its run in ``run_dir``, each path as a plain local path."""
    import pandas as pd
    import pyarrow.parquet as pq

    from bench.equivalence import delta_files

    if peer == "lakescore":
        frame = pq.read_table(delta_files(run_dir / "delta"), columns=["path", "text"]).to_pandas()
    else:
        frame = pd.read_parquet(run_dir / ("texts.parquet" if peer == "loop" else "texts"), columns=["path", "text"])
    frame["path"] = frame["path"].str.replace(r"^file:(//)?", "", regex=True)
    return frame


def main(argv: Sequence[str] | None = None) -> int:
    from bench.proctree import run_measured

    parser = argparse.ArgumentParser(prog="bench.transcription")
    parser.add_argument("--rows", type=int, default=W12_ROWS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dir", default="build/bench/w12")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"a subset of {','.join(PEERS)}, run in that order")
    parser.add_argument(
        "--peers-python",
        type=Path,
        default=REPO / "build" / "peers-env" / "bin" / "python",
        help="the interpreter of Daft's and Ray Data's environment (make bench-peers builds build/peers-env)",
    )
    args = parser.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if not peers or set(peers) - set(PEERS):
        parser.error(f"--peers: a subset of {','.join(PEERS)}")
    if set(peers) & set(PEER_MODULES) and not args.peers_python.exists():
        parser.error(f"--peers-python {args.peers_python} is absent: `make build/peers-env.installed` builds it")
    root = Path(args.dir).resolve()
    model = w12_model(root / "model")
    folder = make_w12_data(root / f"calls_{args.rows}", args.rows)
    audio_s = sum(os.path.getsize(p) - 44 for p in folder.iterdir()) / 2 / 16_000
    walls: dict[str, list[float]] = {p: [] for p in peers}
    peaks: dict[str, list[float]] = {p: [] for p in peers}
    for repeat in range(args.repeats):
        for peer in peers:
            run_dir = root / "runs" / f"{peer}-{repeat}"
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            run_dir.mkdir(parents=True)
            measured = run_measured(
                commands(folder, model, run_dir, args.peers_python)[peer],
                env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(LOOP_ENV if peer != "lakescore" else {})},
                cwd=REPO,
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
    print(f"{W12}: {args.rows} recordings, {audio_s / 60:.1f} min of audio; load average {os.getloadavg()[0]:.1f}")
    if "lakescore" in peers:
        report = json.loads((root / "runs" / "lakescore-0" / "report.json").read_text())
        print(f"{W12} lakescore scoring stage {report['step_seconds']['score_stage']:.1f} s")
    reference = peers[0]
    ours = texts(reference, root / "runs" / f"{reference}-0")
    for peer in peers:
        line = (
            f"{W12} {peer}: whole process {statistics.median(walls[peer]):.1f} s, peak tree RSS "
            f"{statistics.median(peaks[peer]):,.0f} MiB"
        )
        if peer != reference:
            both = ours.merge(texts(peer, root / "runs" / f"{peer}-0"), on="path", suffixes=("_ours", "_theirs"))
            equal = int((both["text_ours"] == both["text_theirs"]).sum())
            line += f"; texts equal {reference}'s on {equal} of {len(both)} rows ({len(ours)} recordings)"
        if peer != "lakescore" and "lakescore" in peers:
            ratio = statistics.median(walls[peer]) / statistics.median(walls["lakescore"])
            line += f"; {ratio:.2f}x lakescore's ({'met' if ratio >= 1.0 else 'NOT met'}, target >= 1.0x)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
