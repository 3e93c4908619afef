"""``--task generate`` end to end on real Spark + Delta with a tiny seeded Llama-shaped model: prompts rendered from
columns, greedy text equal to transformers' own ``generate`` (with its per-token log-probabilities), dead-letter per
row, incremental and dedup, choices,
the length-stop gate, a classifier's checkpoint refused before compute, and sampled text that survives a killed driver
and a rerun with other batches and partitions."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch

from lakescore import transform
from lakescore.jobs.cli import main
from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.integration.test_kill_matrix import _killed_run
from tests.integration.test_score_job import read_output

TEMPLATE = "Review: {title} - {body} ({stars} stars)\nSummary:"
LONG = " ".join(["the room was clean and the staff were kind"] * 40)  # over the tiny model's 160-token context


def _reviews() -> pd.DataFrame:
    rows = [(i, f"stay {i}", f"the food was good and room {i} was quiet", i % 5 + 1) for i in range(1, 11)]
    rows[3] = (4, "stay 4", None, 2)  # a null in a named column: null_input
    rows[6] = (7, "stay 7", LONG, 3)  # prompt_too_long
    rows[8] = (9, *rows[1][1:])  # the same prompt as row 2: scored once with dedup
    return pd.DataFrame(rows, columns=["review_id", "title", "body", "stars"])


def _write(spark, frame: pd.DataFrame, path: Path) -> None:
    spark.createDataFrame(frame, "review_id long, title string, body string, stars int").write.format("delta").mode(
        "overwrite"
    ).save(str(path))


def _config(source: Path, output: Path, model: Path, **flags):
    return load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "generate",
            "model.source": str(model),
            "id_col": "review_id",
            "generate.prompt_template": TEMPLATE,
            "generate.max_new_tokens": 6,
            "max_error_rate": 0.5,
            **flags,
        }
    )


def _reference_texts(model_dir: Path, prompts: list[str], max_new_tokens: int) -> tuple[list[str], list[int]]:
    """transformers' greedy ``generate`` on each prompt alone: the new text and the prompt's token count."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    texts, lengths = [], []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
        lengths.append(ids.shape[1])
    return texts, lengths


