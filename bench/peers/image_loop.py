"""W5's plain peer: one process, no Spark: Pillow, the model's own image processor and the model, over every image.

The images come from a Parquet table (``id``, ``image`` binary; ``--shape table``) or from every file under a folder
(``--shape folder``; the id is the file's path under it). Each batch of ``--batch`` images, in input order, is
decoded as transformers' ``load_image`` decodes (Pillow opens the bytes, the EXIF orientation is applied, the
image is converted to RGB), prepared by ``AutoImageProcessor`` and run through
``AutoModelForImageClassification`` with torch's default threads; the probabilities are the softmax of the logits,
as the image-classification pipeline computes them. Outputs go to Parquet (``id``, ``label``, ``probs``), the
timings to JSON: ``forward_seconds`` (time inside the model), ``decode_seconds``, ``preprocess_seconds``,
``load_seconds`` (imports and the model), ``images``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd


def _images(source: str, shape: str) -> Iterator[tuple[object, bytes]]:
    """(id, encoded bytes) of every image, in order: the table's rows, or the folder's files sorted by path."""
    if shape == "table":
        frame = pd.read_parquet(source, columns=["id", "image"])
        yield from zip(frame["id"].tolist(), frame["image"].tolist())
        return
    root = Path(source)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        yield path.relative_to(root).as_posix(), path.read_bytes()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.image_loop")
    parser.add_argument(
        "--input", required=True, help="Parquet file or directory with id, image; or a folder of images"
    )
    parser.add_argument("--shape", choices=("table", "folder"), default="table", help="what --input is")
    parser.add_argument("--model", required=True, help="an image classifier directory (save_pretrained)")
    parser.add_argument("--output", required=True, help="Parquet file to write (id, label, probs)")
    parser.add_argument("--timings", required=True, help="JSON file to write the timings to")
    parser.add_argument("--batch", type=int, default=32, help="images per forward")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    import torch
    from PIL import Image, ImageOps
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    processor = AutoImageProcessor.from_pretrained(args.model)
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    labels = model.config.id2label
    loaded = time.perf_counter() - started
    ids: list = []
    out_labels: list[str] = []
    probs: list[list[float]] = []
    seconds = {"decode": 0.0, "preprocess": 0.0, "forward": 0.0}
    batch: list[tuple[object, bytes]] = []

    def run(batch: list[tuple[object, bytes]]) -> None:
        began = time.perf_counter()
        images = []
        for _, data in batch:
            image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
            images.append(image.convert("RGB"))
        decoded = time.perf_counter()
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        prepared = time.perf_counter()
        with torch.inference_mode():
            logits = model(pixel_values=pixels).logits
        done = time.perf_counter()
        seconds["decode"] += decoded - began
        seconds["preprocess"] += prepared - decoded
        seconds["forward"] += done - prepared
        p = logits.float().softmax(-1).double().numpy()
        ids.extend(i for i, _ in batch)
        out_labels.extend(labels[int(k)] for k in p.argmax(axis=1))
        probs.extend(p.tolist())

    for item in _images(args.input, args.shape):
        batch.append(item)
        if len(batch) == args.batch:
            run(batch)
            batch = []
    if batch:
        run(batch)
    pd.DataFrame({"id": ids, "label": out_labels, "probs": probs}).to_parquet(args.output, index=False)
    with open(args.timings, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "forward_seconds": seconds["forward"],
                "decode_seconds": seconds["decode"],
                "preprocess_seconds": seconds["preprocess"],
                "load_seconds": loaded,
                "images": len(ids),
                "threads": torch.get_num_threads(),
                "batch": args.batch,
            },
            handle,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
