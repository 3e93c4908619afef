"""W4: generation (issue 35): ``lakescore score --task generate`` against a plain ``model.generate`` loop.

A seeded Llama-shaped decoder (:func:`make_w4_model`: hidden 512, 8 layers, about 26 million parameters, a
byte-level BPE tokenizer trained with ``tokenizers`` on review texts) is built from a config and saved with
``save_pretrained`` once per bench into the bench's data dir; nothing is downloaded. The tokenizer asks for
:data:`VOCAB` tokens but gets about 1,200: the generated reviews use few distinct words, and BPE runs out of
merges within words long before 8,000. 2,000 review prompts
(``"Review: {body}\\nSummary:"`` over :func:`bench.data.review_bodies`) get 32 new tokens each, greedy, from

1. ``lakescore``: ``lakescore score --task generate`` end to end, one whole process (Spark ``local[*]``);
2. ``loop``: :mod:`bench.peers.generate_loop`, one process: length-sorted, left-padded
   ``model.generate(do_sample=False, max_new_tokens=32)`` in batches of 32, torch's default threads.

They run alternately (round-robin, ``repeats`` each) in the same sitting; figures are medians. Targets (printed
with met / NOT met, never enforced): generated tokens/s of lakescore's scoring stage (``workers.tokens_out`` over
``step_seconds.score_stage``) >= 1.5x the loop's (tokens generated over the seconds spent in ``generate``, load
excluded); whole process >= 1.0x the loop's wall time; greedy texts equal on >= 99% of rows.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from bench import data
from bench.alternating import PeerRun, PeerRuns, compare_first_good, run_alternately
from bench.equivalence import delta_files
from bench.fast_path import verdict

__all__ = [
    "W4",
    "W4_ROWS",
    "W4_REPEATS",
    "W4_NEW_TOKENS",
    "W4Result",
    "make_w4_model",
    "make_w4_data",
    "prompts",
    "peer_commands",
    "run_w4",
    "compare_texts",
    "w4_lines",
]

W4 = "W4"
W4_ROWS = 2000
W4_REPEATS = 2
W4_NEW_TOKENS = 32
W4_SEED = 20261201
PROMPT_TEMPLATE = "Review: {body}\nSummary:"
LOOP_BATCH = 32
STAGE_TARGET, WHOLE_TARGET, EQUAL_TARGET = 1.5, 1.0, 0.99
MODEL_SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
}
VOCAB = 8000
TOKENIZER_TEXTS = 20_000


def prompts(rows: int) -> list[str]:
    """W4's prompts: the first ``rows`` W1 review bodies in :data:`PROMPT_TEMPLATE`."""
    return [PROMPT_TEMPLATE.format(body=body) for body in data.review_bodies(rows)]


def make_w4_data(data_dir: Path, rows: int = W4_ROWS) -> Path:
    """Write W4's input table (``id`` long, ``prompt`` string) under ``data_dir``; return its path."""
    table = data_dir / "w4"
    data.write_table(iter(prompts(rows)), table)
    for part in sorted(table.glob("*.parquet")):  # the generate CLI contract names its columns id and prompt
        pd.read_parquet(part).rename(columns={"review_id": "id", "body": "prompt"}).to_parquet(part, index=False)
    return table


def _tokenizer():
    """A byte-level BPE tokenizer (``<pad>``, ``<s>``, ``</s>``; ``<s>`` before every text, as Llama's) trained on
    review texts of a seed of their own, so W4's prompts are not its training data."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [PROMPT_TEMPLATE.format(body=b) for b in data.review_bodies(TOKENIZER_TEXTS, seed=W4_SEED)]
    backend.train_from_iterator(texts, trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", backend.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def make_w4_model(target: Path, shape: dict | None = None, dtype: str | None = None, device: str = "cpu") -> Path:
    """Build W4's seeded Llama-shaped model (``shape``, default :data:`MODEL_SHAPE`) and its tokenizer from a config
    into ``target`` (``save_pretrained``; safetensors; in ``dtype``, default float32), initialised on ``device``; return
    ``target``. The same seed gives the same weights on every machine of one device kind."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer()
    torch.manual_seed(W4_SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **(shape or MODEL_SHAPE),
    )
    with torch.device(device):  # a large shape initialises in seconds on a GPU, not a minute of CPU
        model = LlamaForCausalLM(config)
    (model.to(getattr(torch, dtype)) if dtype else model).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def tokens_per_second(report: dict) -> float:
    """Generated tokens over the seconds spent generating: lakescore's scoring stage, the loop's ``generate`` calls."""
    if "generate_seconds" in report:
        return report["tokens_out"] / report["generate_seconds"]
    return _workers(report).get("tokens_out", 0) / report["step_seconds"]["score_stage"]


