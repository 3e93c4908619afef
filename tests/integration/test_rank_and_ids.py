"""Composite ids and top-K per key on real Spark + Delta with a tiny TorchScript program: null / duplicated composite
ids are dead-lettered, incremental runs MERGE on every id column, and the ranked output equals a window-function
reference (ties included) on every run, an incremental one re-ranking only the keys whose rows changed."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from lakescore.jobs.config import load_config
from lakescore.jobs.platform.tables import delta_history
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.steps.rank import keep_top
from lakescore.jobs.steps.read import model_input
from lakescore.schemas.contracts import InputContractError

_SCHEMA = "user_id long, item_id string, f1 double, f2 double, f3 double, f4 double"
_WEIGHTS = (1.0, 2.0, 3.0, 4.0)
_BIAS = 0.5
TOP_K = 5


@pytest.fixture(scope="module")
def linear_program(tmp_path_factory):
    """A TorchScript ``f1 + 2 f2 + 3 f3 + 4 f4 + 0.5``: small whole-number features give exact float32 scores, so
    rows with equal features tie exactly and the test computes every score itself."""
    import torch

    layer = torch.nn.Linear(4, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([_WEIGHTS]))
        layer.bias.fill_(_BIAS)
    path = tmp_path_factory.mktemp("linear") / "model.pt"
    torch.jit.save(torch.jit.script(layer.eval()), str(path))
    return path


def _features(user: int, item: int) -> tuple[float, ...]:
    j = item % 12  # items j and j + 12 of a user have the same features: their scores tie
    return float((user + j) % 5), float((2 * j) % 7), float((user * j) % 4), float(j % 3)


def _candidates(users, items=20) -> list[tuple]:
    return [(u, f"i{j:02d}", *_features(u, j)) for u in users for j in range(items)]


def _score(f) -> float:
    return sum(w * x for w, x in zip(_WEIGHTS, f)) + _BIAS


def _reference(spark, rows: list[tuple], id_cols=("user_id", "item_id")) -> pd.DataFrame:
    """The top-K by a window function over the rows lakescore may score (no null, no duplicated id): ``row_number()``
    per user by score descending, then the ids ascending."""
    frame = pd.DataFrame(rows, columns=["user_id", "item_id", "f1", "f2", "f3", "f4"])
    frame = frame.dropna(subset=list(id_cols)).drop_duplicates(subset=list(id_cols), keep=False)
    frame["user_id"] = frame["user_id"].astype("int64")
    frame["prediction"] = [_score(f) for f in frame[["f1", "f2", "f3", "f4"]].itertuples(index=False)]
    window = Window.partitionBy("user_id").orderBy(F.desc("prediction"), *[F.asc(c) for c in id_cols])
    ranked = spark.createDataFrame(
        frame[["user_id", "item_id", "prediction"]], "user_id long, item_id string, prediction double"
    )
    ranked = ranked.withColumn("rank", F.row_number().over(window)).where(F.col("rank") <= TOP_K).toPandas()
    return ranked.sort_values(["user_id", "rank"]).reset_index(drop=True)


def _write(spark, rows, path) -> None:
    spark.createDataFrame(rows, _SCHEMA).write.format("delta").mode("overwrite").save(str(path))


def _output(spark, path) -> pd.DataFrame:
    return spark.read.format("delta").load(str(path)).toPandas().sort_values(["user_id", "rank"]).reset_index(drop=True)


def _accounted(report) -> None:
    assert report.status == "succeeded", (report.error, report.validation)
    assert report.input_rows == report.rows_kept + report.output_rows + report.error_rows + (report.ranked_out or 0)


def test_top_k_per_key_equals_a_window_reference_and_incremental_reranks_only_changed_keys(
    spark, tmp_path, linear_program
):
    source, output = tmp_path / "candidates", tmp_path / "top"
    rows = _candidates(range(10))
    rows += [(1, None, 1.0, 1.0, 1.0, 1.0), (None, "i05", 1.0, 1.0, 1.0, 1.0), (2, "i03", 0.0, 0.0, 0.0, 0.0)]
    _write(spark, rows, source)

    def config(run_id, **flags):
        return load_config(
            flags={
                "input": str(source),
                "output": str(output),
                "task": "tabular",
                "model.source": str(linear_program),
                "id_col": ["user_id", "item_id"],
                "feature_cols": ["f1", "f2", "f3", "f4"],
                "write.mode": "incremental",
                "rank": {"partition_by": ["user_id"], "order_by": "prediction", "top_k": TOP_K},
                "run_id": run_id,
                "max_error_rate": 0.1,
                "write.chunk_rows": 90,
                **flags,
            }
        )

    # A key column the input lacks is refused on the schema, before any job.
    bad = config("r0", rank={"partition_by": ["shop_id"], "order_by": "prediction", "top_k": 2})
    with pytest.raises(InputContractError, match="rank.partition_by column 'shop_id' not found"):
        model_input(bad, spark.read.format("delta").load(str(source)))

    # Dedup on: rows with equal features are scored once and fanned out on the composite id. Each chunk's keys are
    # ranked before staging: a run that fails a check (here the error rate) leaves staging holding each key's kept
    # rows alone, and the rerun resumes every chunk from it.
    scorable = 200 - 1  # both copies of (2, i03) refused
    failed = run_scoring(config("r1", max_error_rate=0.0, **{"scoring.dedup": "on"}), spark)
    assert failed.status == "error_rate_exceeded" and failed.ranked_out == scorable - 10 * TOP_K
    staged = [
        p for p in (tmp_path / "_lakescore_staging" / "top").iterdir() if not p.name.endswith(("_rows", "_changes"))
    ]
    assert len(staged) == 1 and spark.read.format("delta").load(str(staged[0])).count() == 10 * TOP_K
    first = run_scoring(config("r1", **{"scoring.dedup": "on"}), spark)
    _accounted(first)
    assert first.chunks["skipped"] == first.chunks["total"] == 3
    assert first.error_reasons == {"duplicate_id": 2, "null_id": 2}
    assert (first.output_rows, first.ranked_out, first.rows_kept) == (10 * TOP_K, scorable - 10 * TOP_K, 0)
    assert first.dedup["forward_passes_saved"] > 0
    reference = _reference(spark, rows)
    assert (reference.groupby(["user_id", "prediction"]).size() > 1).any(), "no tie among the kept rows: nothing tested"
    out = _output(spark, output)
    columns = ["user_id", "item_id", "prediction", "rank"]
    pd.testing.assert_frame_equal(out[columns], reference[columns], check_dtype=False)
    assert out.columns.tolist()[:2] == ["user_id", "item_id"]
    errors = spark.read.format("delta").load(str(tmp_path / "top_errors")).toPandas()
    assert sorted(errors.columns.tolist()[:2]) == ["item_id", "user_id"]
    refused = {
        (None if pd.isna(u) else int(u), i, r)
        for u, i, r in errors[["user_id", "item_id", "reason"]].itertuples(index=False)
    }
    assert refused == {(1, None, "null_id"), (None, "i05", "null_id"), (2, "i03", "duplicate_id")}
    assert len(errors) == 4

    # Changed keys: user 3 (a row's features), user 5 (a new row), user 7 (its best row deleted), user 10 (new).
    best_of_7 = out[(out.user_id == 7) & (out["rank"] == 1)].item_id.item()
    changed = [r for r in rows if not (r[0] == 7 and r[1] == best_of_7)]
    changed = [(u, i, f1, f2, f3, 2.0 if (u, i) == (3, "i04") else f4) for u, i, f1, f2, f3, f4 in changed]
    assert _score(_features(3, 4)[:3] + (2.0,)) != _score(_features(3, 4))
    changed += [(5, "i20", 9.0, 9.0, 9.0, 9.0)] + _candidates([10], items=7)
    _write(spark, changed, source)
    second = run_scoring(config("r2"), spark)
    _accounted(second)
    scored_keys = {3: 20, 5: 21, 7: 19, 10: 7}
    assert second.rows_scored == sum(scored_keys.values())
    assert second.workers["rows_scored"] == second.rows_scored  # the ranked-out rows were scored too
    assert second.rows_kept == scorable - 60  # the unchanged keys' rows, ranked out ones included: not scored again
    assert (second.output_rows, second.ranked_out) == (4 * TOP_K, sum(scored_keys.values()) - 4 * TOP_K)
    out = _output(spark, output)
    pd.testing.assert_frame_equal(out[columns], _reference(spark, changed)[columns], check_dtype=False)
    runs = out.groupby("user_id").run_id.agg(set).to_dict()
    assert {u for u, r in runs.items() if r == {"r2"}} == set(scored_keys)
    assert all(r == {"r1"} for u, r in runs.items() if u not in scored_keys)
    merge = next(h for h in delta_history(spark, str(output)) if h.version == second.delta_version)
    assert merge.operation == "MERGE"
    touched = int(merge.metrics["numTargetRowsInserted"]) + int(merge.metrics["numTargetRowsUpdated"])
    assert touched == 4 * TOP_K  # only the changed keys' rows were written
    assert int(merge.metrics["numTargetRowsDeleted"]) >= 1  # user 7's deleted best row, at least
    # user 7's best row left the input while its key stayed: missing from the input, and among the rows deleted
    assert second.rows_missing == 1 and second.rows_deleted == int(merge.metrics["numTargetRowsDeleted"])


def test_top_k_ranks_before_the_shuffle_and_counts_every_scored_row(spark, tmp_path, linear_program):
    """Neither incremental nor dedup: each key's best rows are kept in every partition before the shuffle, failed
    rows all stay (more of one key than top_k), and the rows scored are counted from each batch's tally row."""
    source, output = tmp_path / "candidates", tmp_path / "top"
    unscorable = [(11, f"i{j:02d}", None, 1.0, 1.0, 1.0) for j in range(TOP_K + 2)]  # no f1: each row is an error
    rows = _candidates(range(10)) + unscorable
    _write(spark, rows, source)

    def config(run_id, **flags):
        return load_config(
            flags={
                "input": str(source),
                "output": str(output),
                "task": "tabular",
                "model.source": str(linear_program),
                "id_col": ["user_id", "item_id"],
                "feature_cols": ["f1", "f2", "f3", "f4"],
                "rank": {"partition_by": ["user_id"], "order_by": "prediction", "top_k": TOP_K},
                "run_id": run_id,
                "write.chunk_rows": 90,
                "scoring.arrow_max_records_per_batch": 16,
                **flags,
            }
        )

    cfg = config("r0")
    worker = "struct<batch_rows:bigint>"
    scored = spark.createDataFrame(
        [(1, "a", 0.5, None, None), (1, "b", 0.9, None, None), (1, "c", 0.7, None, None), (1, None, None, None, (3,))]
        + [(2, f"e{j}", None, "bad_input", None) for j in range(TOP_K + 1)],
        f"user_id long, item_id string, prediction double, _reason string, _worker {worker}",
    )
    kept = keep_top(
        cfg.model_copy(update={"rank": cfg.rank.model_copy(update={"top_k": 2})}), scored, incremental=False
    )
    assert "WindowGroupLimit" in kept._jdf.queryExecution().executedPlan().toString()
    assert {(r.item_id, r["rank"]) for r in kept.where("user_id = 1").collect()} == {(None, None), ("b", 1), ("c", 2)}
    assert kept.where("user_id = 2").count() == TOP_K + 1

    # A run that fails a check leaves staging holding each key's kept rows, the failed rows and one tally row per
    # Arrow batch; the rerun resumes every chunk and counts what the first one scored.
    failed = run_scoring(config("r1", max_error_rate=0.0), spark)
    assert failed.status == "error_rate_exceeded", failed.error
    assert (failed.output_rows, failed.ranked_out, failed.error_rows) == (10 * TOP_K, 200 - 10 * TOP_K, len(unscorable))
    assert failed.workers["rows_scored"] == len(rows) and failed.workers["arrow_batches"] >= 3
    (staged,) = [
        p for p in (tmp_path / "_lakescore_staging" / "top").iterdir() if not p.name.endswith(("_rows", "_changes"))
    ]
    staged = spark.read.format("delta").load(str(staged))
    tallies = staged.where(F.col("rank").isNull() & F.col("_reason").isNull())
    assert (
        tallies.count() == failed.workers["arrow_batches"] and tallies.where(F.col("user_id").isNotNull()).count() == 0
    )
    assert staged.count() == 10 * TOP_K + len(unscorable) + failed.workers["arrow_batches"]
    first = run_scoring(config("r1", max_error_rate=0.1), spark)
    _accounted(first)
    assert first.chunks["skipped"] == first.chunks["total"] == 3 and first.workers["rows_scored"] == 0
    assert (first.output_rows, first.ranked_out, first.error_rows) == (10 * TOP_K, 200 - 10 * TOP_K, len(unscorable))
    columns = ["user_id", "item_id", "prediction", "rank"]
    reference = _reference(spark, [r for r in rows if r not in unscorable])
    pd.testing.assert_frame_equal(_output(spark, output)[columns], reference[columns], check_dtype=False)
    errors = spark.read.format("delta").load(str(tmp_path / "top_errors")).toPandas()
    assert sorted(errors.item_id) == [r[1] for r in unscorable] and set(errors.user_id) == {11}
    # The new output records statistics on the columns readers filter by, not on the model's identity strings.
    filtered = ["user_id", "item_id", "prediction", "rank", "run_id"]
    properties = spark.sql(f"DESCRIBE DETAIL delta.`{output}`").first().properties
    assert properties["delta.dataSkippingStatsColumns"] == ",".join(f"`{c}`" for c in filtered)
    actions = [
        json.loads(line) for log in (output / "_delta_log").glob("*.json") for line in log.read_text().splitlines()
    ]
    adds = [action["add"] for action in actions if "add" in action]
    assert adds and all(sorted(json.loads(a["stats"])["minValues"]) == sorted(filtered) for a in adds)


