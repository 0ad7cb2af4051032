"""The Triton source of the fused micro-batch (triton_kernel.py runs it, and says what it computes).

Changes when the fused kernels' code changes.

Imports triton (triton_kernel imports this module at its first call, the CPU's interpreter chosen
first where it runs there). Every program takes BLOCK examples of the micro-batch (rows start..end−1 of
the macro-batch's examples), each example's rows as [BLOCK, BLOCK_D] tiles (BLOCK_D: the power of two
at or above DIM), one of its K + 1 output rows (the target, then its negatives) at a time.
"""

import triton
import triton.language as tl

# new with each micro-batch: a launch does not recompile for their values
VARYING = ["start", "end", "micro", "stamp"]


@triton.jit
def _column(target, neg, mask, ex, live, j: tl.constexpr, neg_stride, HAS_MASK: tl.constexpr):
    """Output row j of each example (0: its target, then its negatives) and its weight: 0 for a masked
    negative (a draw equal to the target) and past the micro-batch's end, else 1."""
    if j == 0:
        r = tl.load(target + ex, mask=live, other=0)
        w = live.to(tl.float32)
    else:
        r = tl.load(neg + ex * neg_stride + (j - 1), mask=live, other=0)
        if HAS_MASK:
            w = tl.load(mask + ex * neg_stride + (j - 1), mask=live, other=0).to(tl.float32)
        else:
            w = live.to(tl.float32)
    return r, w


@triton.jit(do_not_specialize=VARYING)
def score(inputs, outputs, ctx, target, neg, mask, scale, alphas, h_buf, work_buf, g_buf, loss_buf,
          start, end, micro, in_stride, out_stride, ctx_stride, neg_stride,
          DIM: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
          HAS_MASK: tl.constexpr, ADAGRAD: tl.constexpr, HAS_SCALE: tl.constexpr, WITH_LOSS: tl.constexpr):
    """Phase 1, reads only: each example's h, g (label − σ(h·o), times α under SGD) and work = Σ g·o
    (times its scale) into the micro-batch's scratch, and its loss where WITH_LOSS."""
    local = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # the examples' places in the micro-batch
    ex = start + local
    live = ex < end
    d = tl.arange(0, BLOCK_D)
    tile = live[:, None] & (d < DIM)[None, :]
    c = tl.load(ctx + ex * ctx_stride, mask=live, other=0)
    h = tl.load(inputs + c[:, None] * in_stride + d[None, :], mask=tile, other=0.0)
    if ADAGRAD:  # Adagrad takes the plain gradient and applies its own step size
        step = 1.0
    else:
        step = tl.load(alphas + micro)
    work = tl.zeros((BLOCK, BLOCK_D), dtype=tl.float32)
    loss = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(K + 1):
        r, w = _column(target, neg, mask, ex, live, j, neg_stride, HAS_MASK)
        o = tl.load(outputs + r[:, None] * out_stride + d[None, :], mask=tile & (w > 0)[:, None], other=0.0)
        logit = tl.sum(o * h, axis=1)
        if j == 0:
            g = (1.0 - tl.sigmoid(logit)) * w
            x = -logit
        else:
            g = -tl.sigmoid(logit) * w
            x = logit
        if WITH_LOSS:  # softplus(x): −log σ of the right side
            loss += (tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))) * w
        g = g * step
        work += g[:, None] * o
        tl.store(g_buf + local * (K + 1) + j, g, mask=live)
    if HAS_SCALE:
        work = work * tl.load(scale + ex, mask=live, other=0.0)[:, None]
    at = local[:, None] * DIM + d[None, :]
    tl.store(h_buf + at, h, mask=tile)
    tl.store(work_buf + at, work, mask=tile)
    if WITH_LOSS:
        tl.store(loss_buf + ex, loss, mask=live)


