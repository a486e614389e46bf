"""The project's own model and tokenizer agree with `transformers` on the same checkpoint."""

from __future__ import annotations

import json

import torch

from agentrl.serving.model import CausalLM
from agentrl.tokenizer import ChatTokenizer


def test_checkpoint_directory_has_the_hf_files(ckpt):
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (ckpt / name).is_file(), name
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] in (32, 64)
    assert "chat_template" in json.loads((ckpt / "tokenizer_config.json").read_text())


def test_logits_match_transformers(ckpt):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    ours = CausalLM.from_pretrained(ckpt)
    ids = torch.randint(0, ours.config.vocab_size, (2, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_cached_forward_matches_full_forward(ckpt):
    """Prefill in two chunks through the KV cache gives the logits of one full pass."""
    model = CausalLM.from_pretrained(ckpt)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    shape = (2, cfg.num_key_value_heads, 16, cfg.head_dim)
    cache = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(cfg.num_hidden_layers)]
    with torch.no_grad():
        full = model(ids)
        first = model(ids[:, :7], cache=cache, start=torch.tensor([0, 0]))
        rest = model(ids[:, 7:], cache=cache, start=torch.tensor([7, 7]))
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)


def test_save_and_reload_round_trip(ckpt, tmp_path):
    model = CausalLM.from_pretrained(ckpt)
    model.save_pretrained(tmp_path)
    again = CausalLM.from_pretrained(tmp_path)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_tokenizer_round_trips_any_text(ckpt):
    tok = ChatTokenizer(ckpt)
    text = "héllo wörld ∑ 🚀 \t\n  x=1 <not special> 中文"
    assert tok.decode(tok.encode(text)) == text


def test_chat_template_matches_transformers(ckpt):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(ckpt))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    ours = ChatTokenizer(ckpt).encode_chat(messages)
    theirs = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert ours == list(theirs)
    assert hf.decode(ours).endswith("<|im_start|>assistant\n")


def test_model_init_is_the_same_for_the_same_seed(ckpt, tmp_path):
    """Tokenizer and weights depend on the seed only (not on the package's files), so a run's
    starting model is reproducible across versions; `ckpt` was built with the default seed 0.
    """
    from agentrl.serving.checkpoint import init_checkpoint

    again = init_checkpoint(tmp_path / "again", "tiny", vocab_size=1024, seed=0)
    assert (again / "tokenizer.json").read_text() == (ckpt / "tokenizer.json").read_text()
    assert (again / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    other = init_checkpoint(tmp_path / "other", "tiny", vocab_size=1024, seed=1)
    assert (other / "model.safetensors").read_bytes() != (ckpt / "model.safetensors").read_bytes()