def test_composite_ids_dead_letter_and_merge_row_by_row_without_rank(spark, tmp_path, linear_program):
    source, output = tmp_path / "lines", tmp_path / "scores"
    rows = _candidates(range(4), items=30) + [(0, "i00", 1.0, 1.0, 1.0, 1.0), (2, None, 0.0, 0.0, 0.0, 0.0)]
    _write(spark, rows, source)

    def config(run_id, **flags):
        return load_config(
            flags={
                "input": str(source),
                "output": str(output),
                "task": "tabular",
                "model.source": str(linear_program),
                "id_col": "user_id,item_id",
                "feature_cols": "f1,f2,f3,f4",
                "write.mode": "incremental",
                "write.delete_missing": True,
                "run_id": run_id,
                "max_error_rate": 0.1,
                **flags,
            }
        )

    first = run_scoring(config("c1"), spark)
    _accounted(first)
    assert first.ranked_out is None
    assert (first.output_rows, first.error_reasons) == (119, {"duplicate_id": 2, "null_id": 1})

    # One row changed, one new, one gone; the id (0, i00) is still duplicated, (2, None) still null.
    changed = [r for r in rows if (r[0], r[1]) != (1, "i07")]
    changed = [(u, i, 0.0 if (u, i) == (3, "i11") else f1, f2, f3, f4) for u, i, f1, f2, f3, f4 in changed]
    changed += [(1, "i30", 2.0, 2.0, 2.0, 2.0)]
    _write(spark, changed, source)
    second = run_scoring(config("c2", max_error_rate=1.0), spark)  # the refused rows are all it looks at besides two
    _accounted(second)
    assert (second.rows_kept, second.rows_scored, second.rows_missing, second.rows_deleted) == (117, 2, 1, 1)
    out = spark.read.format("delta").load(str(output)).toPandas()
    assert len(out) == 119 and not ((out.user_id == 1) & (out.item_id == "i07")).any()
    assert set(map(tuple, out[out.run_id == "c2"][["user_id", "item_id"]].values.tolist())) == {(3, "i11"), (1, "i30")}
    expected = {(int(u), i): _score(f) for u, i, *f in changed if i is not None and (u, i) != (0, "i00")}
    assert {(int(u), i): p for u, i, p in out[["user_id", "item_id", "prediction"]].itertuples(index=False)} == expected


