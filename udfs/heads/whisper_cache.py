"""A Whisper beam search's cache whose cross-attention keys and values stay where they are.

After each step, beam search reorders every layer of the cache so that each beam carries the cache of the beam it
continues. The cross-attention keys and values are the encoder's outputs projected, the same for every beam of one
window, so reordering them copies each window's keys and values onto equal ones: on a CPU, a small Whisper spends
most of its decoding there. :class:`SharedCrossAttention` checks once, at the first reorder, that each window's beams
hold bitwise-equal keys and values, and from then on leaves them in place (the result is the same to the bit); where
they differ it reorders them as transformers does.

Imported by :class:`~lakescore.udfs.heads.transcribe.WhisperTranscriber` on the workers only (torch, transformers).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

__all__ = ["SharedCrossAttention", "beam_search_cache"]


class SharedCrossAttention(DynamicCache):
    """The cross-attention part of the cache of one ``generate`` call over ``windows`` windows (see the module
    docstring): the rows of each window (its beams) are consecutive, as beam search expands them, and a beam only
    ever continues a beam of its own window."""

    def __init__(self, config: Any, windows: int) -> None:
        super().__init__(config=config)
        self.windows = windows
        self.shared: bool | None = None
        """Whether every window's beams hold equal keys and values (``None``: not checked yet)."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.shared is None and self.get_seq_length() > 0:
            self.shared = all(
                _beams_equal(layer.keys, self.windows) and _beams_equal(layer.values, self.windows)
                for layer in self.layers
            )
        if not self.shared:
            super().reorder_cache(beam_idx)


def _beams_equal(rows: torch.Tensor | None, windows: int) -> bool:
    """Whether each window's consecutive rows of ``rows`` (``windows`` groups) are bitwise equal."""
    if rows is None or not rows.numel() or rows.shape[0] % windows:
        return False
    grouped = rows.view(windows, rows.shape[0] // windows, *rows.shape[1:])
    return torch.equal(grouped, grouped[:, :1].expand_as(grouped))


def beam_search_cache(config: Any, windows: int) -> EncoderDecoderCache:
    """A fresh cache for one beam-search ``generate`` call over ``windows`` windows: the self-attention part as
    transformers makes it, the cross-attention part a :class:`SharedCrossAttention`."""
    decoder = config.get_text_config(decoder=True)
    return EncoderDecoderCache(DynamicCache(config=decoder), SharedCrossAttention(decoder, windows))