@triton.jit(do_not_specialize=VARYING)
def scatter(inputs, outputs, ctx, target, neg, mask, h_buf, work_buf, g_buf, grad_in, grad_out,
            start, end, in_stride, out_stride, ctx_stride, neg_stride,
            DIM: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
            HAS_MASK: tl.constexpr, ADAGRAD: tl.constexpr):
    """Phase 2, adds only: work into each example's input row, g·h into each of its output rows (under
    Adagrad into the gradient accumulators instead)."""
    local = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ex = start + local
    live = ex < end
    d = tl.arange(0, BLOCK_D)
    tile = live[:, None] & (d < DIM)[None, :]
    at = local[:, None] * DIM + d[None, :]
    c = tl.load(ctx + ex * ctx_stride, mask=live, other=0)
    work = tl.load(work_buf + at, mask=tile, other=0.0)
    if ADAGRAD:
        tl.atomic_add(grad_in + c[:, None] * DIM + d[None, :], work, mask=tile, sem="relaxed")
    else:
        tl.atomic_add(inputs + c[:, None] * in_stride + d[None, :], work, mask=tile, sem="relaxed")
    h = tl.load(h_buf + at, mask=tile, other=0.0)
    for j in tl.static_range(K + 1):
        r, w = _column(target, neg, mask, ex, live, j, neg_stride, HAS_MASK)
        g = tl.load(g_buf + local * (K + 1) + j, mask=live, other=0.0)
        upd = g[:, None] * h
        use = tile & (w > 0)[:, None]  # a masked negative's update is zero: not added at all
        if ADAGRAD:
            tl.atomic_add(grad_out + r[:, None] * DIM + d[None, :], upd, mask=use, sem="relaxed")
        else:
            tl.atomic_add(outputs + r[:, None] * out_stride + d[None, :], upd, mask=use, sem="relaxed")


@triton.jit
def _step_rows(table, grad, stamps, rows, use, stamp, alpha, stride, d, DIM: tl.constexpr, EPS: tl.constexpr):
    """Adagrad's step of the rows this program claims: those it is the first to stamp this micro-batch."""
    old = tl.atomic_xchg(stamps + rows, stamp, mask=use, sem="relaxed")
    own = use & (old != stamp)
    tile = own[:, None] & (d < DIM)[None, :]
    at = rows[:, None] * DIM + d[None, :]
    gr = tl.load(grad + at, mask=tile, other=0.0)
    acc = tl.load(table + rows * stride + DIM, mask=own, other=0.0) + tl.sum(gr * gr, axis=1) / DIM
    v = tl.load(table + rows[:, None] * stride + d[None, :], mask=tile, other=0.0)
    v += alpha * gr / (tl.sqrt(acc)[:, None] + EPS)
    tl.store(table + rows[:, None] * stride + d[None, :], v, mask=tile)
    tl.store(table + rows * stride + DIM, acc, mask=own)
    tl.store(grad + at, tl.zeros_like(gr), mask=tile)


@triton.jit(do_not_specialize=VARYING)
def adagrad(inputs, outputs, ctx, target, neg, mask, alphas, grad_in, grad_out, stamp_in, stamp_out,
            start, end, micro, stamp, in_stride, out_stride, ctx_stride, neg_stride,
            DIM: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
            HAS_MASK: tl.constexpr, ADAGRAD: tl.constexpr, EPS: tl.constexpr):
    """Phase 3 (Adagrad): every row the micro-batch touched, stepped once by its summed gradient."""
    local = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ex = start + local
    live = ex < end
    d = tl.arange(0, BLOCK_D)
    alpha = tl.load(alphas + micro)
    c = tl.load(ctx + ex * ctx_stride, mask=live, other=0)
    _step_rows(inputs, grad_in, stamp_in, c, live, stamp, alpha, in_stride, d, DIM, EPS)
    for j in tl.static_range(K + 1):
        r, w = _column(target, neg, mask, ex, live, j, neg_stride, HAS_MASK)
        _step_rows(outputs, grad_out, stamp_out, r, w > 0, stamp, alpha, out_stride, d, DIM, EPS)
