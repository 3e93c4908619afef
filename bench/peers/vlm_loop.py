"""W10's plain peer: one process, no Spark, transformers' own processor and ``model.generate`` over every image.

The images (``id``, ``image`` binary, ``prompt`` Parquet) are decoded with Pillow (RGB), each row's chat (one user
message: the image part, then the prompt) rendered by the processor's chat template, and batches of ``--batch`` rows
processed together (left-padded) and run through ``model.generate(do_sample=False, max_new_tokens=...)`` with torch's
default threads. A row's new tokens end at its first EOS (kept, as lakescore counts it). Outputs go to Parquet (``id``,
``generated_text``, ``completion_tokens``), the timings to JSON: ``generate_seconds`` (time inside ``generate``),
``tokens_out``, ``load_seconds``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Sequence

import pandas as pd


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.vlm_loop")
    parser.add_argument("--input", required=True, help="Parquet file or directory with id, image, prompt")
    parser.add_argument("--model", required=True, help="a vision-language model directory with its processor")
    parser.add_argument("--output", required=True)
    parser.add_argument("--timings", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    frame = pd.read_parquet(args.input, columns=["id", "image", "prompt"])
    processor = AutoProcessor.from_pretrained(args.model)
    processor.tokenizer.padding_side = "left"
    model = AutoModelForImageTextToText.from_pretrained(args.model).eval()
    loaded = time.perf_counter() - started
    eos, pad = processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id
    texts, counts = [None] * len(frame), [0] * len(frame)
    in_generate = 0.0
    for start in range(0, len(frame), args.batch):
        rows = range(start, min(start + args.batch, len(frame)))
        images = [Image.open(io.BytesIO(frame["image"].iloc[i])).convert("RGB") for i in rows]
        chats = [
            processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": frame["prompt"].iloc[i]}]}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for i in rows
        ]
        batch = processor(images=images, text=chats, padding=True, add_special_tokens=False, return_tensors="pt")
        began = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=pad)
        in_generate += time.perf_counter() - began
        for i, new in zip(rows, out[:, batch["input_ids"].shape[1] :].tolist()):
            if eos in new:
                new = new[: new.index(eos) + 1]
            texts[i], counts[i] = processor.decode(new, skip_special_tokens=True), len(new)
    pd.DataFrame({"id": frame["id"], "generated_text": texts, "completion_tokens": counts}).to_parquet(
        args.output, index=False
    )
    with open(args.timings, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "generate_seconds": in_generate,
                "tokens_out": sum(counts),
                "load_seconds": loaded,
                "threads": torch.get_num_threads(),
                "batch": args.batch,
            },
            handle,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