def test_greedy_generation_into_delta_incremental_choices_and_gates(
    spark, tmp_path, tiny_causal_lm_dir, tiny_classifier_dir, capsys
):
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    frame = _reviews()
    _write(spark, frame, source)

    logprobs = {"generate.logprobs": True}  # the optional token_logprobs column, through staging and the MERGE
    # the prompts share their first few tokens ("Review: stay"): computed once per batch, the texts unchanged
    shared = {"generate.share_prefix_tokens": 2}
    report = run_scoring(
        _config(
            source,
            output,
            tiny_causal_lm_dir,
            **{"write.mode": "incremental", "scoring.dedup": "on", **logprobs, **shared},
        ),
        spark,
    )
    assert report.status == "succeeded", report.error
    assert (report.output_rows, report.error_reasons) == (8, {"null_input": 1, "prompt_too_long": 1})
    out = read_output(spark, str(output))
    scored = frame[~frame["review_id"].isin([4, 7])]
    prompts = [TEMPLATE.format(**row) for row in scored.to_dict("records")]
    expected, prompt_tokens = _reference_texts(tiny_causal_lm_dir, prompts, 6)
    assert out["generated_text"].tolist() == expected
    assert out["prompt_tokens"].tolist() == prompt_tokens
    assert set(out["finish_reason"]) <= {"stop", "length"} and out["choice_logprobs"].isna().all()
    assert dict(spark.read.format("delta").load(str(output)).dtypes)["token_logprobs"] == "array<float>"
    for values, tokens in zip(out["token_logprobs"], out["completion_tokens"]):
        assert (
            len(values) == tokens and max(values) <= 0
        )  # one per generated token (values: tests/unit/test_generate.py)
    assert list(out.set_index("review_id").loc[9, "token_logprobs"]) == list(
        out.set_index("review_id").loc[2, "token_logprobs"]
    )
    assert report.dedup["forward_passes_saved"] == 1  # rows 2 and 9 share a prompt
    # Tokens are counted per forward: row 9 shared row 2's.
    generated = out[out["review_id"] != 9]
    assert report.workers["tokens_out"] == generated["completion_tokens"].sum()
    assert report.workers["tokens_in"] == generated["prompt_tokens"].sum()
    assert 0 < report.workers["tokens_in_cached"] < report.workers["tokens_in"] / 2  # the shared tokens, counted
    assert report.workers["tokens_in_cache_write"] == 0  # in-process: no provider's cache to write to
    assert "generated" in report.summary() and report.workers["tokens_per_second"] > 0
    errors = spark.read.format("delta").load(f"{output}_errors").toPandas().set_index("review_id")
    assert errors.loc[7, "input"] == TEMPLATE.format(
        **frame.iloc[6].to_dict()
    )  # the rendered prompt, as the model got it
    assert "exceeds the model's context of 160 tokens" in errors.loc[7, "error"]
    # A null prompt's dead letter names the template's null column and shows the row's own values (issue 65).
    assert errors.loc[4, "error"] == "the prompt template's column 'body' is null on this row"
    assert errors.loc[4, "input"] == '{"title":"stay 4","stars":2}'

    # The Python API on prompts already rendered: the same text.
    rendered = spark.createDataFrame(pd.DataFrame({"review_id": scored["review_id"].tolist(), "prompt": prompts}))
    lazily = (
        transform(
            rendered, task="generate", model=tiny_causal_lm_dir, text_col="prompt", id_col="review_id", max_new_tokens=6
        )
        .toPandas()
        .sort_values("review_id")
    )
    assert lazily["generated_text"].tolist() == expected

    # Incremental: one review edited, so its prompt (and digest) changed; the rest is kept as it was.
    edited = frame.copy()
    edited.loc[edited["review_id"] == 1, "body"] = "the food was awful"
    _write(spark, edited, source)
    # (the two dead-lettered rows failed for their own reason: carried, not tried again)
    again = run_scoring(
        _config(source, output, tiny_causal_lm_dir, **{"write.mode": "incremental", "max_error_rate": 0.9, **logprobs}),
        spark,
    )
    assert again.status == "succeeded", again.error
    assert (again.rows_kept, again.rows_scored, again.rows_carried) == (7, 1, 2)
    rerun = read_output(spark, str(output))
    assert (
        rerun.loc[rerun["review_id"] != 1, "generated_text"].tolist()
        == out.loc[out["review_id"] != 1, "generated_text"].tolist()
    )
    new_prompt = TEMPLATE.format(**edited.iloc[0].to_dict())
    assert rerun.loc[0, "generated_text"] == _reference_texts(tiny_causal_lm_dir, [new_prompt], 6)[0][0]
    assert len(rerun.loc[0, "token_logprobs"]) == rerun.loc[0, "completion_tokens"]

    # Choices: every row gets the likelier label, with both log-probabilities.
    labels = run_scoring(
        _config(source, tmp_path / "labels", tiny_causal_lm_dir, **{"generate.choices": ["good", "bad"]}), spark
    )
    assert labels.status == "succeeded", labels.error
    chosen = read_output(spark, str(tmp_path / "labels"))
    assert set(chosen["finish_reason"]) == {"choice"}
    for text, logprobs in zip(chosen["generated_text"], chosen["choice_logprobs"]):
        assert (
            len(logprobs) == 2
            and max(logprobs) < 0
            and text == ["good", "bad"][max(range(2), key=lambda i: logprobs[i])]
        )

    # The length-stop gate: 6 new tokens from a random model always run out, so no row may: the run publishes nothing.
    gated = run_scoring(
        _config(source, tmp_path / "gated", tiny_causal_lm_dir, **{"validation.max_length_stops": 0.0}), spark
    )
    assert gated.status == "validation_failed" and gated.delta_version is None
    assert any(c["column"] == "finish_reason" for c in gated.validation["failed"])

    # JSON cut at max_new_tokens is no answer: 3 tokens hold no whole object, so each row is dead-lettered
    # json_incomplete with its cut text kept in the errors table, and none is published (issue 65).
    schema = {"type": "object", "properties": {"stars": {"type": "integer"}}, "required": ["stars"]}
    cut = run_scoring(
        _config(
            source,
            tmp_path / "json",
            tiny_causal_lm_dir,
            **{"generate.json_schema": schema, "generate.max_new_tokens": 3, "max_error_rate": 1.0},
        ),
        spark,
    )
    assert cut.error_reasons == {"null_input": 1, "prompt_too_long": 1, "json_incomplete": 8}, cut.error
    assert cut.output_rows == 0
    cut_rows = (
        spark.read.format("delta").load(f"{tmp_path / 'json'}_errors").where("reason = 'json_incomplete'").toPandas()
    )
    assert set(cut_rows["input"]) <= {
        TEMPLATE.format(**row) for row in edited.to_dict("records")
    }  # each its own prompt
    for error in cut_rows["error"]:
        assert error.startswith(
            "the text reached max_new_tokens (3 tokens) before its JSON was complete; the cut text: {"
        )

    # A sequence classifier is no language model: transformers would give it a random LM head. Refused before compute.
    unfit = tmp_path / "unfit"
    capsys.readouterr()
    code = main(
        [
            "score",
            "--task",
            "generate",
            "--input",
            str(source),
            "--output",
            str(unfit),
            "--model",
            str(tiny_classifier_dir),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
        ]
    )
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("lakescore: error: task generate: ") and "BertForSequenceClassification" in err[0]
    assert not unfit.exists() and not Path(f"{unfit}_errors").exists()


