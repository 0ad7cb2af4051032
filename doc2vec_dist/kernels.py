"""The math of doc2vec with negative sampling, one micro-batch at a time, in torch (CPU or CUDA).

Changes when the batched update (the math of a micro-batch, SGD or Adagrad) changes.

Knows nothing of Ray or files: it updates two compact matrices in place, `inputs` (the rows of `docs`
and `words` a macro-batch uses) and `outputs` (its rows of `words_out`). Every training example has
a context of input rows and a target word. Its hidden vector h is the context row (PV-DBOW, and the
skip-gram steps of dbow_words) or the mean of the context rows (PV-DM: the document and the words
around the target). With o the output vector of the target (label 1) and of each negative (label 0):
    f = σ(h·o),  g = (label − f) · α,  work = Σ g·o,  Δo = g·h,  Δ(each context row) = work
which is gensim's update (doc2vec_inner.pyx, with dm_mean=1 for PV-DM). A micro-batch computes these
for all its examples from the same starting values and adds them with index_add_, so a row repeated
inside a micro-batch gets the sum of its updates. Micro-batches run in sequence, each seeing the
previous one's updates: gradient accumulation over a macro-batch whose total update is pushed to the
parameter servers once.

Row-wise Adagrad (PyTorch-BigGraph's row_adagrad) keeps one accumulator per row in an extra last
column of the same matrix, so it travels with the row through pull, push and checkpoint.

`outputs` may be 16-bit (bfloat16 or float16: a GPU worker's resident URL rows in the tables' --dtype,
half the device memory). Its rows are widened as they are read, the math is float32, and a
micro-batch's summed update is added to the widened rows, which are narrowed back with stochastic
rounding (FBGEMM's default for 16-bit tables): an update below half a unit in the last place is kept
on average instead of lost. Adagrad's accumulator stays float32, its 4 bytes in the last two columns.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ADAGRAD_EPS = 1e-10
# The loss is only shown (progress, summaries), and its softplus over every score costs ~10% of a
# micro-batch on CPU: it is taken on one micro-batch in LOSS_EVERY and scaled to all examples.
LOSS_EVERY = 4


@torch.no_grad()
def train(inputs: torch.Tensor, outputs: torch.Tensor, ctx: torch.Tensor, target: torch.Tensor,
          neg: torch.Tensor, neg_mask: torch.Tensor | None, alphas: torch.Tensor, micro_batch: int, *,
          ctx_mask: torch.Tensor | None = None, scale: torch.Tensor | None = None, adagrad: bool = False,
          shared_negatives: int = 0, learn_outputs: bool = True, learn_context_words: bool = True,
          rounding: torch.Generator | None = None) -> float:
    """Train all examples of one macro-batch in micro-batches; returns the summed loss.

    ctx [n, c] indexes rows of `inputs` (c = 1: one input row per example; c > 1: PV-DM's document in
    column 0 then its context words, ctx_mask [n, c] marking the real ones). target [n] indexes rows of
    `outputs`. Negatives are either per example, neg/neg_mask [n, k], or with shared_negatives = k
    shared by all examples of a micro-batch, neg [n_micro, N] (scored as one matrix product, as
    PyTorch-BigGraph does, each weighted k/N so the expected update is that of k own negatives).
    alphas holds one learning rate per micro-batch. scale [n], if given, scales each example's update
    of its context rows (see sampling.doc_step_scale). With adagrad the matrices carry the accumulator
    as their last column. learn_outputs=False and learn_context_words=False freeze `outputs` and every
    context column but the first (inference of new documents). rounding: the generator the stochastic
    rounding of a 16-bit `outputs` draws from (see the module's docstring); None: to nearest.
    """
    n = target.shape[0]
    if n == 0:
        return 0.0
    half = outputs.dtype in HALF
    dim = outputs.shape[1] - int(adagrad) * (2 if half else 1)
    loss = torch.zeros((), dtype=torch.float64, device=outputs.device)
    scored = 0  # examples whose loss was taken
    multi = ctx.shape[1] > 1
    for i, start in enumerate(range(0, n, micro_batch)):
        end = min(start + micro_batch, n)
        with_loss = i % LOSS_EVERY == 0
        scored += (end - start) if with_loss else 0
        c, t = ctx[start:end], target[start:end]
        alpha = alphas[i]
        if multi:
            m = (ctx_mask[start:end] if ctx_mask is not None else torch.ones_like(c, dtype=torch.bool))
            m = m.to(inputs.dtype)
            hv = inputs.index_select(0, c.reshape(-1)).view(end - start, c.shape[1], -1)[..., :dim]
            h = (hv * m.unsqueeze(2)).sum(1) / m.sum(1, keepdim=True).clamp(min=1.0)
        else:
            h = inputs.index_select(0, c[:, 0])[:, :dim]
        # adagrad takes the plain gradient and applies its own per-row step size
        step = 1.0 if adagrad else alpha
        if shared_negatives:
            work, out_rows, out_upd, lo = _shared_negatives(outputs, h, t, neg[i], shared_negatives, dim, step,
                                                            with_loss)
        else:
            work, out_rows, out_upd, lo = _own_negatives(outputs, h, t, neg[start:end],
                                                         None if neg_mask is None else neg_mask[start:end], dim, step,
                                                         with_loss)
        if with_loss:
            loss += lo
        if scale is not None:
            work *= scale[start:end, None]
        if multi and learn_context_words:
            _apply(inputs, c.reshape(-1), (work.unsqueeze(1) * m.unsqueeze(2)).view(-1, dim), alpha, adagrad, dim)
        else:
            _apply(inputs, c[:, 0], work, alpha, adagrad, dim)
        if learn_outputs:
            _apply(outputs, out_rows, out_upd, alpha, adagrad, dim, rounding)
    return float(loss) * n / scored


def _loss(x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Σ softplus(x) (x = −score for a positive, +score for a negative: −log σ of the right side)."""
    values = F.softplus(x)
    return (values if weights is None else values * weights).sum(dtype=torch.float64)


def _own_negatives(outputs, h, t, neg, neg_mask, dim, step, with_loss=True):
    """Each example against its own k negatives: the target and negatives gathered as [B, 1+k, dim]."""
    b = h.shape[0]
    rows = torch.cat([t.unsqueeze(1), neg], dim=1)                                  # [B, 1+k]
    labels = torch.zeros(rows.shape[1], dtype=h.dtype, device=h.device)
    labels[0] = 1.0
    ov = outputs.index_select(0, rows.reshape(-1)).view(b, rows.shape[1], -1)[..., :dim].to(h.dtype)
    # multiply-and-sum, not bmm: a batch of [1+k, dim]·[dim, 1] products is ~4× slower on CPU
    logits = (ov * h.unsqueeze(1)).sum(-1)                                         # [B, 1+k]
    g = labels - torch.sigmoid(logits)
    w = None
    if neg_mask is not None:  # masked negatives (a draw equal to the target) count 0
        w = torch.cat([torch.ones_like(t, dtype=h.dtype).unsqueeze(1), neg_mask.to(h.dtype)], dim=1)
        g *= w
    loss = _loss(torch.where(labels.bool(), -logits, logits), w) if with_loss else None
    g = g * step
    work = torch.bmm(g.unsqueeze(1), ov).squeeze(1)                               # Σ g·o
    return work, rows.reshape(-1), (g.unsqueeze(2) * h.unsqueeze(1)).view(-1, dim), loss


def _shared_negatives(outputs, h, t, shared, k, dim, step, with_loss=True):
    """All examples of the micro-batch against the same N negatives: two matrix products."""
    o_pos = outputs.index_select(0, t)[:, :dim].to(h.dtype)                         # [B, dim]
    o_neg = outputs.index_select(0, shared)[:, :dim].to(h.dtype)                    # [N, dim]
    pos = (h * o_pos).sum(-1)                                                       # [B]
    negl = h @ o_neg.T                                                              # [B, N]
    w = (shared.unsqueeze(0) != t.unsqueeze(1)).to(h.dtype) * (k / shared.shape[0])
    loss = _loss(-pos) + _loss(negl, w) if with_loss else None
    g_pos = (1.0 - torch.sigmoid(pos)) * step
    g_neg = -torch.sigmoid(negl) * w * step
    work = g_pos.unsqueeze(1) * o_pos + g_neg @ o_neg
    rows = torch.cat([t, shared])
    upd = torch.cat([g_pos.unsqueeze(1) * h, g_neg.T @ h])
    return work, rows, upd, loss


def _apply(table: torch.Tensor, rows: torch.Tensor, update: torch.Tensor, alpha, adagrad: bool, dim: int,
           rounding: torch.Generator | None = None) -> None:
    """Add summed updates to rows: plain SGD (alpha already in the update), or row-wise Adagrad. A
    16-bit table's rows are widened, updated and narrowed back, stochastically from `rounding` (None:
    to nearest), Adagrad's float32 accumulator in its last two columns' 4 bytes exactly."""
    half = table.dtype in HALF
    if not adagrad and not half:
        table.index_add_(0, rows, update)
        return
    uniq, inverse = torch.unique(rows, return_inverse=True)
    grad = torch.zeros((len(uniq), dim), dtype=update.dtype, device=table.device).index_add_(0, inverse, update)
    current = table.index_select(0, uniq)
    vectors = current[:, :dim].to(torch.float32)  # float32: a view of `current`, updated in place
    if adagrad:
        state = current[:, dim:].contiguous().view(torch.float32) if half else current[:, dim:]
        state += grad.pow(2).mean(1, keepdim=True)
        vectors += alpha * grad / (state.sqrt() + ADAGRAD_EPS)
        if half:
            current[:, dim:] = state.view(table.dtype)
    else:
        vectors += grad
    if half:
        current[:, :dim] = vectors.to(table.dtype) if rounding is None else narrow_stochastic(vectors, table.dtype,
                                                                                              rounding)
    table.index_copy_(0, uniq, current)


HALF = (torch.bfloat16, torch.float16)


def narrow_stochastic(values: torch.Tensor, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """float32 `values` as `dtype` (bfloat16 or float16), each rounded to one of its two neighbours
    with the odds of its distance from the other (unbiased): a random integer below the weight of the
    bits the type drops is added to them, which carries into the kept bits with those odds (16 bits
    for bfloat16, 13 for float16's normal range); below float16's normal range (2^-14), a count of its
    subnormals' step 2^-24 plus a uniform draw, truncated. NaN and ±inf stay NaN and ±inf; past
    float16's largest finite, inf, as a cast gives."""
    drop = 16 if dtype == torch.bfloat16 else 13
    low = torch.randint(0, 1 << drop, values.shape, generator=gen, device=values.device, dtype=torch.int32)
    bits = values.view(torch.int32) + low
    if dtype == torch.bfloat16:  # its bits are float32's top half
        return (bits >> 16).to(torch.int16).view(torch.bfloat16)
    rounded = (bits & -(1 << 13)).view(torch.float32)
    steps = values * 2.0 ** 24 + torch.sign(values) * (low.to(torch.float32) * 2.0 ** -13)
    small = torch.trunc(steps) * 2.0 ** -24
    return torch.where(values.abs() < 2.0 ** -14, small, rounded).to(torch.float16)

