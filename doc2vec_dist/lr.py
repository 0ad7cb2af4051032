"""The learning rate, in one place: gensim's linear decay from alpha to min_alpha over the planned
tokens, never below min_alpha (gensim sets it in one line, word2vec.py's `alpha - (alpha - min_alpha)
* progress`).

It owns the rate at a position (a checkpoint's `lr`), a batch's two ends (the exact kernel's), each
micro-batch's rate (the batched kernels', infer's), and the rate between two ends (the numba kernels'
per example, the batched token path's per micro-batch). Everything is numpy and plain arithmetic: the
exact kernel's worker imports no torch, and numba compiles `between` into the kernels' loops. The
positions are float64 and the rates handed to a kernel float32, with the bits the torch code before
this module gave (tests/test_lr.py): a run keeps the rates it had.
"""

from __future__ import annotations

import numpy as np


def _decay(alpha: float, min_alpha: float, done: np.ndarray, planned: int) -> np.ndarray:
    """The rate after `done` (float64) of the `planned` tokens, float64."""
    progress = np.clip(done / max(planned, 1), 0.0, 1.0)
    return np.maximum(alpha - (alpha - min_alpha) * progress, min_alpha)


def rate_at(alpha: float, min_alpha: float, done: int, planned: int) -> float:
    """The learning rate after `done` of the `planned` tokens (a checkpoint's `lr`), as a float64."""
    return float(_decay(alpha, min_alpha, np.float64(done), planned))


def micro_batch_rates(alpha: float, min_alpha: float, done_before: int, batch_tokens: int, planned_tokens: int,
                      n_micro: int, ends: bool = False) -> np.ndarray:
    """A batch of batch_tokens after done_before tokens, cut in n_micro micro-batches: the rate at each
    micro-batch's midpoint; with ends, the n_micro + 1 rates at their boundaries instead (first and last:
    the batch's start and end). float32."""
    if ends:
        points = done_before + np.arange(n_micro + 1, dtype=np.float64) / max(n_micro, 1) * batch_tokens
    else:
        points = done_before + (np.arange(n_micro, dtype=np.float64) + 0.5) / max(n_micro, 1) * batch_tokens
    return _decay(alpha, min_alpha, points, planned_tokens).astype(np.float32)


def batch_ends(alpha: float, min_alpha: float, done_before: int, batch_tokens: int,
               planned_tokens: int) -> np.ndarray:
    """The rates at a batch's start and end, float32: what the exact kernels interpolate between, per
    example (between), and the token path per micro-batch (between_ends)."""
    return micro_batch_rates(alpha, min_alpha, done_before, batch_tokens, planned_tokens, 1, ends=True)


def between(start, end, fraction):
    """The rate `fraction` of the way from `start` to `end`: plain arithmetic, for numpy, torch and numba
    alike. cpu_kernel compiles it with its own flags and inlines it into its loops (so the compiled
    loop is the one it had), which numba's cache does not see: after changing this, delete
    doc2vec_dist/__pycache__/cpu_kernel.*.nb[ic]."""
    return start + (end - start) * fraction


def between_ends(ends: np.ndarray, n_micro: int) -> np.ndarray:
    """A batch's n_micro micro-batch rates from its two ends (batch_ends), at each one's midpoint, in
    float32: the batched kernels' token path, which learns how many micro-batches it has only once its
    examples are drawn."""
    mid = (np.arange(n_micro, dtype=np.float32) + np.float32(0.5)) / np.float32(n_micro)
    return between(ends[0], ends[1], mid)
