"""The request checks the vLLM backend applies before vLLM sees a request (same words as TorchEngine)."""

from __future__ import annotations

import math

import pytest

from agentrl.generation import SamplingParams
from agentrl.serving.engine_api import InvalidRequest
from agentrl.serving.request_checks import check_request

VOCAB, CONTEXT = 100, 16

BAD = {
    "empty prompt": ([], SamplingParams(), "prompt_token_ids is empty"),
    "prompt fills the context": (
        [1] * CONTEXT,
        SamplingParams(),
        "prompt has 16 tokens; the context holds 16",
    ),
    "id above the vocabulary": ([1, VOCAB], SamplingParams(), "token ids out of range [0, 100): [100]"),
    "negative id": ([1, -3], SamplingParams(), "token ids out of range [0, 100): [-3]"),
    "stop id outside": ([1], SamplingParams(stop_token_ids=[7, 10**9]), "stop_token_ids out of range"),
    "max_tokens 0": ([1], SamplingParams(max_tokens=0), "max_tokens must be >= 1, got 0"),
    "negative temperature": ([1], SamplingParams(temperature=-0.5), "temperature must be a finite number"),
    "infinite temperature": (
        [1],
        SamplingParams(temperature=math.inf),
        "temperature must be a finite number",
    ),
    "NaN temperature": ([1], SamplingParams(temperature=math.nan), "temperature must be a finite number"),
    "top_p 0": ([1], SamplingParams(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    "top_p above 1": ([1], SamplingParams(top_p=1.5), "top_p must be in (0, 1]"),
    "top_logprobs 21": ([1], SamplingParams(top_logprobs=21), "top_logprobs must be in [0, 20], got 21"),
    "seed of 2**64": ([1], SamplingParams(seed=2**64), "seed must fit in a signed 64-bit integer"),
    "empty stop string": ([1], SamplingParams(stop=["ok", ""]), "stop strings must not be empty"),
    "lone surrogate in stop": ([1], SamplingParams(stop=["\ud800"]), "is not valid Unicode"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_request_is_refused_with_a_message_naming_the_problem(case):
    prompt, params, words = BAD[case]
    with pytest.raises(InvalidRequest) as error:
        check_request(prompt, params, context_len=CONTEXT, vocab_size=VOCAB)
    assert words in str(error.value)


def test_stop_strings_need_a_decoder():
    with pytest.raises(InvalidRequest, match="need a tokenizer"):
        check_request(
            [1], SamplingParams(stop=["x"]), context_len=CONTEXT, vocab_size=VOCAB, can_decode=False
        )


def test_edge_values_that_are_valid_pass():
    params = SamplingParams(max_tokens=1, temperature=0.0, top_p=1.0, top_logprobs=20, seed=-(2**63))
    check_request([0, VOCAB - 1] + [1] * (CONTEXT - 3), params, context_len=CONTEXT, vocab_size=VOCAB)
