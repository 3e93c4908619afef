"""Platform adapters, one subpackage per thing adapted: :mod:`~lakescore.jobs.platform.spark` (the session, its
classic / Spark Connect adapter, console, jars, resource profiles, progress, interrupts, this host's own-master
tuning), :mod:`~lakescore.jobs.platform.tables` (Delta and metastore I/O) and :mod:`~lakescore.jobs.platform.files`
(the executors' file reader, model staging)."""
