"""Batched token sampling: temperature, top-p, per-request seeds, and the behaviour log-prob.

The log-prob returned for a sampled token is its log-probability under the distribution it was
actually drawn from:

    p = softmax(logits / temperature), restricted to the top-p nucleus and renormalised.

So with top_p = 1 it is exactly `log_softmax(logits / temperature)[token]`, which is what a trainer
recomputes (at temperature 1 it is the model's own log-softmax). Temperature 0 means greedy
(argmax); the point mass it samples from would give log-prob 0, which says nothing, so greedy rows
report `log_softmax(logits)[token]` (the temperature-1 model distribution) instead.

A row with a seed draws its uniform number from its own generator, so its tokens do not depend on
which other requests share the batch; unseeded rows share the engine's generator.
"""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [B, V]; return (token ids [B], log-probs [B]).

    `temperature`, `top_p` and `uniforms` (one U[0,1) draw per row) are [B] tensors.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    if bool((top_p < 1).any()):
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        # Keep a token if the mass before it is below top_p (the most likely token is always kept).
        keep = (cum - sorted_logp.exp()) < top_p[:, None]
        sorted_logp = sorted_logp.masked_fill(~keep, float("-inf"))
        sorted_logp = sorted_logp - torch.logsumexp(sorted_logp, dim=-1, keepdim=True)
        logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
    cdf = logp.double().exp().cumsum(-1)
    drawn = torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1])[:, None]).squeeze(-1)
    drawn = drawn.clamp_(max=logits.shape[-1] - 1)
    # Guard the float edge where the draw lands on a zero-probability token at the end of the cdf.
    drawn = torch.where(torch.isinf(logp.gather(-1, drawn[:, None]).squeeze(-1)), logp.argmax(-1), drawn)
    argmax = logits.argmax(-1)
    tokens = torch.where(greedy, argmax, drawn)
    greedy_logp = torch.log_softmax(logits, dim=-1).gather(-1, argmax[:, None]).squeeze(-1)
    token_logp = torch.where(greedy, greedy_logp, logp.gather(-1, drawn[:, None]).squeeze(-1))
    return tokens, token_logp
