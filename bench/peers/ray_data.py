"""Ray Data's side of the side-by-side bench: each workload as Ray Data's batch-inference guide writes it.

Run in the peers' environment (``build/peers-env``), one whole process per run:
``python -m bench.peers.ray_data --workload W1 --input ... --model ... --output <delta> --timings <json>``.
Every workload reads the same Parquet as lakescore with ``ray.data.read_parquet``, runs the model in a stateful
class under ``map_batches`` in an actor pool of up to one actor per core (one model per actor, the guide's
``ActorPoolStrategy``; ``concurrency`` is deprecated since 2.51), and writes Delta with ``Dataset.write_delta``;
defaults elsewhere. ``--timings`` gets the output's rows and the seconds from ``ray.init`` to the committed table.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from bench.peers.program import peer_arguments, write_timings


class Embedder:
    """W1 / W1L: a SentenceTransformer per actor; ``encode`` with its defaults."""

    def __init__(self, model: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model, device="cpu")

    def __call__(self, batch: dict) -> dict:
        return {"review_id": batch["review_id"], "embedding": list(self.model.encode(list(batch["body"])))}


class ImageClassifier:
    """W5: Pillow decodes (EXIF orientation applied, RGB, as transformers' ``load_image``), the model's processor and
    the classifier per batch; the label is the arg-max logit's name."""

    def __init__(self, model: str):
        from transformers import AutoImageProcessor, AutoModelForImageClassification

        self.processor = AutoImageProcessor.from_pretrained(model)
        self.model = AutoModelForImageClassification.from_pretrained(model).eval()

    def __call__(self, batch: dict) -> dict:
        import torch
        from PIL import Image, ImageOps

        images = [ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB") for data in batch["image"]]
        with torch.inference_mode():
            logits = self.model(**self.processor(images=images, return_tensors="pt")).logits
        labels = self.model.config.id2label
        return {"id": batch["id"], "label": [labels[int(k)] for k in logits.argmax(-1)]}


class Generator:
    """W4: ``model.generate`` over each batch, left-padded, greedy; a row's text is its new tokens up to its first EOS,
    decoded without special tokens (Ray's LLM processor needs vLLM, which does not run on this CPU)."""

    def __init__(self, model: str, max_new_tokens: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(model).eval()
        self.max_new_tokens = max_new_tokens

    def __call__(self, batch: dict) -> dict:
        import torch

        inputs = self.tokenizer(list(batch["prompt"]), return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = self.model.generate(
                **inputs, do_sample=False, max_new_tokens=self.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id
            )
        eos, texts = self.tokenizer.eos_token_id, []
        for new in out[:, inputs["input_ids"].shape[1] :].tolist():
            texts.append(
                self.tokenizer.decode(new[: new.index(eos) + 1] if eos in new else new, skip_special_tokens=True)
            )
        return {"id": batch["id"], "generated_text": texts}


class Scorer:
    """W6: the TorchScript MLP over a batch's feature columns; one float score per row."""

    def __init__(self, model: str, features: list[str]):
        import torch

        self.program = torch.jit.load(model, map_location="cpu").eval()
        self.features = features

    def __call__(self, batch: dict) -> dict:
        import torch

        matrix = torch.from_numpy(np.stack([batch[f] for f in self.features], axis=1).astype(np.float32))
        with torch.inference_mode():
            scores = self.program(matrix).reshape(len(matrix)).double().numpy()
        return {"user_id": batch["user_id"], "item_id": batch["item_id"], "score": scores}


def top_k(group, k: int):
    """W6: one user's rows, best score first (ties by item id), the first ``k`` with their rank."""
    order = np.lexsort((group["item_id"], -group["score"]))[:k]
    return {
        "user_id": group["user_id"][order],
        "item_id": group["item_id"][order],
        "score": group["score"][order],
        "rank": np.arange(1, len(order) + 1, dtype=np.int32),
    }


def build(workload: str, args: argparse.Namespace):
    """The Ray Data pipeline of ``workload`` over ``args.input`` (lazy; written by the caller)."""
    import ray

    ds = ray.data.read_parquet(args.input)
    # An autoscaling pool of one actor up to one per core: a fixed pool of one per core (the guide's size=cores)
    # takes every CPU before the Parquet read's ListFiles task gets one, and the job hangs on a 2-core machine.
    pool = (
        ray.data.ActorPoolStrategy(min_size=1, max_size=os.cpu_count())
        if args.autoscale
        else ray.data.ActorPoolStrategy(size=os.cpu_count())
    )
    if workload in ("W1", "W1L"):
        return ds.map_batches(Embedder, fn_constructor_args=(args.model,), compute=pool)
    if workload == "W5":
        return ds.map_batches(ImageClassifier, fn_constructor_args=(args.model,), compute=pool, batch_size=args.batch)
    if workload == "W4":
        return ds.map_batches(
            Generator, fn_constructor_args=(args.model, args.max_new_tokens), compute=pool, batch_size=args.batch
        )
    if workload == "W6":
        scored = ds.map_batches(Scorer, fn_constructor_args=(args.model, args.features.split(",")), compute=pool)
        return scored.groupby("user_id").map_groups(top_k, fn_args=(args.top_k,))
    raise SystemExit(f"unknown workload {workload!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = peer_arguments("bench.peers.ray_data", ("W1", "W1L", "W4", "W5", "W6"))
    parser.add_argument(
        "--fixed-pool",
        dest="autoscale",
        action="store_false",
        help="a fixed pool of one actor per core, as the guide writes it (hangs on 2 cores)",
    )
    args = parser.parse_args(argv)

    import ray

    started = time.perf_counter()
    ray.init()
    try:
        build(args.workload, args).write_delta(args.output)
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
    write_timings(args.timings, args.output, seconds, "ray", ray.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
