"""Provider servers for the test suite: real wire contracts (OpenAI Files + Batches, Anthropic Messages and Message
Batches) in front of a real model server, with fault knobs tests set."""

from tests.providers.batch_provider import BatchProvider, EmbeddingModel, Faults, Pick, batch_provider

__all__ = ["BatchProvider", "EmbeddingModel", "Faults", "Pick", "batch_provider"]
