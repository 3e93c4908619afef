"""What W12's Daft and Ray Data peers (:mod:`bench.peers.asr_daft`, :mod:`bench.peers.asr_ray`) share: their command
line, how a file's bytes become the samples the model hears, and the timings file they leave.

The published transcription runs both peers are modelled on decode with ``torchaudio.load`` and resample with
``torchaudio.transforms.Resample``; here soundfile decodes (as Daft's audio transcription example reads a file) and soxr
resamples where the rate differs: what lakescore and the plain loop use (transformers' ``load_audio``), so that every
side hears the same samples and the texts can be compared.
"""

from __future__ import annotations

import argparse
import io
import json

import numpy as np

__all__ = ["BATCH", "arguments", "decode", "write_timings"]

BATCH = 64
"""Recordings per ``generate`` call: the published runs' (Daft's ``batch_size=64`` and Ray Data's ``BATCH_SIZE``)."""


def arguments(prog: str) -> argparse.ArgumentParser:
    """A W12 peer's options: the folder of recordings, the speech model, the Parquet output, the timings file and the
    rows per batch."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--input", required=True, help="a folder of audio files")
    parser.add_argument("--model", required=True, help="a Whisper directory with its processor")
    parser.add_argument("--output", required=True, help="a directory for the Parquet output (path, text)")
    parser.add_argument("--timings", required=True, help="JSON file for the rows written and the job's seconds")
    parser.add_argument("--batch", type=int, default=BATCH, help="recordings per generate call")
    return parser


def decode(data: bytes, rate: int) -> np.ndarray:
    """The recording in ``data``, mono (the channels' mean) float32 at ``rate`` Hz."""
    import soundfile

    samples, source_rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = samples[:, 0] if samples.shape[1] == 1 else samples.mean(axis=1, dtype=np.float32)
    if source_rate != rate:
        import soxr

        mono = soxr.resample(mono, source_rate, rate)
    return np.ascontiguousarray(mono, dtype=np.float32)


def write_timings(path: str, output: str, seconds: float, engine: str, version: str) -> None:
    """Write to ``path`` the rows of the Parquet output at ``output`` and the job's ``seconds``."""
    import pyarrow.dataset as ds

    rows = ds.dataset(output, format="parquet").count_rows()
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"rows": rows, "seconds": seconds, "engine": engine, "version": version}, handle)
