"""The job configuration schema: YAML file, then ``--set`` overrides, then CLI flags.

This schema is the one place an option is declared: its type, bounds, default and one-sentence
description (the attribute docstring), and its CLI flag when it has one. The CLI's flags, the
Python API's keywords, the worker's model spec and the reference in ``docs/configuration.md``
all derive from it (:func:`config_options`). :func:`load_config` validates the whole tree before
any Spark or model work starts, so a typo fails in milliseconds with a message naming the key.

Layout of a config file (all keys optional except where the job needs them)::

    input: reviews.raw            # metastore table, or a Parquet / Delta path
    output: reviews.embeddings    # metastore table, or a Delta path
    task: embed
    id_col: review_id
    text_col: body
    model: /models/all-MiniLM-L6-v2   # a section's shorthand: its source
    spark:
      master: local[*]
    scoring:
      max_batch_tokens: 1024
    resources:
      scoring: {task_cpus: 4, task_gpus: 1}

Errors: :class:`ConfigError` (a :class:`ValueError`), one line naming the dotted key.
"""

from lakescore.jobs.config.loading import config_from_mapping, load_config
from lakescore.jobs.config.options import Option, config_options
from lakescore.jobs.config.schema import JobConfig
from lakescore.jobs.config.sections import (
    DriftConfig,
    EmbedConfig,
    GenerateConfig,
    ModelConfig,
    RankConfig,
    ResourcesConfig,
    ScoringConfig,
    ScoringResources,
    SparkConfig,
    TranscribeConfig,
    ValidationConfig,
    WriteConfig,
    spark_size_mib,
)
from lakescore.jobs.config.values import DEDUP_MODES, INPUT_FORMATS, RUN_ID, RUN_ID_MAX, TASKS, WRITE_MODES
from lakescore.udfs.options.base import ConfigError
from lakescore.udfs.options.model import BACKENDS, DEVICES, DTYPES, QUANTIZATIONS

__all__ = [
    "ConfigError",
    "JobConfig",
    "Option",
    "config_from_mapping",
    "config_options",
    "load_config",
    "spark_size_mib",
    "TASKS",
    "WRITE_MODES",
    "INPUT_FORMATS",
    "DEDUP_MODES",
    "DEVICES",
    "DTYPES",
    "BACKENDS",
    "QUANTIZATIONS",
    "RUN_ID",
    "RUN_ID_MAX",
    "ModelConfig",
    "SparkConfig",
    "ScoringConfig",
    "ScoringResources",
    "ResourcesConfig",
    "GenerateConfig",
    "EmbedConfig",
    "TranscribeConfig",
    "DriftConfig",
    "ValidationConfig",
    "WriteConfig",
    "RankConfig",
]