def _workers(report: dict) -> dict:
    return report.get("workers") or {}


@dataclass
class W4Result(PeerRuns):
    """Every W4 run by peer (``lakescore``, ``loop``), in run order, and the greedy comparison of their outputs."""

    rows: int
    prompt_tokens: str
    batch_tokens: int | None = None
    """lakescore's ``scoring.max_batch_tokens`` (``None``: its default)."""
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)
    equal: dict | None = None


def peer_commands(
    table: Path, model: Path, run_dir: Path, new_tokens: int = W4_NEW_TOKENS, batch_tokens: int | None = None
) -> dict[str, list[str]]:
    """Each W4 peer's command line (lakescore's token budget ``batch_tokens``, else its default); its files go under
    ``run_dir``."""
    python = sys.executable
    budget = ["--set", f"scoring.max_batch_tokens={batch_tokens}"] if batch_tokens else []
    return {
        "lakescore": [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            "--input",
            str(table),
            "--output",
            str(run_dir / "delta"),
            "--task",
            "generate",
            "--model",
            str(model),
            "--id-col",
            "id",
            "--text-col",
            "prompt",
            "--set",
            f"generate.max_new_tokens={new_tokens}",
            "--report",
            str(run_dir / "report.json"),
            # a fresh warehouse and Derby metastore per run: embedded Derby is single-process
            "--set",
            f"spark.warehouse_dir={run_dir / 'warehouse'}",
            "--set",
            f"spark.metastore_dir={run_dir / 'metastore_db'}",
            "--set",
            f"model.cache_dir={run_dir / 'model_cache'}",
            *budget,
        ],
        "loop": [
            python,
            "-m",
            "bench.peers.generate_loop",
            "--input",
            str(table),
            "--model",
            str(model),
            "--output",
            str(run_dir / "generated.parquet"),
            "--timings",
            str(run_dir / "timings.json"),
            "--max-new-tokens",
            str(new_tokens),
            "--batch",
            str(LOOP_BATCH),
        ],
    }


LOOP_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""The loop's one setting beyond torch's defaults: its OpenMP threads sleep at a barrier instead of spinning. On a
shared 2-core host (other processes runnable) a spinning thread holds a core its partner needs, and the loop's
``generate`` ran many times slower than with one thread; lakescore's workers run one thread each and never wait so."""


def run_w4(
    data_dir: Path,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    repeats: int,
    rows: int = W4_ROWS,
    batch_tokens: int | None = None,
) -> W4Result:
    """Build W4's model and prompts, run both peers alternately ``repeats`` times each (a line per run; lakescore with
    ``scoring.max_batch_tokens`` = ``batch_tokens`` when given), compare the first good outputs row by row."""
    model = make_w4_model(data_dir / "w4_model")
    table = make_w4_data(data_dir, rows)
    result = W4Result(rows=rows, prompt_tokens=_prompt_tokens(model, table), batch_tokens=batch_tokens)
    print(
        f"W4: {rows:,} prompts ({result.prompt_tokens}), {W4_NEW_TOKENS} new tokens, greedy; model {model}", flush=True
    )
    commands = {
        peer: (lambda run_dir, peer=peer: peer_commands(table, model, run_dir, batch_tokens=batch_tokens)[peer])
        for peer in ("lakescore", "loop")
    }
    result.runs = run_alternately(
        W4,
        commands,
        {"lakescore": "report.json", "loop": "timings.json"},
        tokens_per_second,
        lambda peer, rate: f"{rate:.1f} generated tokens/s while generating",
        runs_dir,
        env,
        {"loop": LOOP_ENV},
        repo,
        repeats,
    )
    result.equal = compare_first_good(
        runs_dir, W4, result.runs, {"lakescore": "delta", "loop": "generated.parquet"}, compare_texts
    )
    return result


