"""The `openai`-client conformance matrix, for any policy server URL (torch engine or vLLM).

chat and completions x {plain, stream, stream + usage, n, logprobs, top_logprobs, stop, stop in
a stream, unsupported parameter -> 400, unknown model -> 404}. Each case is a function of an
`openai.OpenAI` client and the served model's id; `test_openai_matrix.py` runs them against the
embedded engine, and the vLLM tests can import `CASES` and run them against theirs.
Outputs that are compared are greedy or seeded, so the checks hold for any model.
"""

from __future__ import annotations

from collections.abc import Callable

import openai

MESSAGES = [{"role": "user", "content": "Tell me a story about a cat."}]
PROMPT = "Once upon a time"


def _stop_from(text: str) -> str | None:
    """A two-character stop string taken from the middle of a greedy output, if it is long enough."""
    for k in range(len(text) // 2, len(text) - 2):
        stop = text[k : k + 2]
        if stop.strip() and "\ufffd" not in stop:
            return stop
    return None


def chat_plain(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and len(r.choices) == 1
    assert r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1


def chat_stream(client: openai.OpenAI, model: str) -> None:
    plain = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=12, temperature=0, stream=True
        )
    )
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def chat_stream_usage(client: openai.OpenAI, model: str) -> None:
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens >= 1 and all(c.usage is None for c in chunks[:-1])


def chat_n(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, n=3, seed=1)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    chunks = list(
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, n=2, seed=1, stream=True)
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def chat_logprobs(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True
    )
    content = r.choices[0].logprobs.content
    assert 1 <= len(content) <= r.usage.completion_tokens
    assert all(e.logprob <= 0 and e.top_logprobs == [] for e in content)
    chunks = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    streamed = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [e.logprob for e in streamed] == [e.logprob for e in content]
    assert all(len(e.top_logprobs) == 2 for e in streamed)


def chat_top_logprobs(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=5
    )
    for entry in r.choices[0].logprobs.content:
        alternatives = [a.logprob for a in entry.top_logprobs]
        assert len(alternatives) == 5 and alternatives == sorted(alternatives, reverse=True)
        assert abs(entry.logprob - alternatives[0]) < 1e-4  # greedy: the sampled token is the top one


def chat_stop(client: openai.OpenAI, model: str) -> None:
    full = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, seed=7)
    text = full.choices[0].message.content
    stop = _stop_from(text)
    assert stop is not None, f"output too short to pick a stop string: {text!r}"
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, seed=7, stop=[stop])
    assert r.choices[0].message.content == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, seed=7, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[: text.index(stop)]


def chat_roles_and_parts(client: openai.OpenAI, model: str) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
    ]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    assert r.choices[0].message.role == "assistant"


def chat_unsupported_parameter(client: openai.OpenAI, model: str) -> None:
    for kwargs, param in [
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"response_format": {"type": "json_object"}}, "response_format.type"),
        ({"extra_body": {"guided_json": {}}}, "guided_json"),
    ]:
        try:
            client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, **kwargs)
        except openai.BadRequestError as exc:
            assert param in str(exc), (param, str(exc))
        else:
            raise AssertionError(f"{param} was accepted")


def chat_unknown_model(client: openai.OpenAI, model: str) -> None:
    try:
        client.chat.completions.create(model=model + "-nope", messages=MESSAGES, max_tokens=4)
    except openai.NotFoundError as exc:
        assert "does not exist" in str(exc)
    else:
        raise AssertionError("an unknown model was accepted")


def completion_plain(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0)
    assert (
        r.object == "text_completion"
        and isinstance(r.choices[0].text, str)
        and r.usage.completion_tokens >= 1
    )


def completion_stream(client: openai.OpenAI, model: str) -> None:
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0)
    chunks = list(
        client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    with_usage = list(
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert with_usage[-1].usage is not None and with_usage[-1].usage.prompt_tokens >= 1


def completion_n_and_prompt_list(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=[PROMPT, "The cat"], max_tokens=4, n=2, seed=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    token_prompt = client.completions.create(model=model, prompt=[5, 6, 7], max_tokens=3)
    assert token_prompt.usage.prompt_tokens == 3


def completion_logprobs(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) >= 1
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs)
    zero = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=0)
    assert zero.choices[0].logprobs.token_logprobs == lp.token_logprobs


def completion_stop_and_echo(client: openai.OpenAI, model: str) -> None:
    text = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, seed=7).choices[0].text
    stop = _stop_from(text)
    assert stop is not None, f"output too short to pick a stop string: {text!r}"
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, seed=7, stop=stop)
    assert r.choices[0].text == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
    echoed = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, seed=7, echo=True)
    assert echoed.choices[0].text == PROMPT + text


def completion_unsupported_parameter(client: openai.OpenAI, model: str) -> None:
    try:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, suffix="!")
    except openai.BadRequestError as exc:
        assert "suffix" in str(exc)
    else:
        raise AssertionError("suffix was accepted")


CASES: list[Callable[[openai.OpenAI, str], None]] = [
    chat_plain, chat_stream, chat_stream_usage, chat_n, chat_logprobs, chat_top_logprobs, chat_stop,
    chat_roles_and_parts, chat_unsupported_parameter, chat_unknown_model,
    completion_plain, completion_stream, completion_n_and_prompt_list, completion_logprobs,
    completion_stop_and_echo, completion_unsupported_parameter,
]  # fmt: skip


def client_for(url: str, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)
