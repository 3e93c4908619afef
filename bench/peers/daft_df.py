"""Daft's side of the side-by-side bench: each workload with Daft's own AI functions where it has one, as its docs
write them, on Daft's default (native) runner.

Run in the peers' environment (``build/peers-env``), one whole process per run:
``python -m bench.peers.daft_df --workload W1 --input ... --model ... --output <delta> --timings <json>``.
Every workload reads the same Parquet as lakescore with ``daft.read_parquet`` and writes Delta with
``DataFrame.write_deltalake``:

* W1 / W1L: ``embed_text(provider="transformers", model=<MiniLM directory>)``;
* W4: ``prompt(provider="transformers", model=<Llama directory>)`` with the bench's generation options (greedy,
  32 new tokens), which the provider forwards to the ``text-generation`` pipeline;
* W5: a ``@daft.cls`` class with a batch method (Pillow decode with the EXIF orientation, the model's processor,
  the classifier): ``classify_image`` with the transformers provider builds a zero-shot (CLIP-style) pipeline,
  which cannot load W5's fixed-label ViT classifier;
* W6: a ``@daft.cls`` class with a batch method over the feature columns, then ``row_number()`` over a window
  per user.

``--timings`` gets the output's rows and the seconds from the read to the committed table.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Sequence

import numpy as np

from bench.peers.program import peer_arguments, write_timings


def embeddings(df, args):
    from daft import col
    from daft.functions import embed_text

    return df.select("review_id", embed_text(col("body"), provider="transformers", model=args.model).alias("embedding"))


def generations(df, args):
    from daft import col
    from daft.functions import prompt

    text = prompt(
        col("prompt"), provider="transformers", model=args.model, max_new_tokens=args.max_new_tokens, do_sample=False
    )
    return df.select("id", text.alias("generated_text"))


def labels(df, args):
    import daft
    from daft import DataType, col

    # Imported here, once: Daft builds its instances in threads, and transformers' lazy imports race there.
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    @daft.cls
    class Classifier:
        def __init__(self, model: str):
            self.processor = AutoImageProcessor.from_pretrained(model)
            self.model = AutoModelForImageClassification.from_pretrained(model).eval()

        @daft.method.batch(return_dtype=DataType.string(), batch_size=args.batch)
        def __call__(self, images):
            import torch
            from PIL import Image, ImageOps

            decoded = [ImageOps.exif_transpose(Image.open(io.BytesIO(b))).convert("RGB") for b in images.to_pylist()]
            with torch.inference_mode():
                logits = self.model(**self.processor(images=decoded, return_tensors="pt")).logits
            return [self.model.config.id2label[int(k)] for k in logits.argmax(-1)]

    return df.select("id", Classifier(args.model)(col("image")).alias("label"))


def top_rows(df, args):
    import daft
    import torch  # on the main thread, once: a first torch import inside Daft's UDF threads hangs the job
    from daft import DataType, col
    from daft.functions import row_number
    from daft.window import Window

    features = args.features.split(",")

    @daft.cls
    class Scorer:  # a class, as Daft's error for a function holding a model says: the program loads once per instance
        def __init__(self, model: str):
            self.program = torch.jit.load(model, map_location="cpu").eval()

        @daft.method.batch(return_dtype=DataType.float64())
        def __call__(self, *columns):
            matrix = torch.from_numpy(np.stack([c.to_arrow().to_numpy() for c in columns], axis=1).astype(np.float32))
            with torch.inference_mode():
                return self.program(matrix).reshape(len(matrix)).double().numpy()

    best = Window().partition_by("user_id").order_by("score", "item_id", desc=[True, False])
    scored = df.select("user_id", "item_id", Scorer(args.model)(*[col(f) for f in features]).alias("score"))
    ranked = scored.with_column("rank", row_number().over(best).cast(DataType.int32()))
    return ranked.where(col("rank") <= args.top_k)


PIPELINES = {"W1": embeddings, "W1L": embeddings, "W4": generations, "W5": labels, "W6": top_rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = peer_arguments("bench.peers.daft_df", PIPELINES)
    args = parser.parse_args(argv)

    import daft

    started = time.perf_counter()
    PIPELINES[args.workload](daft.read_parquet(args.input), args).write_deltalake(args.output)
    seconds = time.perf_counter() - started
    write_timings(args.timings, args.output, seconds, "daft", daft.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