def test_plan_of_a_generate_run_keys_its_sample_by_the_composite_id(spark, tmp_path, tiny_causal_lm_dir):
    """``lakescore plan`` reads the sample as the job does: the runner that seeds per-row draws gets a composite id's
    row key (one column), and each row costs its rendered prompt's tokens plus ``max_new_tokens``."""
    from transformers import AutoTokenizer

    from lakescore.jobs.commands.plan import run_plan

    source = tmp_path / "reviews"
    rows = [("north", 1, "Arrived late."), ("north", 2, "Fine, works."), ("south", 1, "Broke on day two!")]
    spark.createDataFrame(rows, "shop string, review_id long, body string").write.format("delta").save(str(source))
    cfg = load_config(
        flags={
            "input": str(source),
            "output": str(tmp_path / "summaries"),
            "task": "generate",
            "id_col": "shop,review_id",
            "model.source": str(tiny_causal_lm_dir),
            "generate.prompt_template": "Review: {body}\nSummary:",
            "generate.max_new_tokens": 4,
            "generate.temperature": 0.7,
        }
    )
    plan = run_plan(cfg, sample_rows=10, spark=spark)
    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_dir)
    prompt_tokens = [len(ids) for ids in tokenizer([f"Review: {body}\nSummary:" for *_, body in rows])["input_ids"]]
    assert (plan["rows"], plan["sample_rows"]) == (3, 3)
    assert plan["tokens"] == sum(prompt_tokens) + 3 * 4


