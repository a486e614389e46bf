"""The `openai`-client matrix (tests/openai_matrix.py) against the embedded torch engine."""

from __future__ import annotations

import pytest

from agentrl.serving.engine import TorchEngine
from agentrl.serving.server import create_app
from tests.openai_matrix import CASES, client_for
from tests.server_thread import server_in_thread


@pytest.fixture(scope="module")
def url(ckpt, tokenizer):
    with server_in_thread(create_app(TorchEngine.from_pretrained(ckpt), tokenizer, "tiny")) as base:
        yield base


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_openai_client(url, case):
    with client_for(url) as client:
        case(client, "tiny")
