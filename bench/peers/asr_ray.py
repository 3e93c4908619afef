"""W12's Ray Data peer: Whisper over a folder of recordings as Ray Data's published transcription runs are written.

Modelled on the Ray Data side of Daft's audio transcription benchmark (Eventual-Inc/Daft,
``benchmarking/ai/audio_transcription/ray_data_main.py``: the Common Voice workload Daft publishes against Ray Data and
Spark) and on Ray's own audio curation example (``doc/source/ray-overview/examples/e2e-audio``), which run the same
stages: ``map`` decodes each recording, ``map_batches`` runs Whisper's feature extractor over a batch (30-second
log-mel windows), a stateful class under ``map_batches`` holds the model and calls its ``generate`` over 64 recordings
at a time, ``map_batches`` turns the token ids into texts (``batch_decode``, special tokens skipped), and the rows
are written as Parquet. The folder is read with ``ray.data.read_binary_files`` (paths kept) where the published runs
read Parquet holding the bytes. Decoding: :func:`bench.peers.asr_parts.decode` (soundfile + soxr, the samples the
other sides hear) in place of torchaudio. ``generate`` runs with the model's own generation config, as the published
runs call it (W12's model sets the pipeline's beams in it). The model actors are an autoscaling pool of one up to one
per core, as in :mod:`bench.peers.ray_data` (a fixed pool of one per core takes both CPUs of a 2-core machine before
the read task gets one; ``--fixed-pool`` runs it); the stateless stages run as tasks.

Run in the peers' environment (``build/peers-env``), one whole process:
``python -m bench.peers.asr_ray --input <folder> --model <whisper> --output <dir> --timings <json>``; ``--timings``
gets the rows written and the seconds from ``ray.init`` to the written Parquet.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from bench.peers.asr_parts import arguments, decode, write_timings


def resample(item: dict, rate: int) -> dict:
    """One recording's bytes decoded to mono samples at the model's rate."""
    return {"path": item["path"], "arr": decode(item["bytes"], rate)}


def whisper_preprocess(batch, processor, rate: int):
    """Whisper's log-mel features of a batch of recordings (each padded to its 30-second window)."""
    features = processor(batch["arr"].tolist(), sampling_rate=rate, return_tensors="np").input_features
    return {"path": batch["path"], "input_features": list(features)}


class Transcriber:
    """The model, loaded once per actor; ``generate`` over a batch's features with its own generation config."""

    def __init__(self, model: str) -> None:
        from transformers import AutoModelForSpeechSeq2Seq

        self.model = AutoModelForSpeechSeq2Seq.from_pretrained(model).eval()

    def __call__(self, batch: dict) -> dict:
        import torch

        with torch.no_grad():
            token_ids = self.model.generate(torch.from_numpy(np.array(batch["input_features"])))
        return {"path": batch["path"], "token_ids": token_ids.numpy()}


def decoder(batch, processor):
    """Each row's text: its token ids decoded, special tokens skipped."""
    texts = processor.batch_decode([ids.tolist() for ids in batch["token_ids"]], skip_special_tokens=True)
    return {"path": batch["path"], "text": texts}


def build(args):
    """The Ray Data pipeline over ``args.input`` (lazy; written by the caller)."""
    import ray
    from transformers import AutoProcessor

    # Loaded once here and shipped with the stages that use it, as the published runs' module-level processor is.
    processor = AutoProcessor.from_pretrained(args.model)
    rate = processor.feature_extractor.sampling_rate
    pool = (
        ray.data.ActorPoolStrategy(min_size=1, max_size=os.cpu_count())
        if args.autoscale
        else ray.data.ActorPoolStrategy(size=os.cpu_count())
    )
    ds = ray.data.read_binary_files(args.input, include_paths=True)
    ds = ds.map(resample, fn_kwargs={"rate": rate})
    ds = ds.map_batches(whisper_preprocess, batch_format="pandas", fn_kwargs={"processor": processor, "rate": rate})
    ds = ds.map_batches(
        Transcriber, fn_constructor_args=(args.model,), batch_format="numpy", batch_size=args.batch, compute=pool
    )
    return ds.map_batches(decoder, batch_format="pandas", fn_kwargs={"processor": processor})


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments("bench.peers.asr_ray")
    parser.add_argument(
        "--fixed-pool",
        dest="autoscale",
        action="store_false",
        help="a fixed pool of one model actor per core, as the published runs size it (hangs on 2 cores)",
    )
    args = parser.parse_args(argv)

    import ray

    started = time.perf_counter()
    ray.init()
    try:
        build(args).write_parquet(args.output)
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
    write_timings(args.timings, args.output, seconds, "ray", ray.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
