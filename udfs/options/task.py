"""The task sections a head takes as they are: the one a task names by
:attr:`~lakescore.udfs.registry.Task.options_section` is one of these."""

from __future__ import annotations

from typing import TypeAlias

from lakescore.udfs.options.embed import EmbedOptions
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.options.remote import EmbedEndpointOptions, EndpointOptions, TranscribeEndpointOptions
from lakescore.udfs.options.transcribe import TranscribeOptions

__all__ = ["TaskOptions", "TaskEndpoint"]

TaskOptions: TypeAlias = GenerateOptions | EmbedOptions | TranscribeOptions
"""A task's own settings section (``generate``, ``embed``, ``transcribe``)."""

TaskEndpoint: TypeAlias = EndpointOptions | EmbedEndpointOptions | TranscribeEndpointOptions
"""A task section's remote endpoint (``generate.endpoint``, ``embed.endpoint``, ``transcribe.endpoint``)."""
