import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from lakescore.schemas.contracts import InputContractError, TextInputContract

SCHEMA = StructType(
    [StructField("review_id", LongType()), StructField("body", StringType()), StructField("score", DoubleType())]
)


def test_valid_schema_passes():
    TextInputContract("review_id", "body").check(SCHEMA, "input 't'")


def test_missing_text_column_is_named_with_alternatives():
    with pytest.raises(
        InputContractError,
        match=r"text column 'text' not found in input 't'; available columns: review_id, body, score",
    ):
        TextInputContract("review_id", "text").check(SCHEMA, "input 't'")


def test_missing_id_column_is_named():
    with pytest.raises(InputContractError, match=r"id column 'id' not found"):
        TextInputContract("id", "body").check(SCHEMA, "input 't'")


def test_column_names_are_case_sensitive():
    with pytest.raises(InputContractError, match=r"'Body' not found"):
        TextInputContract("review_id", "Body").check(SCHEMA, "input 't'")


def test_wrong_types_are_named():
    with pytest.raises(
        InputContractError, match=r"text column 'review_id' in input 't' has type bigint; expected string"
    ):
        TextInputContract("body", "review_id").check(SCHEMA, "input 't'")
    with pytest.raises(InputContractError, match=r"id column 'score' in input 't' has type double"):
        TextInputContract("score", "body").check(SCHEMA, "input 't'")


def test_id_column_may_not_collide_with_output_columns():
    from lakescore.schemas.output import output_schema

    with pytest.raises(InputContractError, match=r"id column 'run_id' collides with an output column"):
        output_schema("embed", StructField("run_id", StringType()))
    schema = output_schema("embed", StructField("review.id", LongType()))
    assert [f.name for f in schema.fields] == [
        "review.id",
        "embedding",
        "model_id",
        "model_revision",
        "model_sha256",
        "run_id",
    ]
    with pytest.raises(InputContractError, match=r"id column 'label' collides"):
        output_schema("classify", StructField("label", StringType()))
    incremental = output_schema("embed", StructField("review.id", LongType()), incremental=True)
    assert [f.name for f in incremental.fields][-3:] == ["run_id", "input_digest", "spec_digest"]
    with pytest.raises(InputContractError, match=r"id column 'input_digest' collides"):
        output_schema("embed", StructField("input_digest", StringType()))
    # An image column of paths stores each file's status, incremental outputs only; other outputs keep those names free.
    paths = output_schema("image_embed", StructField("input_path", StringType()))
    files = output_schema("image_embed", StructField("photo_id", LongType()), incremental=True, file_status=True)
    assert [(f.name, f.dataType.simpleString()) for f in files.fields][-4:] == [
        ("spec_digest", "string"),
        ("input_path", "string"),
        ("input_length", "bigint"),
        ("input_modified", "bigint"),
    ]
    assert paths.names[0] == "input_path" and output_schema("image_embed", file_status=True).names[-1] == "run_id"
    with pytest.raises(InputContractError, match=r"id column 'input_length' collides"):
        output_schema("image_embed", StructField("input_length", LongType()), incremental=True, file_status=True)


def test_a_composite_id_checks_every_column_and_a_ranked_output_adds_rank():
    from lakescore.schemas.output import output_schema

    schema = StructType([*SCHEMA.fields, StructField("item", StringType()), StructField("probs", DoubleType())])
    TextInputContract(("review_id", "item"), "body").check(schema, "input 't'")
    with pytest.raises(InputContractError, match=r"id column 'shop' not found in input 't'"):
        TextInputContract(("review_id", "shop"), "body").check(schema, "input 't'")
    with pytest.raises(InputContractError, match=r"id column 'probs' in input 't' has type double"):
        TextInputContract(("review_id", "probs"), "body").check(schema, "input 't'")
    ids = [StructField("user_id", LongType()), StructField("item_id", StringType())]
    ranked = output_schema("tabular", *ids, incremental=True, ranked=True)
    assert [f.name for f in ranked.fields] == [
        "user_id",
        "item_id",
        "prediction",
        "scores",
        "rank",
        "model_id",
        "model_revision",
        "model_sha256",
        "run_id",
        "input_digest",
        "spec_digest",
        "key_digest",
    ]
    assert "key_digest" not in output_schema("tabular", *ids, ranked=True).names
    with pytest.raises(InputContractError, match=r"id column 'rank' collides"):
        output_schema("tabular", StructField("rank", LongType()), ranked=True)


def test_feature_columns_by_name_or_prefix_must_be_numeric():
    from pyspark.sql.types import DoubleType, IntegerType, StructType

    from lakescore.schemas.contracts import FeatureInputContract, resolve_feature_cols

    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("feature_x", DoubleType()),
            StructField("feature_n", IntegerType()),
            StructField("feature_note", StringType()),
            StructField("other", DoubleType()),
        ]
    )
    assert resolve_feature_cols(schema, (), "feature_", "t") == ("feature_x", "feature_n", "feature_note")
    assert resolve_feature_cols(schema, ("other", "feature_x"), "ignored", "t") == ("other", "feature_x")
    FeatureInputContract("id", ("feature_x", "feature_n", "other")).check(schema, "input 't'")
    with pytest.raises(
        InputContractError, match=r"feature column 'feature_note' in input 't' has type string; expected a number"
    ):
        FeatureInputContract("id", ("feature_x", "feature_note")).check(schema, "input 't'")
    with pytest.raises(InputContractError, match=r"feature column 'feature_y' not found in input 't'"):
        FeatureInputContract("id", ("feature_y",)).check(schema, "input 't'")
    with pytest.raises(InputContractError, match=r"no column of t starts with feature prefix 'f_'"):
        resolve_feature_cols(schema, (), "f_", "t")


def test_an_image_column_must_hold_bytes():
    from pyspark.sql.types import BinaryType

    from lakescore.schemas.contracts import one_column_contract

    schema = StructType([*SCHEMA.fields, StructField("photo", BinaryType())])
    one_column_contract("image", "review_id", "photo").check(schema, "input 't'")
    one_column_contract("image", "review_id", "body").check(schema, "input 't'")  # paths of image files
    with pytest.raises(
        InputContractError,
        match=r"^image column 'score' in input 't' has type double; expected binary \(encoded image bytes\) or string "
        r"\(paths of image files\)$",
    ):
        one_column_contract("image", "review_id", "score").check(schema, "input 't'")
    with pytest.raises(
        InputContractError,
        match=r"^image column 'picture' not found in input 't'; available columns: review_id, body, score, photo$",
    ):
        one_column_contract("image", "review_id", "picture").check(schema, "input 't'")
