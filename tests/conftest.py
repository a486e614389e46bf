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
