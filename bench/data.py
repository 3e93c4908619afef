"""Seeded benchmark inputs, written as Parquet (``review_id`` long, ``body`` string).

* **W1 – reviews**: product reviews whose word counts are log-normal
  (``W1_LOG_MEAN``, ``W1_LOG_SIGMA``; clipped to 3..1,500 words): mostly short,
  with a long tail that runs past the model's 256-token limit. The parameters
  are calibrated so that a plain length-sorted single-process loop with batch 64
  reaches roughly 150-250 rows/s on a 2-core machine, and a loop over the same
  rows in table order several times less (every 64-row batch pads to its longest row).
* **W2 – short texts**: 8-16 words each, uniform; padding costs nothing here,
  so it shows fixed per-row and per-batch overheads.

The same seed always gives the same rows, so every peer and every machine
scores identical text. The W1 prefix used by slow peers is the first rows of W1.
Each table is a directory of :data:`FILES` Parquet files, like a warehouse table.

Calibration (2-core VM, torch 2.10, 1,000-1,500 rows, batch 64): with
``W1_LOG_MEAN`` 2.1 and ``W1_LOG_SIGMA`` 1.1 (median 7 words, mean 14, p99 ~100)
``SentenceTransformer.encode`` (length-sorted) ran at 170-200 rows/s and the
same loop over 64-row chunks in table order at ~40 rows/s.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

__all__ = ["FILES", "W1_LOG_MEAN", "W1_LOG_SIGMA", "review_bodies", "short_bodies", "write_table"]

FILES = 4
"""Parquet files per table. Spark reads one partition per file, so every Spark peer gets
several tasks and uses every core of a small machine without repartitioning (a
single-file input would give the naive peers one task: one core, since Spark
starts Python workers with ``OMP_NUM_THREADS`` = task CPUs)."""

W1_LOG_MEAN = 2.1
W1_LOG_SIGMA = 1.1
_MIN_WORDS, _MAX_WORDS = 3, 1500

_PRODUCTS = ["kettle", "backpack", "desk lamp", "blender", "pair of running shoes", "headset", "tent",
             "coffee grinder", "office chair", "phone case", "water bottle", "keyboard", "rice cooker",
             "paperback", "yoga mat", "toaster", "drill", "monitor stand", "suitcase", "air purifier"]
_OPENERS = ["I bought this {p} for my {who}", "We have used the {p} for {n} weeks now",
            "Ordered the {p} after reading a lot of reviews", "This is my second {p} from this brand",
            "Picked up the {p} on sale", "The {p} replaced an old one that finally died"]
_VERDICTS = ["it works exactly as described", "it feels solid and well made", "setup took about five minutes",
             "it is quieter than I expected", "it stopped working after a week", "the finish scratches easily",
             "the battery barely lasts a day", "the instructions were confusing", "a screw was missing from the box",
             "it looks even better in person", "it is smaller than the photos suggest", "it smells of plastic at first"]
_DETAILS = ["Customer service answered {speed}.", "Shipping took {n} days and the box was {state}.",
            "My {who} uses it every day without complaints.", "I compared it with two other brands before buying.",
            "The color is a little {shade} than on the website.", "For the price it is {verdict} a good deal.",
            "After {n} weeks it still {cond}.", "The manual is short but readable.",
            "I would {verdict} recommend it to a friend.", "Cleaning it is {ease}, which matters to me.",
            "It fits nicely on the {place} and does not wobble.", "Returns were {ease} when the first one arrived broken."]
_FILL = {
    "who": ["partner", "daughter", "roommate", "father", "colleague", "grandmother", "son"],
    "n": ["two", "three", "five", "ten", "twelve"],
    "speed": ["within an hour", "the next morning", "after a week", "politely but slowly"],
    "state": ["dented", "pristine", "soaked", "fine"],
    "shade": ["darker", "lighter", "warmer", "duller"],
    "verdict": ["definitely", "probably", "not", "honestly"],
    "cond": ["works fine", "looks new", "rattles a bit", "needs a reset now and then"],
    "ease": ["easy", "a chore", "quick", "surprisingly simple"],
    "place": ["counter", "desk", "shelf", "nightstand"],
}


def _fill(rng: random.Random, template: str, product: str) -> str:
    return template.format(p=product, **{k: rng.choice(v) for k, v in _FILL.items()})


def _words(rng: random.Random, count: int) -> str:
    """``count`` words of review prose about one product."""
    product = rng.choice(_PRODUCTS)
    words = (_fill(rng, rng.choice(_OPENERS), product) + " and " + rng.choice(_VERDICTS) + ".").split()
    while len(words) < count:
        words.extend(_fill(rng, rng.choice(_DETAILS), product).split())
    return " ".join(words[:count])


def review_bodies(
    rows: int, seed: int = 20261121, log_mean: float = W1_LOG_MEAN, log_sigma: float = W1_LOG_SIGMA
) -> Iterator[str]:
    """W1: ``rows`` review texts with log-normal word counts (the first n rows never depend on ``rows``)."""
    rng = random.Random(seed)
    for _ in range(rows):
        count = int(rng.lognormvariate(log_mean, log_sigma))
        yield _words(rng, min(_MAX_WORDS, max(_MIN_WORDS, count)))


def short_bodies(rows: int, seed: int = 20261122) -> Iterator[str]:
    """W2: ``rows`` texts of 8-16 words each (uniform)."""
    rng = random.Random(seed)
    for _ in range(rows):
        yield _words(rng, rng.randint(8, 16))


def write_table(bodies: Iterator[str], path: Path, files: int = FILES) -> int:
    """Write ``bodies`` with ids 1..n as a directory of ``files`` Parquet files (contiguous id ranges); return n."""
    frame = pd.DataFrame({"body": list(bodies)})
    frame.insert(0, "review_id", pd.RangeIndex(1, len(frame) + 1, dtype="int64"))
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    bounds = np.linspace(0, len(frame), num=max(1, min(files, len(frame))) + 1).astype(int)
    for part, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        frame.iloc[start:stop].to_parquet(path / f"part-{part:05d}.parquet", index=False)
    return len(frame)
