"""The scoring pipeline's steps, one module each, in the order :func:`lakescore.jobs.score_job.run_scoring` runs them."""
