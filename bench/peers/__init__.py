"""The non-lakescore peers, each a script run as its own process (``python -m bench.peers.<name>``).

Kept free of heavy imports: Spark Python workers import these modules to unpickle the UDFs.
"""
