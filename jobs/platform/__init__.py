"""Platform adapters: the Spark session, jars, resource profiles, Delta/metastore I/O, model staging, progress, the spark-submit launcher."""
