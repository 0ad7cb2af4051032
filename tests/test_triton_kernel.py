"""The fused kernel (triton_kernel.py, --kernel fused) against the batched one (kernels.train).

CI has no GPU: the fused kernels run under Triton's interpreter (TRITON_INTERPRET=1, which must be
set before triton is first imported, so it is set here, as this module is collected), the same
source that is compiled on a GPU. Each micro-batch must update the rows as the batched kernel does,
to float tolerance (the atomic adds of repeated rows sum in another order), and a worker on the
device path must train what the batched kernel trains.
"""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

from doc2vec_dist import kernels, triton_kernel
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tables this small make rows repeat inside every micro-batch: the summed updates must match too
ROWS_IN, ROWS_OUT, DIM, K = 37, 29, 20, 5


def _macro_batch(n: int, micro: int, adagrad: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    width = DIM + int(adagrad)
    inputs = (torch.rand((ROWS_IN, width), generator=gen) - 0.5) / DIM
    outputs = (torch.rand((ROWS_OUT, width), generator=gen) - 0.5) / DIM
    if adagrad:
        inputs[:, DIM] = outputs[:, DIM] = 0.01
    ctx = torch.randint(0, ROWS_IN, (n, 1), generator=gen)
    target = torch.randint(0, ROWS_OUT, (n,), generator=gen)
    neg = torch.randint(0, ROWS_OUT, (n, K), generator=gen)
    alphas = torch.linspace(0.025, 0.02, -(-n // micro))
    return inputs, outputs, ctx, target, neg, alphas


@pytest.mark.parametrize("adagrad", [False, True], ids=["sgd", "adagrad"])
@pytest.mark.parametrize("extras", ["mask", "scale"])
def test_fused_micro_batches_update_the_rows_as_the_batched_kernel_does(adagrad, extras):
    pytest.importorskip("triton")
    n, micro = 300, 64  # five micro-batches, the last one short; programs of 16 examples, several a launch
    inputs, outputs, ctx, target, neg, alphas = _macro_batch(n, micro, adagrad)
    mask = neg != target[:, None] if extras == "mask" else None
    scale = torch.rand(n, generator=torch.Generator().manual_seed(1)) if extras == "scale" else None
    batched = (inputs.clone(), outputs.clone())
    fused = (inputs.clone(), outputs.clone())
    loss_b = kernels.train(*batched, ctx, target, neg, mask, alphas, micro, scale=scale, adagrad=adagrad)
    loss_f = triton_kernel.train(*fused, ctx, target, neg, mask, alphas, micro, scale=scale, adagrad=adagrad,
                                 block=16)
    for name, b, f, before in zip(("inputs", "outputs"), batched, fused, (inputs, outputs)):
        assert (b - before).abs().max() > 1e-3, f"{name}: the batched kernel changed nothing"
        torch.testing.assert_close(f, b, rtol=0, atol=1e-6, msg=name)
    assert loss_f == pytest.approx(loss_b, rel=1e-6)


def test_the_fused_kernel_refuses_what_it_does_not_train():
    inputs, outputs, ctx, target, neg, alphas = _macro_batch(64, 64, adagrad=False)
    dm = torch.cat([ctx, ctx, ctx], dim=1)
    with pytest.raises(ValueError, match="PV-DM"):
        triton_kernel.train(inputs, outputs, dm, target, neg, None, alphas, 64)
    with pytest.raises(ValueError, match="shared negatives"):
        triton_kernel.train(inputs, outputs, ctx, target, neg[:1], None, alphas, 64, shared_negatives=5)
    with pytest.raises(ValueError, match="bfloat16"):
        triton_kernel.train(inputs, outputs.to(torch.bfloat16), ctx, target, neg, None, alphas, 64)


def test_kernel_fused_without_triton_says_so_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # what `import triton` finds where it is not installed
    assert not triton_kernel.available()
    from types import SimpleNamespace

    from doc2vec_dist.settings import resolve

    corpus = SimpleNamespace(num_tokens=1000, vocab_size=100, meta={})
    with pytest.raises(UserError) as err:
        resolve(TrainConfig(kernel="fused"), corpus)  # the run finds it missing: the declaration is valid
    assert "\n" not in str(err.value) and "pip install triton" in str(err.value)
    resolve(TrainConfig(kernel="batched"), corpus)  # the other kernels need no triton


def test_the_default_kernels_never_import_triton():
    code = ("import sys, torch; from doc2vec_dist import kernels, worker, trainer; from doc2vec_dist.config import "
            "TrainConfig; TrainConfig(gpus_per_worker=1); t = torch.zeros((4, 8)); i = torch.zeros((2, 1), "
            "dtype=torch.long); kernels.train(t, t.clone(), i, i[:, 0], i, None, torch.ones(1), 2); "
            "print('triton' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120, check=True)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


# Adagrad over two epochs: its accumulators and row stamps live on between the kernel's calls
@pytest.mark.parametrize("settings", [{"epochs": 1}, {"epochs": 2, "optimizer": "adagrad", "alpha": 0.1}],
                         ids=["sgd", "adagrad"])
def test_a_worker_on_the_fused_kernel_trains_what_the_batched_kernel_trains(ray_cluster, small_corpus, settings):
    """The device path (staged, the CPU as the device), the token path: examples drawn on the device,
    every URL row resident; against real servers, once with each kernel. The token path's
    own macro-batch (the default, 1,048,576 tokens) holds each epoch in one chunk: under the
    interpreter a launch costs tens of ms, and 8,192-token chunks made it 27 s an epoch here (the
    interleaved order makes a micro-batch of each round of each group of a chunk's documents)."""
    pytest.importorskip("triton")
    from test_worker import train_one_worker

    config = TrainConfig(dim=16, sample=0, num_ps=2, num_workers=1, progress=False, kernel="batched", **settings)
    batched, info_b = train_one_worker(ray_cluster, small_corpus, config, staged=True)
    config.kernel = "fused"
    fused, info_f = train_one_worker(ray_cluster, small_corpus, config.validate(), staged=True)
    for name, table in batched.items():
        assert np.abs(table).sum() > 0, name
        np.testing.assert_allclose(fused[name], table, rtol=1e-5, atol=2e-5, err_msg=name)
    assert [s["tokens"] for s in info_f["stats"]] == [s["tokens"] for s in info_b["stats"]]
    assert [s["loss"] for s in info_f["stats"]] == pytest.approx([s["loss"] for s in info_b["stats"]], rel=1e-4)
