"""W10: images with prompts (issue 60): ``lakescore score --task generate --image-col`` against a plain loop.

A seeded LLaVA-shaped model (:func:`make_w10_model`: a CLIP vision tower over 224 x 224 images in patches of 32, 49
image tokens, and a Llama of :data:`TEXT_SHAPE`) is built from a config and saved with its processor (image
processor, W4's tokenizer with an ``<image>`` token, a chat template) into the bench's data dir; nothing is downloaded.
``rows`` generated product pictures (:func:`tests.tiny_vision.picture`, PNG, sizes varying) with the prompt
:data:`PROMPT` get :data:`W10_NEW_TOKENS` new tokens each, greedy, from

1. ``lakescore``: ``lakescore score --task generate --image-col image --prompt-template ...``, one whole process;
2. ``loop``: :mod:`bench.peers.vlm_loop`, one process: processor and ``model.generate`` in batches of 16.

They run alternately (``repeats`` each); figures are medians, whole process wall time and generated tokens/s while
generating. Target (printed, never enforced): lakescore's whole process >= 1.0x the loop's. Not in ``make bench``'s
default workloads: run ``python -m bench.vlm_generation --rows 500``. Daft's and Ray Data's image prompts call hosted
models (Daft's ``prompt`` with an OpenAI provider; Ray's ``ray.data.llm`` through vLLM), so neither runs here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from bench.generation import LOOP_ENV  # the loop's OpenMP threads sleep at a barrier, as W4's loop runs

W10 = "W10"
W10_ROWS = 500
W10_NEW_TOKENS = 32
W10_SEED = 20261128
PROMPT = "Write a one-line caption for this photo of a {category}."
CATEGORIES = ("lamp", "mug", "chair", "desk", "rug", "vase", "shelf")
TEXT_SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
}
VISION_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 224,
    "patch_size": 32,
    "projection_dim": 128,
}


def make_w10_model(target: Path) -> Path:
    """W10's seeded LLaVA-shaped model and its processor, saved in ``target``."""
    import torch
    import transformers

    from bench.generation import _tokenizer
    from tests.tiny_vlms import CHAT_TEMPLATE

    tokenizer = _tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    text = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TEXT_SHAPE,
    )
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**VISION_SHAPE),
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    torch.manual_seed(W10_SEED)
    transformers.LlavaForConditionalGeneration(config).eval().save_pretrained(target)
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    transformers.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=32,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(target)
    return target


def make_w10_data(target: Path, rows: int) -> Path:
    """``rows`` PNG pictures (``id``, ``image``, ``category``, and the rendered ``prompt`` for the loop), one Parquet
    file."""
    from tests.tiny_vision import encoded, picture

    target.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(
        {
            "id": range(1, rows + 1),
            "image": [
                encoded(picture(160 + (i * 37) % 200, 120 + (i * 53) % 160, W10_SEED + i), "PNG") for i in range(rows)
            ],
            "category": [CATEGORIES[i % len(CATEGORIES)] for i in range(rows)],
        }
    )
    frame["prompt"] = [PROMPT.format(category=c) for c in frame["category"]]
    frame.to_parquet(target / "part-00000.parquet", index=False)
    return target


def commands(table: Path, model: Path, run_dir: Path) -> dict[str, list[str]]:
    return {
        "lakescore": [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            "--input",
            str(table),
            "--input-format",
            "parquet",
            "--output",
            str(run_dir / "delta"),
            "--task",
            "generate",
            "--model",
            str(model),
            "--id-col",
            "id",
            "--image-col",
            "image",
            "--prompt-template",
            PROMPT,
            "--max-new-tokens",
            str(W10_NEW_TOKENS),
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
            "bench.peers.vlm_loop",
            "--input",
            str(table),
            "--model",
            str(model),
            "--output",
            str(run_dir / "generated.parquet"),
            "--timings",
            str(run_dir / "timings.json"),
            "--max-new-tokens",
            str(W10_NEW_TOKENS),
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.vlm_generation")
    parser.add_argument("--rows", type=int, default=W10_ROWS)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dir", default="build/bench/w10")
    args = parser.parse_args(argv)
    root = Path(args.dir).resolve()
    model = make_w10_model(root / "model") if not (root / "model" / "config.json").is_file() else root / "model"
    table = make_w10_data(root / f"images_{args.rows}", args.rows)
    walls: dict[str, list[float]] = {"lakescore": [], "loop": []}
    rates: dict[str, list[float]] = {"lakescore": [], "loop": []}
    for repeat in range(args.repeats):
        for peer in ("lakescore", "loop"):
            run_dir = root / "runs" / f"{peer}-{repeat}"
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            run_dir.mkdir(parents=True)
            began = time.perf_counter()
            subprocess.run(
                commands(table, model, run_dir)[peer],
                check=True,
                cwd=Path(__file__).resolve().parents[1],
                env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(LOOP_ENV if peer == "loop" else {})},
            )
            walls[peer].append(time.perf_counter() - began)
            if peer == "lakescore":
                report = json.loads((run_dir / "report.json").read_text())
                rates[peer].append(report["workers"]["tokens_out"] / report["step_seconds"]["score_stage"])
            else:
                timings = json.loads((run_dir / "timings.json").read_text())
                rates[peer].append(timings["tokens_out"] / timings["generate_seconds"])
            print(
                f"{W10} {peer} run {repeat + 1}: {walls[peer][-1]:.1f} s whole process, {rates[peer][-1]:.1f} "
                "generated tokens/s while generating",
                flush=True,
            )
    import pyarrow.parquet as pq

    from bench.equivalence import delta_files

    ours = pq.read_table(
        delta_files(root / "runs" / "lakescore-0" / "delta"), columns=["id", "generated_text"]
    ).to_pandas()
    theirs = pd.read_parquet(root / "runs" / "loop-0" / "generated.parquet", columns=["id", "generated_text"])
    both = ours.merge(theirs, on="id", suffixes=("_lakescore", "_loop"))
    equal = int((both["generated_text_lakescore"] == both["generated_text_loop"]).sum())
    ratio = statistics.median(walls["loop"]) / statistics.median(walls["lakescore"])
    print(
        f"{W10}: {args.rows} images, {W10_NEW_TOKENS} new tokens, greedy; whole process lakescore "
        f"{statistics.median(walls['lakescore']):.1f} s, loop {statistics.median(walls['loop']):.1f} s: {ratio:.2f}x "
        f"({'met' if ratio >= 1.0 else 'NOT met'}, target >= 1.0x); texts equal on {equal} of {len(both)} rows"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