def _prompt_tokens(model: Path, table: Path) -> str:
    from transformers import AutoTokenizer

    lengths = pd.Series(
        [
            len(ids)
            for ids in AutoTokenizer.from_pretrained(str(model))(
                pd.read_parquet(table, columns=["prompt"])["prompt"].tolist()
            )["input_ids"]
        ]
    )
    return (
        f"tokens per prompt: median {lengths.median():.0f}, mean {lengths.mean():.1f}, max {lengths.max()}, "
        f"{lengths.sum():,} in all"
    )


def compare_texts(delta: Path, loop: Path) -> dict:
    """lakescore's generated texts (its Delta output) against the loop's, per id: rows compared, rows with the same
    text, ids missing either side, completion tokens on each side."""
    ours = pq.read_table(delta_files(delta), columns=["id", "generated_text", "completion_tokens"]).to_pandas()
    theirs = pd.read_parquet(loop, columns=["id", "generated_text", "completion_tokens"])
    both = ours.merge(theirs, on="id", suffixes=("_lakescore", "_loop"))
    return {
        "matched": len(both),
        "equal": int((both["generated_text_lakescore"] == both["generated_text_loop"]).sum()),
        "missing_in_lakescore": len(theirs) - len(both),
        "extra_in_lakescore": len(ours) - len(both),
        "tokens_lakescore": int(ours["completion_tokens"].sum()),
        "tokens_loop": int(theirs["completion_tokens"].sum()),
    }


def w4_lines(result: W4Result) -> list[str]:
    """The W4 figures and its three targets with met / NOT met."""
    lines = [
        f"W4 data: {result.rows:,} review prompts ({result.prompt_tokens}), {W4_NEW_TOKENS} new tokens each, greedy; "
        f"Llama-shaped {MODEL_SHAPE['num_hidden_layers']} x {MODEL_SHAPE['hidden_size']}, float32; lakescore's token "
        f"budget {'its default' if result.batch_tokens is None else result.batch_tokens}"
    ]
    for peer in ("lakescore", "loop"):
        line = result.peer_line(W4, peer, "generated tokens/s while generating", 1)
        lines += [line] if line else []
    report = next((r.report for r in result.good("lakescore")), None)
    if report:
        workers = _workers(report)
        lines.append(
            f"W4 lakescore's report: tokens_in {workers.get('tokens_in')}, tokens_out {workers.get('tokens_out')}, "
            f"{report.get('error_rows')} error rows; step seconds "
            + ", ".join(f"{k} {v:.1f}" for k, v in (report.get("step_seconds") or {}).items())
        )
    timings = next((r.report for r in result.good("loop")), None)
    if timings:
        lines.append(
            f"W4 loop: load {timings['load_seconds']:.1f} s, {timings['generate_seconds']:.1f} s in generate for "
            f"{timings['tokens_out']:,} tokens, batch {timings['batch']}, {timings['threads']} torch threads"
        )
    ours, theirs = result.median("lakescore", "rate"), result.median("loop", "rate")
    if ours and theirs:
        lines.append(
            f"W4 generated tokens/s, lakescore's scoring stage vs the loop's generate: {ours:.1f} vs {theirs:.1f} = "
            f"{ours / theirs:.2f}x   target >= {STAGE_TARGET:g}x: {verdict(ours / theirs >= STAGE_TARGET)}"
        )
    lines += filter(None, [result.whole_line(W4, "loop", "loop's", WHOLE_TARGET)])
    eq = result.equal
    if eq:
        share = eq["equal"] / max(1, eq["matched"])
        complete = eq["missing_in_lakescore"] == 0 and eq["extra_in_lakescore"] == 0
        lines.append(
            f"W4 greedy outputs, lakescore vs the loop: {eq['equal']:,} of {eq['matched']:,} rows the same text "
            f"({share:.2%}); {eq['missing_in_lakescore']} missing, {eq['extra_in_lakescore']} extra; completion "
            f"tokens {eq['tokens_lakescore']:,} vs {eq['tokens_loop']:,}   target >= {EQUAL_TARGET:.0%} and nothing "
            f"missing: {verdict(share >= EQUAL_TARGET and complete)}"
        )
    return lines
