"""The lakescore job: CLI, configuration, SparkSession and the read -> check -> score -> write -> validate -> report
steps."""
