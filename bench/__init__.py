"""``make bench``: lakescore against the simplest ways to do the same scoring, measured as whole processes.

Run ``python -m bench --help`` for the knobs; ``BENCHMARKS.md`` holds the last full result.
"""
