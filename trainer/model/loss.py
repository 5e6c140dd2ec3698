"""Cross-entropy over the vocabulary without materialising every token's logits at once.

With Llama 3's 128,256-token vocabulary the logits of one micro-batch dominate activation
memory: 16 sequences × 2048 tokens in fp32 are 16.8 GB, plus their gradient. Here the final
hidden states are projected ``chunk_tokens`` tokens at a time, each chunk's loss summed in
fp32, and each chunk's logits recomputed in backward (``torch.utils.checkpoint``) instead of
kept: peak memory is one chunk's logits, for one extra vocabulary projection of compute.

``compiled=True`` (the trainer's ``parallel.compile``) runs each chunk's projection, fp32 upcast and
cross-entropy as one torch.compile graph, so the fp32 logits and their softmax are fused rather than
written out and read back by separate kernels: on a GPU these memory-bound passes over a 128k
vocabulary are a visible share of a step.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_loss_sum(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(h, weight)  # (chunk, vocab)
    return F.cross_entropy(logits.float(), targets, reduction="sum")


@functools.cache
def _compiled_chunk_loss_sum():
    return torch.compile(_chunk_loss_sum)


def cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_tokens: int = 0,
    compiled: bool = False,
) -> torch.Tensor:
    """Mean cross-entropy of ``h @ weight.T`` against ``targets``.

    h: (batch, seq, dim); weight: (vocab, dim); targets: (batch, seq).
    chunk_tokens 0 (or >= batch × seq): the plain, whole-logits loss.
    compiled: each chunk's loss through torch.compile (the same value, fused kernels).
    """
    h, targets = h.flatten(0, 1), targets.flatten()  # (tokens, dim), (tokens,)
    tokens = targets.numel()
    loss_sum = _compiled_chunk_loss_sum() if compiled else _chunk_loss_sum
    if chunk_tokens <= 0 or chunk_tokens >= tokens:
        return loss_sum(h, weight, targets) / tokens
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for start in range(0, tokens, chunk_tokens):
        end = start + chunk_tokens
        total = total + checkpoint(loss_sum, h[start:end], weight, targets[start:end], use_reentrant=False)
    return total / tokens
