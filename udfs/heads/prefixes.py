"""Prompts that begin with the same tokens: the groups whose shared prefix the generate head computes once.

Rows are sorted by their token ids, so rows sharing a prefix are neighbours, and the sorted order is cut into the
groups that skip the most tokens: a group of ``n`` rows sharing ``p`` tokens skips ``(n - 1) * p``. A document asked
ten questions behind one system prompt is then ten rows sharing the system prompt and the document, not every row of
the table sharing the system prompt only. Pure Python / numpy: unit-tested without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PrefixGroup", "prefix_groups", "group_of_rows"]


@dataclass(frozen=True)
class PrefixGroup:
    """Rows (indices into the prompts given) whose first ``length`` tokens are the same; every row has at least one
    token after them, whose logits the decoding reads."""

    rows: tuple[int, ...]
    length: int

    @property
    def skipped(self) -> int:
        """Prompt tokens the rows do not compute when the prefix is computed once: all but the first row's prefix."""
        return (len(self.rows) - 1) * self.length


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def prefix_groups(rows: Sequence[Sequence[int]], min_tokens: int) -> list[PrefixGroup]:
    """The groups of ``rows`` (token id lists) sharing at least ``min_tokens`` leading tokens, chosen to skip the most
    tokens; rows in no group share less with every other. Each group's rows are in ascending index order, and groups
    are in the order of their first row. ``min_tokens`` 0 (or fewer than two rows): no group."""
    if min_tokens < 1 or len(rows) < 2:
        return []
    ids = [list(r) for r in rows]
    order = sorted(range(len(ids)), key=ids.__getitem__)
    common = [_common(ids[order[k]], ids[order[k + 1]]) for k in range(len(order) - 1)]
    lengths = [len(ids[i]) for i in order]
    found: list[tuple[int, int, int]] = []  # (first, last, length) positions in the sorted order
    # each span is a node of the tree the shared prefixes make (split where two neighbours share least), taken whole
    # when that skips at least as much as its parts do; an explicit stack, as nested prompts can nest deep
    spans: list[tuple[int, int]] = []
    start = 0
    for k, shared in enumerate(common + [0]):
        if shared < min_tokens:
            if k > start:
                spans.append((start, k))
            start = k + 1
    for first, last in spans:
        _best_cut(first, last, common, lengths, min_tokens, found)
    groups = [PrefixGroup(tuple(sorted(order[p] for p in range(a, b + 1))), n) for a, b, n in found]
    return sorted(groups, key=lambda g: g.rows[0])


def _best_cut(
    first: int, last: int, common: list[int], lengths: list[int], min_tokens: int, found: list[tuple[int, int, int]]
) -> None:
    """Append to ``found`` the groups of sorted positions ``first``..``last`` that skip the most tokens."""
    # post-order over the span tree: a node's value is the best of itself whole and the sum of its children's
    best: dict[tuple[int, int], tuple[int, list[tuple[int, int, int]]]] = {}
    stack: list[tuple[int, int, bool]] = [(first, last, False)]
    while stack:
        a, b, expanded = stack.pop()
        if a == b:
            best[(a, b)] = (0, [])
            continue
        least = min(common[a:b])
        cuts = [k for k in range(a, b) if common[k] == least]
        children = list(zip([a] + [k + 1 for k in cuts], cuts + [b]))
        if not expanded:
            stack.append((a, b, True))
            stack.extend((c, d, False) for c, d in children)
            continue
        parts = sum(best[c][0] for c in children)
        length = min(least, min(lengths[a : b + 1]) - 1)  # every row keeps a token of its own
        whole = (b - a) * length if length >= min_tokens else -1
        if whole >= parts and whole > 0:
            best[(a, b)] = (whole, [(a, b, length)])
        else:
            best[(a, b)] = (parts, [g for c in children for g in best[c][1]])
        for c in children:
            best.pop(c)
    found.extend(best[(first, last)][1])


def group_of_rows(n: int, groups: Sequence[PrefixGroup]) -> np.ndarray:
    """int64 (n,): each row's group index in ``groups``, -1 for a row in none."""
    group_of = np.full(n, -1, dtype=np.int64)
    for g, group in enumerate(groups):
        group_of[list(group.rows)] = g
    return group_of
