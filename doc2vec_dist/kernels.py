"""The math of PV-DBOW with negative sampling, one micro-batch at a time, in torch (CPU or CUDA).

Knows nothing of Ray or files: it updates two compact matrices in place. Per (doc d, word w) pair,
with o the output vector of the positive word (label 1) and of each negative (label 0):
    f = σ(d·o),  g = (label − f) · α,  Δd = Σ g·o,  Δo = g·d          (gensim's update)
A micro-batch computes these for all its pairs from the same starting values and adds them with
index_add_, so rows repeated inside a micro-batch get the sum of their updates. Micro-batches run in
sequence, each seeing the previous one's updates: gradient accumulation over a macro-batch whose
total update is pushed to the parameter servers once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def dbow_train(docs: torch.Tensor, words_out: torch.Tensor, doc_idx: torch.Tensor,
               word_idx: torch.Tensor, neg_idx: torch.Tensor, neg_mask: torch.Tensor,
               alphas: torch.Tensor, micro_batch: int, doc_scale: torch.Tensor | None = None) -> float:
    """Train all pairs of one macro-batch in micro-batches; returns the summed loss.

    docs [n_docs, dim] and words_out [n_words, dim] are compact local copies, updated in place.
    doc_idx/word_idx [n] and neg_idx/neg_mask [n, k] index into them. alphas holds one learning
    rate per micro-batch (the linear decay, evaluated at each micro-batch's position). doc_scale [n],
    if given, scales each pair's doc update (see sampling.doc_step_scale).
    """
    n = word_idx.shape[0]
    if n == 0:
        return 0.0
    dim = docs.shape[1]
    targets = torch.cat([word_idx.unsqueeze(1), neg_idx], dim=1)            # [n, 1+k]
    labels = torch.zeros(targets.shape[1], dtype=docs.dtype, device=docs.device)
    labels[0] = 1.0
    weights = torch.cat([torch.ones_like(word_idx, dtype=docs.dtype).unsqueeze(1),
                         neg_mask.to(docs.dtype)], dim=1)                     # masked negatives count 0
    loss = torch.zeros((), dtype=torch.float64, device=docs.device)
    for i, start in enumerate(range(0, n, micro_batch)):
        end = min(start + micro_batch, n)
        d, t, w = doc_idx[start:end], targets[start:end], weights[start:end]
        dv = docs.index_select(0, d)                                         # [B, dim]
        ov = words_out.index_select(0, t.reshape(-1)).view(end - start, -1, dim)  # [B, 1+k, dim]
        # multiply-and-sum, not bmm: a batch of [1+k, dim]·[dim, 1] products is ~4× slower on CPU
        logits = (ov * dv.unsqueeze(1)).sum(-1)                              # [B, 1+k]
        g = (labels - torch.sigmoid(logits)) * w * alphas[i]
        doc_update = torch.bmm(g.unsqueeze(1), ov).squeeze(1)
        if doc_scale is not None:
            doc_update *= doc_scale[start:end, None]
        docs.index_add_(0, d, doc_update)
        words_out.index_add_(0, t.reshape(-1), (g.unsqueeze(2) * dv.unsqueeze(1)).view(-1, dim))
        # -log σ(d·o+) − Σ log σ(−d·o−): softplus(−x) = −log σ(x)
        signed = torch.where(labels.bool(), -logits, logits)
        loss += (F.softplus(signed) * w).sum(dtype=torch.float64)
    return float(loss)


def micro_batch_alphas(alpha0: float, min_alpha: float, done_before: int, batch_tokens: int,
                       planned_tokens: int, n_micro: int) -> torch.Tensor:
    """Linear decay from alpha0 to min_alpha over the planned tokens, at each micro-batch's midpoint."""
    mids = done_before + (torch.arange(n_micro, dtype=torch.float64) + 0.5) / max(n_micro, 1) * batch_tokens
    progress = (mids / max(planned_tokens, 1)).clamp(0.0, 1.0)
    return (alpha0 - (alpha0 - min_alpha) * progress).clamp(min=min_alpha).to(torch.float32)
