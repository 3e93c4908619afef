"""C1: int8 and bfloat16 on a trained classifier, against float32 (issue 13's classification tolerance).

The bench's peers all embed; this workload asks whether ``--quantize int8`` and ``--dtype bfloat16`` keep a
classifier's answers.
It builds one, seeded: all-MiniLM-L6-v2's body and pooler in ``BertForSequenceClassification`` with a
3-label head (negative, neutral, positive) trained, body frozen, on :data:`TRAIN_ROWS` bench reviews labelled
by the sentiment of their verdict word ("Sturdy kettle, *disappointing* overall."), which leaves the
neutral ones to the model. Then lakescore's own classify head (the code a job runs) scores the first
:data:`W1_ROWS` W1 reviews and :data:`W2_ROWS` W2 texts on float32 torch, on the int8 ONNX graph and on bfloat16
torch, and the head's own fidelity figures of each reduced-precision path are compared with the job's default
:class:`~lakescore.udfs.models.quantize.Tolerance`: what a run's preflight would decide on such input.

Run after the timed runs, as one child process (``python -m bench.classifier OUT_DIR``) writing
``c1.json``: the orchestrator never imports torch. Fidelity only: no speed is measured here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["C1", "C1Result", "run_c1", "c1_lines"]

C1 = "C1"
TRAIN_ROWS, W1_ROWS, W2_ROWS = 2_000, 1_500, 500
TRAIN_SEED = 7
_POSITIVE = {
    "recommended",
    "perfect",
    "fantastic",
    "superb",
    "brilliant",
    "solid",
    "lovely",
    "worthwhile",
    "great",
    "excellent",
    "impressive",
    "charming",
    "reliable",
    "wonderful",
    "useful",
    "sturdy",
    "good",
    "nice",
    "amazing",
}
_NEGATIVE = {
    "disappointing",
    "overpriced",
    "returned",
    "mediocre",
    "underwhelming",
    "terrible",
    "pointless",
    "awful",
    "flawed",
    "annoying",
    "useless",
    "bad",
    "poor",
    "meh",
}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


@dataclass
class C1Result:
    """What the child process measured (``None`` fields when it failed; ``error`` says why)."""

    held_out_accuracy: float | None
    figures: dict[str, dict[str, dict[str, float]]]
    """Path (``int8``, ``bfloat16``) -> workload (``W1``, ``W2``) -> the classify head's fidelity figures against
    float32."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def run_c1(work_dir: Path, env: dict[str, str], repo: Path) -> C1Result:
    """Build the classifier under ``work_dir`` and measure it in a child process."""
    work_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "bench.classifier", str(work_dir)], env=env, cwd=repo, capture_output=True, text=True
    )
    found = work_dir / "c1.json"
    if done.returncode != 0 or not found.is_file():
        return C1Result(None, {}, error=(done.stderr.strip().splitlines() or ["no output"])[-1])
    measured = json.loads(found.read_text())
    return C1Result(measured["held_out_accuracy"], measured["figures"])


def c1_lines(result: C1Result) -> list[str]:
    """The C1 figures, each with the default tolerance and met / NOT met."""
    from lakescore.udfs.models.quantize import Tolerance

    if not result.ok:
        return [f"C1 int8 / bfloat16 classifier: not measured ({result.error})"]
    limits = Tolerance()
    lines = [
        f"C1 model: MiniLM body and pooler, 3-label sentiment head trained (body frozen) on {TRAIN_ROWS:,} bench "
        f"reviews; held-out accuracy {result.held_out_accuracy:.3f}"
    ]
    for path, workloads in result.figures.items():
        for workload, found in workloads.items():
            met = found["agreement"] >= limits.min_agreement and found["prob_delta_p99"] <= limits.max_prob_delta
            lines.append(
                f"C1 {path} vs float32 torch ({workload}, {found['rows']:,.0f} rows): label agreement "
                f"{found['agreement']:.4f}, probability difference p99 {found['prob_delta_p99']:.4f} (max "
                f"{found['prob_delta_max']:.4f})   target agreement >= {limits.min_agreement:g} and p99 difference <= "
                f"{limits.max_prob_delta:g}: {'met' if met else 'NOT met'}"
            )
    return lines


def _verdict_label(text: str) -> int:
    words = text.split()
    verdict = words[2].strip(",.").lower() if len(words) > 2 else ""
    return 2 if verdict in _POSITIVE else 0 if verdict in _NEGATIVE else 1


def _build(model_dir: Path) -> float:
    """Train the head and save the classifier to ``model_dir``; return its held-out accuracy."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from bench.data import review_bodies
    from bench.model import model_dir as minilm_dir

    texts = list(review_bodies(TRAIN_ROWS, seed=TRAIN_SEED, stock_share=0.0))
    labels = torch.tensor([_verdict_label(t) for t in texts])
    source = str(minilm_dir())
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(TRAIN_SEED)
    model = BertForSequenceClassification.from_pretrained(
        source,
        num_labels=len(LABELS),
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    ).eval()
    with torch.no_grad():  # not inference_mode: the head trains on these features below
        pooled = torch.cat(
            [
                model.bert(
                    **tokenizer(texts[i : i + 64], padding=True, truncation=True, max_length=48, return_tensors="pt")
                ).pooler_output
                for i in range(0, len(texts), 64)
            ]
        )
    split = TRAIN_ROWS * 4 // 5
    optimizer = torch.optim.Adam(model.classifier.parameters(), lr=0.05)
    for _ in range(300):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model.classifier(pooled[:split]), labels[:split]).backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = float((model.classifier(pooled[split:]).argmax(1) == labels[split:]).float().mean())
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return accuracy


def _measure(work_dir: Path) -> dict:
    import numpy as np

    from bench.data import review_bodies, short_bodies
    from lakescore.udfs.batching import BatchPolicy, score_texts
    from lakescore.udfs.models.model_source import ModelSpec
    from lakescore.udfs.registry import get_task

    model_dir = work_dir / "sentiment-classifier"
    accuracy = _build(model_dir)
    classify = get_task("classify")
    policy = BatchPolicy(max_tokens=4096, max_rows=64)
    float32 = ModelSpec("classify", str(model_dir), cache_dir=str(work_dir / "cache"))
    heads = {
        name: classify.load(spec, model_dir)
        for name, spec in (
            ("float32", float32),
            ("int8", replace(float32, backend="onnx", quantize="int8")),
            ("bfloat16", replace(float32, dtype="bfloat16")),
        )
    }
    figures: dict[str, dict] = {"int8": {}, "bfloat16": {}}
    for workload, texts in (("W1", list(review_bodies(W1_ROWS))), ("W2", list(short_bodies(W2_ROWS)))):
        reference = np.asarray(score_texts(texts, heads["float32"], policy).outputs)
        for path in figures:
            outputs = np.asarray(score_texts(texts, heads[path], policy).outputs)
            figures[path][workload] = {**heads[path].fidelity(reference, outputs), "rows": len(texts)}
    return {"held_out_accuracy": accuracy, "figures": figures}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    (out / "c1.json").write_text(json.dumps(_measure(out), indent=2))
