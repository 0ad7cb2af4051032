"""lr.py, the one owner of the learning rate (issue 49): the rate at a position, a batch's ends, a
micro-batch's rates, the rate between two ends. Its results are pinned bit for bit to the torch
arithmetic the kernels used before it existed (a run keeps the learning rates it had), and no other
module of the package computes a rate."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import torch

from doc2vec_dist import lr

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "doc2vec_dist"


def _cases(n: int = 400, seed: int = 0):
    """(alpha, min_alpha, done_before, batch_tokens, planned_tokens, n_micro): random runs, some past
    their plan's end, some with a batch of no tokens."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        alpha = float(rng.uniform(0.001, 0.2))
        low = float(alpha * rng.uniform(0, 0.5))
        planned = int(rng.integers(1, 10**9))
        done, tokens = int(rng.integers(0, planned + 1000)), int(rng.integers(0, 10**6))
        yield alpha, low, done, tokens, planned, int(rng.integers(1, 300))


def _torch_rates(alpha0, min_alpha, done_before, batch_tokens, planned_tokens, n_micro, ends=False):
    """What kernels.micro_batch_alphas computed before lr.py (config.lr_at on a float64 tensor), verbatim."""
    if ends:
        points = done_before + torch.arange(n_micro + 1, dtype=torch.float64) / max(n_micro, 1) * batch_tokens
    else:
        points = done_before + (torch.arange(n_micro, dtype=torch.float64) + 0.5) / max(n_micro, 1) * batch_tokens
    progress = points / max(planned_tokens, 1)
    return (alpha0 - (alpha0 - min_alpha) * progress.clamp(0.0, 1.0)).clamp(min=min_alpha).to(torch.float32)


def _bits(a) -> list[int]:
    return np.asarray(a, dtype=np.float32).view(np.uint32).tolist()


def test_micro_batch_rates_are_the_bits_the_torch_kernels_took():
    for alpha, low, done, tokens, planned, n_micro in _cases():
        for ends in (False, True):
            ours = lr.micro_batch_rates(alpha, low, done, tokens, planned, n_micro, ends=ends)
            assert ours.dtype == np.float32 and len(ours) == n_micro + ends
            assert _bits(ours) == _bits(_torch_rates(alpha, low, done, tokens, planned, n_micro, ends).numpy())


def test_a_batchs_ends_are_its_micro_batch_rates_at_one_micro_batch_bit_for_bit():
    for alpha, low, done, tokens, planned, n_micro in _cases(200, seed=1):
        ends = lr.batch_ends(alpha, low, done, tokens, planned)
        assert ends.dtype == np.float32 and ends.shape == (2,)
        assert _bits(ends) == _bits(lr.micro_batch_rates(alpha, low, done, tokens, planned, 1, ends=True))
        split = lr.micro_batch_rates(alpha, low, done, tokens, planned, n_micro, ends=True)
        assert _bits(ends) == _bits(split[[0, -1]])  # a batch's ends do not depend on how it is split
        # the checkpoint's rate (a number) is the float64 the ends were rounded from
        assert _bits(ends) == _bits([lr.rate_at(alpha, low, done + k * tokens, planned) for k in (0, 1)])


def test_the_rate_decays_from_alpha_to_min_alpha_over_the_plan_and_stays_there():
    assert lr.rate_at(0.025, 0.0001, 0, 1000) == 0.025
    assert lr.rate_at(0.025, 0.0001, 1000, 1000) == 0.0001
    assert lr.rate_at(0.025, 0.0001, 5000, 1000) == 0.0001  # past the plan (more epochs than planned)
    assert isinstance(lr.rate_at(0.025, 0.0001, 10, 1000), float)
    rates = lr.micro_batch_rates(0.025, 0.0001, done_before=0, batch_tokens=1000, planned_tokens=1000, n_micro=4)
    assert rates[0] < 0.025 and rates[-1] > 0.0001 and np.all(rates[1:] < rates[:-1])
    end = lr.micro_batch_rates(0.025, 0.0001, done_before=2000, batch_tokens=10, planned_tokens=1000, n_micro=2)
    assert _bits(end) == _bits([0.0001, 0.0001])
    assert _bits(lr.batch_ends(0.025, 0.0001, 0, 1000, 1000)) == _bits([0.025, 0.0001])


def test_the_token_paths_micro_batch_rates_between_the_ends_are_the_torch_bits():
    """The batched kernel's token path knows its micro-batches only once its examples are drawn: it
    interpolates between the batch's ends in float32, as the worker did in torch."""
    for alpha, low, done, tokens, planned, n_micro in _cases(200, seed=2):
        ends = lr.batch_ends(alpha, low, done, tokens, planned)
        ours = lr.between_ends(ends, n_micro)
        t = torch.from_numpy(ends)
        mid = (torch.arange(n_micro, dtype=torch.float32) + 0.5) / n_micro
        assert ours.dtype == np.float32 and _bits(ours) == _bits((t[0] + (t[1] - t[0]) * mid).numpy())


# the rate's formulas as the package wrote them before lr.py: a linear decay (alpha - (alpha - min_alpha)
# * progress, min_alpha + ...) and a linear interpolation between two rates (start + (end - start) *
# fraction, alphas[0] + (alphas[1] - alphas[0]) * mid). The package interpolates nothing else by hand.
RATE_FORMULAS = [
    re.compile(r"\b(\w+)\s*-\s*\(\s*\1\s*-\s*\w+\s*\)"),
    re.compile(r"\b(\w+(?:\[\d+\])?)\s*\+\s*\(\s*[\w\[\]]+\s*-\s*\1\s*\)\s*\*"),
    re.compile(r"\bmin_alpha\s*\+"),
    re.compile(r"\balpha\w*\s*-\s*min_alpha\b"),
]


def test_no_module_but_lr_computes_a_learning_rate():
    found = [f"{path.name}:{i}: {line.strip()}"
             for path in sorted(PACKAGE.glob("*.py")) if path.name != "lr.py"
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if any(pattern.search(line) for pattern in RATE_FORMULAS)]
    assert not found, "a learning rate computed outside lr.py:\n" + "\n".join(found)
    lr_text = (PACKAGE / "lr.py").read_text()
    assert all(pattern.search(lr_text) for pattern in RATE_FORMULAS[:2])  # the patterns still find lr's own


def test_lr_imports_nothing_of_the_package_nor_torch():
    """Base layer: the exact kernel's worker, checkpoint and infer take it without torch."""
    text = (PACKAGE / "lr.py").read_text()
    assert not re.search(r"^\s*(from \.|import doc2vec_dist|from doc2vec_dist|import torch|from torch)", text, re.MULTILINE)
