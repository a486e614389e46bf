"""Batched token sampling: temperature, top-p, per-request seeds, and the behaviour log-prob.

The log-prob returned for a sampled token is its log-probability under the distribution it was
actually drawn from:

    p = softmax(logits / temperature), restricted to the top-p nucleus and renormalised.

So with top_p = 1 it is exactly `log_softmax(logits / temperature)[token]`, which is what a trainer
recomputes (at temperature 1 it is the model's own log-softmax). Temperature 0 means greedy
(argmax); the point mass it samples from would give log-prob 0, which says nothing, so greedy rows
report `log_softmax(logits)[token]` (the temperature-1 model distribution) instead.

Numerical safety. Temperatures below `GREEDY_BELOW` are greedy too: dividing logits by 1e-40
overflows float32 to inf and the softmax to NaN, and a distribution that sharp is an argmax
anyway. The most likely token is always inside the nucleus, however small top_p is (5e-324 is 0
in float32), so the renormalised distribution is never empty. Non-finite logits are clamped. So
every log-prob returned is finite.

A row with a seed draws its uniform number from its own generator, so its tokens do not depend on
which other requests share the batch; unseeded rows share the engine's generator.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GREEDY_BELOW = 1e-5  # temperatures below this are argmax
MAX_TEMPERATURE = 1e4  # above this the distribution is uniform to float32 precision anyway
OUTSIDE_NUCLEUS = -9999.0  # the log-prob reported for a top-k alternative that could not be drawn


class Sampled(NamedTuple):
    tokens: torch.Tensor  # [B] token ids
    logprobs: torch.Tensor  # [B] behaviour log-prob of each
    top_ids: torch.Tensor | None  # [B, k] the k most likely tokens (k = top_k argument), or None
    top_logprobs: torch.Tensor | None  # [B, k] their log-probs under the same distribution


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
    top_k: int = 0,
) -> Sampled:
    """Sample one token per row of `logits` [B, V].

    `temperature`, `top_p` and `uniforms` (one U[0,1) draw per row) are [B] tensors. With
    `top_k` > 0, also return the `top_k` most likely tokens of each row's distribution.
    """
    logits = torch.nan_to_num(logits.float(), nan=0.0, posinf=1e30, neginf=-1e30)
    greedy = temperature < GREEDY_BELOW
    safe_t = torch.where(greedy, 1.0, temperature.clamp(max=MAX_TEMPERATURE)).to(logits.dtype)
    logp = torch.log_softmax(logits / safe_t[:, None], dim=-1)
    if bool((top_p < 1).any()):
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_logp.exp()
        # Keep a token if the mass before it is below top_p; the most likely token always stays.
        keep = (probs.cumsum(-1) - probs) < top_p.to(probs.dtype)[:, None]
        keep[:, 0] = True
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
    model_logp = torch.log_softmax(logits, dim=-1)
    behaviour = torch.where(greedy[:, None], model_logp, logp)
    token_logp = behaviour.gather(-1, tokens[:, None]).squeeze(-1)
    if top_k <= 0:
        return Sampled(tokens, token_logp, None, None)
    top_logp, top_ids = behaviour.topk(min(top_k, logits.shape[-1]), dim=-1)
    top_logp = torch.where(torch.isfinite(top_logp), top_logp, OUTSIDE_NUCLEUS)
    return Sampled(tokens, token_logp, top_ids, top_logp)
