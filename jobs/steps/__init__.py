"""The scoring pipeline's steps, one module each, as :func:`lakescore.jobs.score_job.run_scoring` runs them: ``read``,
``preflight``, ``prepare``, ``score``, ``account``, ``validate`` (with ``drift``), ``publish``, ``report`` (with
``report_data`` and ``metrics``). The rest serve them: ``context`` (the types every step shares), ``clock`` (the steps'
times, where a run stopped), ``ids``, ``dead_letter``, ``incremental``, ``dedup``, ``rank`` and ``staging``."""