def test_sampled_text_is_per_row_through_a_killed_driver_and_other_batches(spark, tmp_path, tiny_causal_lm_dir):
    """A sampled run killed after its first chunk's commit, then resumed, writes the same text per row as one
    uninterrupted run with other batch sizes and partitions: each row draws from its own seeded generator."""
    source = tmp_path / "reviews"
    frame = _reviews()
    _write(spark, frame, source)
    sampled = ["--set", "generate.temperature=1.0", "--set", "generate.seed=7"]
    args = [
        "score",
        "--task",
        "generate",
        "--input",
        str(source),
        "--output",
        str(tmp_path / "resumed"),
        "--model",
        str(tiny_causal_lm_dir),
        "--id-col",
        "review_id",
        "--run-id",
        "sampled",
        "--set",
        f"generate.prompt_template={TEMPLATE}",
        "--set",
        "generate.max_new_tokens=6",
        "--set",
        "max_error_rate=0.5",
        "--set",
        "write.chunk_rows=4",
        "--set",
        "scoring.max_batch_rows=2",
        *sampled,
    ]
    code, _, log = _killed_run(args, tmp_path, "chunk_committed:0")
    assert code != 0, log
    assert main([*args, "--report", str(tmp_path / "r.json")]) == 0
    resumed = read_output(spark, str(tmp_path / "resumed"))

    whole = run_scoring(
        _config(
            source,
            tmp_path / "whole",
            tiny_causal_lm_dir,
            **{
                "generate.temperature": 1.0,
                "generate.seed": 7,
                "scoring.max_batch_rows": 16,
                "scoring.partitions": 1,
                "scoring.dedup": "auto",
            },
        ),
        spark,
    )
    assert whole.status == "succeeded" and whole.dedup["used"] is False  # sampled rows never share a draw
    uninterrupted = read_output(spark, str(tmp_path / "whole"))
    assert resumed["generated_text"].tolist() == uninterrupted["generated_text"].tolist()
    assert len(set(resumed["generated_text"])) == len(resumed)  # rows 2 and 9 share a prompt, not a draw
    assert json.loads((tmp_path / "r.json").read_text())["chunks"]["skipped"] == 1
