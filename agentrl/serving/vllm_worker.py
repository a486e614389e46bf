"""Code that runs inside vLLM's worker process (loaded through `worker_extension_cls`).

vLLM 0.32's in-place `reload_weights` skips a tied output head (`tie_word_embeddings`: the
checkpoint has no `lm_head.weight`), and on a CPU that head multiplies with a packed copy of
the weights made at load time. So after a reload the head would still compute logits with the
old embedding matrix. `agentrl_reload_weights` reloads, ties the head to the new embedding and
lets the head's linear method re-pack it (a no-op on GPUs).
"""

from __future__ import annotations

from typing import Any


class WeightReloadExtension:
    """Mixed into vLLM's worker class; `self` is the worker."""

    model_runner: Any

    def agentrl_reload_weights(self, weights_path: str) -> None:
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()
        if getattr(model.config, "tie_word_embeddings", False):
            model.lm_head.weight = model.model.embed_tokens.weight
            model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
