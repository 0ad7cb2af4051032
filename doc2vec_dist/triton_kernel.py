"""The batched kernel's micro-batch (kernels.train) fused into Triton kernels: `--kernel fused`.

Changes when the fused micro-batch (its math, its phases, or what it supports) changes.

kernels.train runs a micro-batch as a dozen small torch operations (gathers, products, sigmoid,
index_add_), each a kernel launch on a GPU; at 8,192 examples a micro-batch the launches, not the
math, bound it (issue 48). Here one micro-batch is two launches, each program taking BLOCK examples:
  1. score: gathers each example's input row h and the output rows o of its target (label 1) and its
     own negatives (label 0), and computes f = σ(h·o), g = (label − f)·α (a masked negative 0),
     work = Σ g·o, scaled by the example's `scale`, and, on the micro-batches kernels.train takes it
     on, the loss. It writes h, work and g to scratch of the micro-batch's size and no table.
  2. scatter: atomically adds each example's work into its `inputs` row and g·h into each of its
     `outputs` rows (SGD: α is already in g).
Two phases, not one: kernels.train computes every update of a micro-batch from the rows as they were
at its start and sums them (a row repeated inside a micro-batch gets the sum), while in one launch a
program's atomic adds could land in rows another program has yet to read. Phase 1 only reads the
tables and phase 2 only adds to them, so the launch between them is the barrier, and the scratch is
the snapshot of the micro-batch's input rows (h, read again by phase 2, whose own adds change `inputs`).

Row-wise Adagrad (the accumulator in each row's last column, as kernels.py keeps it) needs a row's
summed gradient before its step: phase 2 adds the plain gradients into float32 accumulators shaped as
the tables (zero between micro-batches; as much memory again as `inputs` and `outputs`), and a third
launch applies them: each touched row is claimed by one program (an atomic exchange of the row's stamp
for the micro-batch's), which adds the mean of its squared gradient to the accumulator, steps the row
by α·grad/(√acc + ε) and zeroes the gradient.

What it trains: one input row per example (PV-DBOW; dbow_words' skip-gram examples too), each example's
own negatives, float32 `inputs` and `outputs`, SGD or Adagrad. PV-DM's context means, shared
negatives and 16-bit device rows stay with kernels.train (TrainConfig.validate refuses them with
--kernel fused). On CUDA the kernels are compiled; on the CPU they run under Triton's interpreter (the
only way Triton runs there: slow, for the tests). triton is imported at the first call, so this module
imports without it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from .kernels import ADAGRAD_EPS, LOSS_EVERY

# examples a program takes on CUDA: its rows as [BLOCK, next power of two ≥ dim] tiles, one output row
# of each example at a time (benchmarks/kernel_profile.py times other sizes on a GPU)
CUDA_BLOCK = 32
# under the interpreter (the CPU) each program step is a numpy operation over the whole tile, so a
# program takes as many examples as this: a micro-batch of the tests is one or a few programs
INTERPRETER_BLOCK = 4096

MISSING = ("--kernel fused needs triton, which is not installed here: pip install triton (CUDA builds of torch "
           "ship it), or use --kernel batched")


def available() -> bool:
    """Whether triton can be imported here."""
    return importlib.util.find_spec("triton") is not None  # not imported: the CPU's interpreter is chosen then


@torch.no_grad()
def train(inputs: torch.Tensor, outputs: torch.Tensor, ctx: torch.Tensor, target: torch.Tensor,
          neg: torch.Tensor, neg_mask: torch.Tensor | None, alphas: torch.Tensor, micro_batch: int, *,
          ctx_mask: torch.Tensor | None = None, scale: torch.Tensor | None = None, adagrad: bool = False,
          shared_negatives: int = 0, learn_outputs: bool = True, learn_context_words: bool = True,
          rounding: torch.Generator | None = None, block: int | None = None) -> float:
    """kernels.train's micro-batches, each fused into two launches (three with Adagrad): the same
    arguments, the same updates to float tolerance (atomic adds sum in any order), the same loss
    (summed over one micro-batch in kernels.LOSS_EVERY, scaled to all). block: examples a program takes
    (default CUDA_BLOCK on CUDA, INTERPRETER_BLOCK on the CPU)."""
    n = int(target.shape[0])
    unsupported = _unsupported(inputs, outputs, ctx, shared_negatives, learn_outputs, learn_context_words)
    if unsupported:
        raise ValueError(f"the fused kernel does not train {unsupported}: use kernels.train")
    if n == 0:
        return 0.0
    kernels = _kernels(inputs.device.type == "cpu")
    dev = inputs.device
    dim = outputs.shape[1] - int(adagrad)
    k = int(neg.shape[1])
    micro = int(micro_batch)
    block = int(block or (INTERPRETER_BLOCK if dev.type == "cpu" else CUDA_BLOCK))
    block = min(_pow2(block), _pow2(micro))
    block_d = _pow2(dim)
    target, neg = target.contiguous(), neg.contiguous()
    mask = neg_mask.contiguous().view(torch.uint8) if neg_mask is not None else neg  # a stand-in, never read
    scale_arg = scale.contiguous().to(torch.float32) if scale is not None else alphas  # likewise
    width = min(micro, n)
    h = torch.empty((width, dim), dtype=torch.float32, device=dev)
    work = torch.empty((width, dim), dtype=torch.float32, device=dev)
    g = torch.empty((width, k + 1), dtype=torch.float32, device=dev)
    loss = torch.zeros(n, dtype=torch.float32, device=dev)
    if adagrad:
        state = _adagrad_state(dev, inputs.shape[0], outputs.shape[0], dim)
        grad_in, grad_out = state.grad_in, state.grad_out
    else:
        grad_in = grad_out = h  # stand-ins, never read
    shapes = {"DIM": dim, "K": k, "BLOCK": block, "BLOCK_D": block_d, "HAS_MASK": neg_mask is not None,
              "ADAGRAD": adagrad}
    strides = (inputs.stride(0), outputs.stride(0), ctx.stride(0), neg.stride(0))
    scored = 0
    for i, start in enumerate(range(0, n, micro)):
        end = min(start + micro, n)
        with_loss = i % LOSS_EVERY == 0
        scored += (end - start) if with_loss else 0
        grid = (-(-(end - start) // block),)
        kernels.score[grid](inputs, outputs, ctx, target, neg, mask, scale_arg, alphas, h, work, g, loss,
                            start, end, i, *strides, HAS_SCALE=scale is not None, WITH_LOSS=with_loss, **shapes)
        kernels.scatter[grid](inputs, outputs, ctx, target, neg, mask, h, work, g, grad_in, grad_out,
                              start, end, *strides, **shapes)
        if adagrad:
            kernels.adagrad[grid](inputs, outputs, ctx, target, neg, mask, alphas, grad_in, grad_out,
                                  state.stamp_in, state.stamp_out, start, end, i, state.next_stamp(), *strides,
                                  EPS=ADAGRAD_EPS, **shapes)
    return float(loss.sum(dtype=torch.float64)) * n / scored


def _unsupported(inputs, outputs, ctx, shared_negatives, learn_outputs, learn_context_words) -> str:
    """What of a call the fused kernel does not train ('' if it trains it all)."""
    if ctx.dim() != 2 or ctx.shape[1] != 1:
        return "several input rows an example (PV-DM)"
    if shared_negatives:
        return "shared negatives"
    if inputs.dtype != torch.float32 or outputs.dtype != torch.float32:
        return f"{outputs.dtype if outputs.dtype != torch.float32 else inputs.dtype} rows"
    if not (learn_outputs and learn_context_words):
        return "frozen rows (inference)"
    if inputs.stride(1) != 1 or outputs.stride(1) != 1:
        return "matrices whose rows are not contiguous"
    return ""


def _pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


class _AdagradState:
    """The gradient accumulators (zero between micro-batches) and row stamps of Adagrad's third launch,
    kept across calls on one device, grown with the tables."""

    def __init__(self):
        self.grad_in = self.grad_out = self.stamp_in = self.stamp_out = None
        self.stamp = 0

    def fit(self, device, rows_in: int, rows_out: int, dim: int) -> _AdagradState:
        def grown(t, rows, make):
            return t if t is not None and t.shape[0] >= rows and t.shape[1:] == make(1).shape[1:] else make(rows)

        self.grad_in = grown(self.grad_in, rows_in, lambda r: torch.zeros((r, dim), dtype=torch.float32, device=device))
        self.grad_out = grown(self.grad_out, rows_out,
                              lambda r: torch.zeros((r, dim), dtype=torch.float32, device=device))
        self.stamp_in = grown(self.stamp_in, rows_in, lambda r: torch.full((r,), -1, dtype=torch.int32, device=device))
        self.stamp_out = grown(self.stamp_out, rows_out,
                               lambda r: torch.full((r,), -1, dtype=torch.int32, device=device))
        return self

    def next_stamp(self) -> int:
        self.stamp = (self.stamp + 1) % (1 << 31)  # a stamp is used again only 2^31 micro-batches later
        return self.stamp


_ADAGRAD: dict[str, _AdagradState] = {}


def _adagrad_state(device, rows_in: int, rows_out: int, dim: int) -> _AdagradState:
    return _ADAGRAD.setdefault(str(device), _AdagradState()).fit(device, rows_in, rows_out, dim)


def _kernels(interpret: bool):
    """fused_kernels, its kernels compiled for the GPU or (interpret) run by Triton's interpreter on the
    CPU. The interpreter is chosen as triton is first imported (its own library's functions are
    decorated then), so a process runs one or the other: the CPU's turns it on where triton is not
    imported yet."""
    if interpret and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton
    except ImportError as exc:
        raise RuntimeError(MISSING) from exc
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; before it, the variable alone decided
    interpreting = knobs.runtime.interpret if knobs is not None else os.environ.get("TRITON_INTERPRET") == "1"
    if interpret and not interpreting:
        raise RuntimeError("the fused kernel runs on the CPU under Triton's interpreter, which is chosen as triton is "
                           "first imported and was not here: set TRITON_INTERPRET=1 before the process starts")
    from . import fused_kernels

    return fused_kernels
