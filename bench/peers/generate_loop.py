"""W4's plain peer: one process, no Spark, transformers' own ``model.generate`` over every prompt.

The prompts (``id``, ``prompt`` Parquet) are tokenized as the tokenizer gives them, sorted by length and
cut into batches of ``--batch``; each batch is left-padded and run through
``model.generate(do_sample=False, max_new_tokens=...)`` with torch's default threads. A row's new tokens
end at its first EOS (kept, as lakescore counts it); the text is their decoding without special tokens.
Outputs go to Parquet (``id``, ``generated_text``, ``completion_tokens``), the timings to JSON:
``generate_seconds`` (time inside ``generate``, model load and tokenization excluded), ``tokens_out``,
``tokens_in``, ``load_seconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import pandas as pd


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.peers.generate_loop")
    parser.add_argument("--input", required=True, help="Parquet file or directory with id, prompt")
    parser.add_argument("--model", required=True, help="a causal language model directory (save_pretrained)")
    parser.add_argument("--output", required=True, help="Parquet file to write (id, generated_text, completion_tokens)")
    parser.add_argument("--timings", required=True, help="JSON file to write the timings to")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32, help="prompts per generate call")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    frame = pd.read_parquet(args.input, columns=["id", "prompt"])
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    loaded = time.perf_counter() - started
    ids = tokenizer(frame["prompt"].tolist())["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    texts: list[str | None] = [None] * len(ids)
    counts = [0] * len(ids)
    in_generate = 0.0
    for start in range(0, len(order), args.batch):
        rows = order[start : start + args.batch]
        batch = tokenizer.pad({"input_ids": [ids[i] for i in rows]}, return_tensors="pt")
        began = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=pad)
        in_generate += time.perf_counter() - began
        for i, new in zip(rows, out[:, batch["input_ids"].shape[1] :].tolist()):
            if eos in new:
                new = new[: new.index(eos) + 1]
            texts[i], counts[i] = tokenizer.decode(new, skip_special_tokens=True), len(new)
    pd.DataFrame({"id": frame["id"], "generated_text": texts, "completion_tokens": counts}).to_parquet(
        args.output, index=False
    )
    with open(args.timings, "w", encoding="utf-8") as handle:
        json.dump(
            {
                "generate_seconds": in_generate,
                "tokens_out": sum(counts),
                "tokens_in": sum(len(r) for r in ids),
                "load_seconds": loaded,
                "threads": torch.get_num_threads(),
                "batch": args.batch,
            },
            handle,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
