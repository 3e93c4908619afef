"""Spark itself: the session a job runs in (:mod:`.session`), every classic-only call with its Spark Connect
counterpart (:mod:`.adapter`), the console, jars, resource profiles, progress, interrupts, background jobs, and the
tuning of sessions on this host's own masters (:mod:`.local`). Kept light: executors import :mod:`.local`'s daemon."""
