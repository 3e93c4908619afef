"""Scoring over the wire: an OpenAI-compatible endpoint (``generate.endpoint``, ``embed.endpoint``) or an engine
lakescore serves on each executor host (``generate.server``, ``embed.server``).

One place for everything remote, shared by every remote head:

- the settings live in :mod:`~lakescore.udfs.options.remote` (plain pydantic; importable without the HTTP client);
- :mod:`~lakescore.udfs.remote.client`: the one HTTP client (httpx), whatever the API: retries, ``Retry-After``, the
  circuit breaker, the key's scrubber and the request counts the run reports;
- :mod:`~lakescore.udfs.remote.answers`: what an answer means, for every API: retried, the content's fault,
  malformed or unfinished, and the preflight's words for a failure;
- each API's wire format in its own module: :mod:`~lakescore.udfs.remote.completions` (``/v1/completions`` and
  ``/v1/chat/completions``), :mod:`~lakescore.udfs.remote.embeddings` (``/v1/embeddings``),
  :mod:`~lakescore.udfs.remote.transcriptions` (``/v1/audio/transcriptions``, a multipart form); a new API (a
  provider's batch files, another provider's messages) is one more module beside them;
- :mod:`~lakescore.udfs.remote.rate_limit`: the requests- and tokens-per-minute limit shared by a host's processes;
- :mod:`~lakescore.udfs.remote.engine`: a served engine's whole life (start, health, restart, stop, watchdog);
- :mod:`~lakescore.udfs.remote.head`: what every remote head shares (the client it opens, its identity from
  ``/v1/models``, its thread pool, the head protocol's remote features, ``close``);
- :mod:`~lakescore.udfs.remote.generate`: the ``generate`` head; :mod:`~lakescore.udfs.remote.embed`: the ``embed``
  head over ``/v1/embeddings`` (``embed.endpoint``, ``embed.server``); :mod:`~lakescore.udfs.remote.transcribe`: the
  ``transcribe`` head over ``/v1/audio/transcriptions`` (``transcribe.endpoint``). Each is built on
  :class:`~lakescore.udfs.remote.head.RemoteHead`.
- :mod:`~lakescore.udfs.remote.image_prompts`: the ``generate`` head over images (``image_col``): each image as the chat
  API's ``image_url`` part before its prompt.

Nothing here imports the HTTP client at import time but :mod:`client`, and nothing here imports ``lakescore.jobs``.
"""
