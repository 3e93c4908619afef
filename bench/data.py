"""Seeded benchmark inputs, written as Parquet (``review_id`` long, ``body`` string).

* **W1 – reviews**: product reviews whose word counts are log-normal
  (``W1_LOG_MEAN``, ``W1_LOG_SIGMA``; clipped to 4..1,500 words): mostly short,
  with a long tail that runs past the model's 256-token limit. The parameters
  are calibrated so that a plain length-sorted single-process loop with batch 64
  reaches roughly 150-250 rows/s on a 2-core machine, and a loop over the same
  rows in table order several times less (every 64-row batch pads to its longest row).
* **W2 – short texts**: 8-16 words each, uniform; padding costs nothing here,
  so it shows fixed per-row and per-batch overheads.

The same seed always gives the same rows, so every peer and every machine
scores identical text. The W1 prefix used by slow peers is the first rows of W1.
Each table is a directory of :data:`FILES` Parquet files, like a warehouse table.

**Repetition is a stated parameter, not an accident of the generator.** Every generated review
opens with a short, high-entropy head ("Sturdy kettle, recommended overall."), so two reviews share their
text only by choice: a share ``stock_share`` of the rows are stock one-liners ("Great product!",
drawn Zipf-like from :data:`STOCK_REVIEWS`), as real review tables have. W1 uses
:data:`W1_STOCK_SHARE`; W3 (incremental scoring) :data:`W3_STOCK_SHARE`. :func:`repetition` measures
what a table actually has. (Before this, a 3-word review was the first 3 words of one of six
openers, so 61% of W1's rows repeated another row's text: an artefact that made deduplication look
better than it would on real data. The minimum length went from 3 to 4 words with the head.)

Calibration (2-core VM, torch 2.10, 1,000-1,500 rows, batch 64): with
``W1_LOG_MEAN`` 2.1 and ``W1_LOG_SIGMA`` 1.1 (median 7 words, mean 14, p99 ~100)
``SentenceTransformer.encode`` (length-sorted) ran at 170-200 rows/s and the
same loop over 64-row chunks in table order at ~40 rows/s.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "FILES",
    "W1_LOG_MEAN",
    "W1_LOG_SIGMA",
    "W1_STOCK_SHARE",
    "W3_STOCK_SHARE",
    "STOCK_REVIEWS",
    "review_bodies",
    "short_bodies",
    "write_table",
    "repetition",
    "changed_table",
]

FILES = 4
"""Parquet files per table. Spark reads one partition per file, so every Spark peer gets
several tasks and uses every core of a small machine without repartitioning (a
single-file input would give the naive peers one task: one core, since Spark
starts Python workers with ``OMP_NUM_THREADS`` = task CPUs)."""

W1_LOG_MEAN = 2.1
W1_LOG_SIGMA = 1.1
W1_STOCK_SHARE = 0.05
"""W1: share of rows that are stock one-liners (so ~5% of rows repeat another row's text)."""
W3_STOCK_SHARE = 0.18
"""W3: share of stock one-liners; the spec asks for >= 15% of rows sharing their text with another row."""
_MIN_WORDS, _MAX_WORDS = 4, 1500

_PRODUCTS = [
    "kettle",
    "backpack",
    "desk lamp",
    "blender",
    "pair of running shoes",
    "headset",
    "tent",
    "coffee grinder",
    "office chair",
    "phone case",
    "water bottle",
    "keyboard",
    "rice cooker",
    "paperback",
    "yoga mat",
    "toaster",
    "drill",
    "monitor stand",
    "suitcase",
    "air purifier",
]
_OPENERS = [
    "I bought this {p} for my {who}",
    "We have used the {p} for {n} weeks now",
    "Ordered the {p} after reading a lot of reviews",
    "This is my second {p} from this brand",
    "Picked up the {p} on sale",
    "The {p} replaced an old one that finally died",
]
_VERDICTS = [
    "it works exactly as described",
    "it feels solid and well made",
    "setup took about five minutes",
    "it is quieter than I expected",
    "it stopped working after a week",
    "the finish scratches easily",
    "the battery barely lasts a day",
    "the instructions were confusing",
    "a screw was missing from the box",
    "it looks even better in person",
    "it is smaller than the photos suggest",
    "it smells of plastic at first",
]
_DETAILS = [
    "Customer service answered {speed}.",
    "Shipping took {n} days and the box was {state}.",
    "My {who} uses it every day without complaints.",
    "I compared it with two other brands before buying.",
    "The color is a little {shade} than on the website.",
    "For the price it is {verdict} a good deal.",
    "After {n} weeks it still {cond}.",
    "The manual is short but readable.",
    "I would {verdict} recommend it to a friend.",
    "Cleaning it is {ease}, which matters to me.",
    "It fits nicely on the {place} and does not wobble.",
    "Returns were {ease} when the first one arrived broken.",
]
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


_HEAD_ADJECTIVES = [
    "Sturdy",
    "Flimsy",
    "Lovely",
    "Cheap",
    "Decent",
    "Solid",
    "Noisy",
    "Compact",
    "Bulky",
    "Handy",
    "Stylish",
    "Clunky",
    "Reliable",
    "Fragile",
    "Heavy",
    "Light",
    "Elegant",
    "Basic",
    "Premium",
    "Tiny",
    "Huge",
    "Quiet",
    "Sleek",
    "Awkward",
    "Simple",
    "Clever",
    "Pricey",
    "Budget",
    "Shiny",
    "Matte",
    "Rugged",
    "Delicate",
    "Smart",
    "Dated",
    "Modern",
    "Classic",
    "Odd",
    "Neat",
    "Bright",
    "Dull",
]
_HEAD_CODAS = [
    "overall",
    "honestly",
    "really",
    "mostly",
    "truly",
    "frankly",
    "basically",
    "arguably",
    "definitely",
    "surely",
    "seriously",
    "admittedly",
    "largely",
    "generally",
    "clearly",
    "apparently",
    "oddly",
    "thankfully",
    "sadly",
    "luckily",
]
_HEAD_VERDICTS = [
    "recommended",
    "disappointing",
    "overpriced",
    "perfect",
    "meh",
    "returned",
    "fantastic",
    "okay",
    "superb",
    "adequate",
    "mediocre",
    "brilliant",
    "underwhelming",
    "solid",
    "acceptable",
    "terrible",
    "lovely",
    "worthwhile",
    "pointless",
    "great",
    "fine",
    "awful",
    "excellent",
    "passable",
    "impressive",
    "flawed",
    "charming",
    "reliable",
    "annoying",
    "wonderful",
    "useful",
    "useless",
    "sturdy",
    "good",
    "bad",
    "nice",
    "poor",
    "amazing",
    "decent",
    "average",
]
STOCK_REVIEWS = [
    "Great product!",
    "Love it!",
    "Works as described.",
    "Five stars.",
    "Does the job.",
    "Good value for money.",
    "Not worth it.",
    "Exactly what I needed.",
    "Arrived broken.",
    "Would buy again.",
    "Very happy with it.",
    "Fast shipping.",
    "As expected.",
    "Perfect gift.",
    "Cheap and cheerful.",
    "Stopped working.",
    "Highly recommend!",
    "Great quality.",
    "Too small.",
    "Returned it.",
    "Good.",
    "Excellent!",
    "OK.",
    "Awesome product",
    "Waste of money.",
    "Just as pictured.",
    "Kids love it.",
    "Better than expected.",
    "Meh.",
    "Thank you!",
]
"""Stock one-liners, the repeated texts of a review table; drawn with weight 1/rank (Zipf-like)."""
_STOCK_WEIGHTS = [1 / rank for rank in range(1, len(STOCK_REVIEWS) + 1)]


def _fill(rng: random.Random, template: str, product: str) -> str:
    return template.format(p=product, **{k: rng.choice(v) for k, v in _FILL.items()})


def _words(rng: random.Random, count: int) -> str:
    """``count`` words of review prose about one product, opening with a high-entropy four-word head
    (640,000 heads per product noun), so that reviews of equal length rarely coincide."""
    product = rng.choice(_PRODUCTS)
    head = (
        f"{rng.choice(_HEAD_ADJECTIVES)} {product.split()[-1]}, {rng.choice(_HEAD_VERDICTS)} {rng.choice(_HEAD_CODAS)}."
    )
    words = (head + " " + _fill(rng, rng.choice(_OPENERS), product) + " and " + rng.choice(_VERDICTS) + ".").split()
    while len(words) < count:
        words.extend(_fill(rng, rng.choice(_DETAILS), product).split())
    return " ".join(words[:count])


def review_bodies(
    rows: int,
    seed: int = 20261121,
    log_mean: float = W1_LOG_MEAN,
    log_sigma: float = W1_LOG_SIGMA,
    stock_share: float = W1_STOCK_SHARE,
) -> Iterator[str]:
    """W1: ``rows`` review texts with log-normal word counts, ``stock_share`` of them stock one-liners
    (the first n rows never depend on ``rows``)."""
    rng = random.Random(seed)
    for _ in range(rows):
        count = int(rng.lognormvariate(log_mean, log_sigma))
        if rng.random() < stock_share:
            yield rng.choices(STOCK_REVIEWS, weights=_STOCK_WEIGHTS)[0]
        else:
            yield _words(rng, min(_MAX_WORDS, max(_MIN_WORDS, count)))


def short_bodies(rows: int, seed: int = 20261122) -> Iterator[str]:
    """W2: ``rows`` texts of 8-16 words each (uniform)."""
    rng = random.Random(seed)
    for _ in range(rows):
        yield _words(rng, rng.randint(8, 16))


def write_table(bodies: Iterator[str], path: Path, files: int = FILES, ids: np.ndarray | None = None) -> int:
    """Write ``bodies`` with ids 1..n (or ``ids``) as a directory of ``files`` Parquet files (contiguous ranges);
    return n."""
    frame = pd.DataFrame({"body": list(bodies)})
    frame.insert(0, "review_id", pd.RangeIndex(1, len(frame) + 1, dtype="int64") if ids is None else ids)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    bounds = np.linspace(0, len(frame), num=max(1, min(files, len(frame))) + 1).astype(int)
    for part, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        frame.iloc[start:stop].to_parquet(path / f"part-{part:05d}.parquet", index=False)
    return len(frame)


def repetition(bodies: list[str]) -> str:
    """How much a table repeats itself: the share of rows whose text another row also has, and distinct texts."""
    counts = Counter(bodies)
    shared = sum(n for n in counts.values() if n > 1)
    return (
        f"{shared / max(1, len(bodies)):.1%} of rows share their text with another row; "
        f"{len(counts):,} distinct texts in {len(bodies):,} rows"
    )


def changed_table(
    source: Path, target: Path, edit: float, insert: float, delete: float, seed: int = 20261123
) -> dict[str, int]:
    """Write ``target``: ``source`` after a day of changes: ``edit`` of its rows get a new text, ``delete`` of them
    disappear, and ``insert`` x its row count new rows (new ids after the largest) arrive. Rows to edit and
    delete are drawn without overlap by a seeded generator. Returns the counts of each change."""
    frame = pd.read_parquet(source).sort_values("review_id", ignore_index=True)
    rng = np.random.default_rng(seed)
    n = len(frame)
    picked = rng.permutation(n)
    edited, deleted = picked[: round(edit * n)], picked[round(edit * n) : round(edit * n) + round(delete * n)]
    fresh = list(review_bodies(len(edited) + round(insert * n), seed=seed, stock_share=0.0))
    frame.loc[edited, "body"] = [f"Update: {text}" for text in fresh[: len(edited)]]
    frame = frame.drop(index=deleted)
    added = pd.DataFrame(
        {"review_id": np.arange(n + 1, n + 1 + len(fresh) - len(edited), dtype="int64"), "body": fresh[len(edited) :]}
    )
    frame = pd.concat([frame, added], ignore_index=True)
    write_table(iter(frame["body"]), target, ids=frame["review_id"].to_numpy())
    return {"edited": len(edited), "inserted": len(added), "deleted": len(deleted)}
