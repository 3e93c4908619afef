"""W12's Daft peer: Whisper over a folder of recordings as Daft's published audio transcription workload runs it.

Modelled on Daft's audio transcription benchmark (Eventual-Inc/Daft, ``benchmarking/ai/audio_transcription/
daft_main.py``: the 113,800 Common Voice files Daft publishes against Ray Data and Spark): each recording decoded in a
row function, Whisper's feature extractor over a batch (``@daft.func.batch``: 30-second log-mel windows), a
``@daft.cls`` class holding the model whose ``@daft.method.batch`` calls ``generate`` over 64 recordings at a time,
and ``@daft.func.batch`` turning the token ids into texts (``batch_decode``, special tokens skipped), written as
Parquet. The folder is listed with ``daft.from_glob_path`` and each file read by its path, as Daft's "Transcribe
Audio with Daft" example reads a directory, where the benchmark reads Parquet holding the bytes. Decoding:
:func:`bench.peers.asr_parts.decode` (soundfile, as that example; soxr where the rate differs: the samples the other
sides hear) in place of the benchmark's torchaudio. ``generate`` runs with the model's own generation config, as the
benchmark calls it (W12's model sets the pipeline's beams in it). The benchmark's one model instance per GPU is one per
core here (``max_concurrency``), on Daft's default (native) runner.

Run in the peers' environment (``build/peers-env``), one whole process:
``python -m bench.peers.asr_daft --input <folder> --model <whisper> --output <dir> --timings <json>``; ``--timings``
gets the rows written and the seconds from the listing to the written Parquet.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.peers.asr_parts import arguments, decode, write_timings


def transcripts(df, args):
    """``df``'s files (its ``path`` column) with their texts: the benchmark's stages (see the module docstring)."""
    import daft
    import torch  # on the main thread, once: a first torch import inside Daft's UDF threads hangs the job
    from daft import DataType, col

    # Imported here, once: Daft builds its instances in threads, and transformers' lazy imports race there.
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    processor = AutoProcessor.from_pretrained(args.model)
    rate = processor.feature_extractor.sampling_rate

    @daft.func(return_dtype=DataType.list(DataType.float32()))
    def resample(path: str):
        return decode(Path(path.removeprefix("file://")).read_bytes(), rate)

    @daft.func.batch(return_dtype=DataType.tensor(DataType.float32()))
    def whisper_preprocess(resampled):
        recordings = [np.asarray(r, dtype=np.float32) for r in resampled.to_pylist()]
        return processor(recordings, sampling_rate=rate, return_tensors="np").input_features

    @daft.cls(max_concurrency=os.cpu_count())
    class Transcriber:
        def __init__(self, model: str) -> None:
            self.model = AutoModelForSpeechSeq2Seq.from_pretrained(model).eval()

        @daft.method.batch(return_dtype=DataType.list(DataType.int64()), batch_size=args.batch)
        def __call__(self, extracted_features):
            spectrograms = torch.from_numpy(np.stack(extracted_features.to_pylist()))
            with torch.no_grad():
                return self.model.generate(spectrograms).numpy()

    @daft.func.batch(return_dtype=DataType.string())
    def decoder(token_ids):
        return processor.batch_decode(token_ids.to_pylist(), skip_special_tokens=True)

    df = df.with_column("resampled", resample(col("path")))
    df = df.with_column("extracted_features", whisper_preprocess(col("resampled")))
    df = df.with_column("token_ids", Transcriber(args.model)(col("extracted_features")))
    df = df.with_column("text", decoder(col("token_ids")))
    return df.select("path", "text")


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments("bench.peers.asr_daft").parse_args(argv)

    import daft

    started = time.perf_counter()
    transcripts(daft.from_glob_path(str(Path(args.input).resolve() / "**")), args).write_parquet(args.output)
    seconds = time.perf_counter() - started
    write_timings(args.timings, args.output, seconds, "daft", daft.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
