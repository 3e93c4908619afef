"""Files the job reads outside tables: the executors' reader of the files a path column names
(:mod:`.hadoop_files`, a compiled Java function) and models staged from remote or MLflow sources
(:mod:`.model_staging`)."""
