"""Batch tokenization into padded numpy arrays, the way the text heads call their tokenizer.

:class:`BatchEncoder` returns what ``tokenizer(texts, padding=True, truncation="longest_first",
max_length=max_length, return_tensors="np")`` returns, for a fast (Rust ``tokenizers``) tokenizer built from
its backend's ``encode_batch`` and numpy. transformers' own call turns every encoding into Python lists of
ints, padded to the batch's longest row, and then into arrays: for a large Arrow batch of mostly short texts
padded to its longest, that is millions of Python ints per batch. Building the arrays directly gives the same
arrays several times faster, and keeps tokenization from bounding the scoring stage on a GPU.

Tokenizers this cannot reproduce exactly take transformers' call: slow (Python) tokenizers, a tokenizer
without a pad token (where that call raises, as before), and input names other than ``input_ids``,
``token_type_ids`` and ``attention_mask``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["BatchEncoder"]

_BUILT = ("input_ids", "token_type_ids", "attention_mask")


class BatchEncoder:
    """``tokenizer``'s padded, truncated encoding of a list of texts, as int64 numpy arrays by input name.

    Inputs: a transformers tokenizer and the tokens per row at most (special tokens included). Calling it
    with ``texts`` returns a dict of ``(len(texts), longest row)`` arrays for ``tokenizer.model_input_names``,
    padded on ``tokenizer.padding_side`` and truncated on ``tokenizer.truncation_side``. The tokenizer's
    state is not changed (the backend is copied once, with truncation set). Errors of the tokenizer propagate.
    """

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        self._names = tuple(tokenizer.model_input_names)
        self._backend = self._truncating_backend()

    def _truncating_backend(self) -> Any | None:
        tokenizer = self._tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token_id is None:
            return None
        if any(name not in _BUILT for name in self._names) or "input_ids" not in self._names:
            return None
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(backend.to_str())
        copy.enable_truncation(
            self.max_length, strategy="longest_first", direction=getattr(tokenizer, "truncation_side", "right")
        )
        copy.no_padding()
        return copy

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        texts = list(texts)
        if self._backend is None or not texts:
            return dict(
                self._tokenizer(
                    texts, padding=True, truncation="longest_first", max_length=self.max_length, return_tensors="np"
                )
            )
        encodings = self._backend.encode_batch(texts)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        width = int(lengths.max())
        positions = np.arange(width)[None, :]
        filled = positions < lengths[:, None] if self.padding_side == "right" else positions >= width - lengths[:, None]
        total = int(lengths.sum())
        features: dict[str, np.ndarray] = {}
        for name in self._names:
            if name == "attention_mask":
                features[name] = filled.astype(np.int64)
                continue
            if name == "input_ids":
                values, pad = (e.ids for e in encodings), self._tokenizer.pad_token_id
            else:
                values, pad = (e.type_ids for e in encodings), getattr(self._tokenizer, "pad_token_type_id", 0)
            array = np.full((len(texts), width), pad, dtype=np.int64)
            array[filled] = np.fromiter(itertools.chain.from_iterable(values), dtype=np.int64, count=total)
            features[name] = array
        return features