def test_query_passage_pairs_ranked_per_query_equal_cross_encoder_and_rerank_on_a_changed_passage(
    spark, tmp_path, minilm_cross_encoder_dir
):
    """A cross-encoder run (``text_pair_col``) ranked per query: the kept pairs and their order equal
    ``CrossEncoder.predict`` ranked by a window per query; a null or empty side is dead-lettered with both sides shown;
    an incremental run after one passage changed scores that query's pairs alone (the digest covers both sides)."""
    from sentence_transformers import CrossEncoder

    source, output, top_k = tmp_path / "pairs", tmp_path / "reranked", 3
    queries = {1: "is the blender loud?", 2: "how fast is delivery", 3: "Rückgabe ohne Quittung möglich?"}
    passages = [
        "It is quieter than my old one.",
        "Delivery took three days to Berlin.",
        "Returns need a receipt.",
        "The motor is very loud on full power.",
        "Versand dauerte eine Woche.",
        "Works fine, no complaints.",
    ]
    rows = [(q, p, queries[q], text) for q in queries for p, text in enumerate(passages)]
    rows += [(4, 0, "a query", None), (4, 1, "", "a passage")]
    schema = "query_id long, passage_id long, query string, passage string"
    spark.createDataFrame(rows, schema).write.format("delta").save(str(source))
    cross_encoder = CrossEncoder(str(minilm_cross_encoder_dir), device="cpu")

    def reference(rows) -> pd.DataFrame:
        frame = pd.DataFrame([r for r in rows if r[2] and r[3]], columns=["query_id", "passage_id", "query", "passage"])
        frame["score"] = cross_encoder.predict(list(zip(frame["query"], frame["passage"])))
        frame = frame.sort_values(["query_id", "score", "passage_id"], ascending=[True, False, True])
        frame["rank"] = frame.groupby("query_id").cumcount() + 1
        return frame[frame["rank"] <= top_k].reset_index(drop=True)

    def run(run_id):
        report = run_scoring(
            load_config(
                flags={
                    "input": str(source),
                    "output": str(output),
                    "task": "classify",
                    "model.source": str(minilm_cross_encoder_dir),
                    "id_col": ["query_id", "passage_id"],
                    "text_col": "query",
                    "text_pair_col": "passage",
                    "rank": {"partition_by": ["query_id"], "order_by": "score", "top_k": top_k},
                    "write.mode": "incremental",
                    "max_error_rate": 0.5,
                    "run_id": run_id,  # the two dead letters are tried again on every run
                }
            ),
            spark,
        )
        _accounted(report)
        out = spark.read.format("delta").load(str(output)).toPandas()
        return report, out.sort_values(["query_id", "rank"]).reset_index(drop=True)

    def assert_equal(out, expected):
        assert (
            out[["query_id", "passage_id", "rank"]].values.tolist()
            == expected[["query_id", "passage_id", "rank"]].values.tolist()
        )
        assert (out["score"] - expected["score"]).abs().max() < 1e-5

    first, out = run("r1")
    assert first.error_reasons == {"null_input": 2} and first.rows_scored == 18
    assert_equal(out, reference(rows))
    errors = spark.read.format("delta").load(str(tmp_path / "reranked_errors")).toPandas()
    shown = {int(p): json.loads(i) for p, i in errors[["passage_id", "input"]].itertuples(index=False)}
    assert shown == {0: {"query": "a query"}, 1: {"query": "", "passage": "a passage"}}

    worst_of_2 = reference(rows).query("query_id == 2")["passage_id"].tolist()
    changed_id = next(p for p in range(len(passages)) if p not in worst_of_2)  # a ranked-out passage of query 2
    rows = [(q, p, qt, "Delivery was next day, very fast." if (q, p) == (2, changed_id) else t) for q, p, qt, t in rows]
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(str(source))
    second, out = run("r2")
    assert second.rows_scored == len(passages)  # query 2's pairs alone: only its passage changed
    assert_equal(out, reference(rows))
    assert set(out[out.run_id == "r2"].query_id) == {2}
