"""Platform adapters: the Spark session, the console (log4j2, JVM stderr, logging), jars, resource profiles, Delta/metastore I/O, model staging, progress."""
