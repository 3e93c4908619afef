"""W12's plain peer: one process, no Spark, ``transformers.pipeline("automatic-speech-recognition")`` over every file
of a folder, one recording at a time, as a user would transcribe a folder of calls by hand.

Each file is read with transformers' own ``load_audio`` (soundfile + soxr, as ``librosa.load``) at the model's rate and
passed to the pipeline with ``chunk_length_s`` (its windows for a recording longer than one). Outputs go to Parquet
(``path``, ``text``), the timings to JSON: ``load_seconds`` (the pipeline built) and ``transcribe_seconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.asr_loop")
    parser.add_argument("--input", required=True, help="a folder of audio files")
    parser.add_argument("--model", required=True, help="a speech model directory with its processor")
    parser.add_argument("--output", required=True)
    parser.add_argument("--timings", required=True)
    parser.add_argument("--chunk-length-s", type=float, default=30.0)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    import pandas as pd
    from transformers import pipeline
    from transformers.audio_utils import load_audio

    pipe = pipeline("automatic-speech-recognition", model=args.model)
    rate = pipe.feature_extractor.sampling_rate
    loaded = time.perf_counter() - started
    files = sorted(p for p in Path(args.input).rglob("*") if p.is_file())
    texts = []
    for path in files:
        audio = load_audio(str(path), sampling_rate=rate)
        texts.append(pipe({"raw": audio, "sampling_rate": rate}, chunk_length_s=args.chunk_length_s)["text"])
    transcribing = time.perf_counter() - started - loaded
    pd.DataFrame({"path": [str(p) for p in files], "text": texts}).to_parquet(args.output, index=False)
    Path(args.timings).write_text(json.dumps({"load_seconds": loaded, "transcribe_seconds": transcribing}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
