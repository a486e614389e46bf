"""The request bodies the policy server accepts, as pydantic models (they also make /openapi.json).

Every parameter a body may carry is declared here. A parameter that is not declared is refused
with 400 naming it (`extra="forbid"`), and a declared OpenAI parameter this server does not
implement is accepted only at its no-op value (e.g. `presence_penalty: 0`), so nothing a client
sends is silently ignored. Numbers must be finite (no NaN/Infinity).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.generation import SamplingParams
from agentrl.serving.request_checks import MAX_TOP_LOGPROBS
from agentrl.serving.tools import ToolMessageFields, ToolRequestFields

MAX_N = 16  # choices per prompt
MAX_PROMPTS = 64  # prompts in one /v1/completions request
MAX_STOP = 16  # stop strings
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

StopString = Annotated[str, Field(min_length=1, max_length=256)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Sampling(_Body):
    """The sampling fields shared by every generation route."""

    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float = Field(default=1.0, ge=0.0, description="0 (or below 1e-5) is greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: StopString | list[StopString] | None = Field(
        default=None, description="output ends before the first stop string (not included)"
    )
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT64_MAX)]] = Field(
        default_factory=list, max_length=64
    )
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return v

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, max_tokens: int, top_logprobs: int = 0, seed_offset: int = 0) -> SamplingParams:
        seed = self.seed
        if seed is not None and seed_offset:  # choice i of n: its own stream, still reproducible
            seed = (seed + seed_offset - INT64_MIN) % 2**64 + INT64_MIN
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stops(),
            stop_token_ids=list(self.stop_token_ids),
            seed=seed,
            top_logprobs=top_logprobs,
        )


class StreamOptions(_Body):
    include_usage: bool = False


class ResponseFormat(_Body):
    type: Literal["text"] = Field(description="only plain text; json_object / json_schema are refused")


class _OpenAISampling(_Sampling):
    """The OpenAI fields of chat and completions (a no-op value is the only one accepted for the
    features this server does not implement)."""

    model: str | None = Field(default=None, description="must be the served model's id if given")
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    logit_bias: dict[str, float] | None = Field(default=None, max_length=0, description="not supported")
    user: str | None = Field(default=None, max_length=256, description="accepted, not used")

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _OpenAISampling:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        return self


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(ToolMessageFields, _Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(
        default=None, description="a string or a list of text parts (may be null beside tool_calls)"
    )

    def render(self) -> dict[str, Any]:
        """The message as the chat template sees it (`developer` is the system role there)."""
        content = self.content or ""
        text = content if isinstance(content, str) else "\n".join(p.text for p in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": text} | self.tool_fields()


class ChatBody(_OpenAISampling, ToolRequestFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    store: bool = Field(default=False, description="not supported: false only")

    @field_validator("store")
    @classmethod
    def _no_store(cls, v: bool) -> bool:
        if v:
            raise ValueError("store=true is not supported")
        return v

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatBody:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        return self


TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=INT64_MAX)]], Field(min_length=1)]


class CompletionBody(_OpenAISampling):
    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(
        description="a string, a list of strings, a list of token ids, or a list of those"
    )
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: None = Field(default=None, description="not supported")
    best_of: int | None = Field(default=None, ge=1, description="only equal to n")

    @model_validator(mode="after")
    def _checks(self) -> CompletionBody:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt: must not be an empty list")
        if isinstance(self.prompt, list) and len(self.prompt) > MAX_PROMPTS:
            raise ValueError(f"prompt: at most {MAX_PROMPTS} prompts in one request")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of: only best_of == n is supported")
        if self.echo and self.logprobs is not None:
            raise ValueError("echo: echo together with logprobs is not supported (no prompt logprobs)")
        return self

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class GenerateBody(_Sampling):
    """The token route: exact token ids in and out (what the training client uses)."""

    prompt_token_ids: TokenIds
    session_id: str | None = Field(default=None, max_length=512)
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)


class ReleaseBody(_Body):
    session_ids: list[Annotated[str, Field(max_length=512)]] = Field(max_length=100_000)


class WeightsLoadBody(_Body):
    path: str = Field(min_length=1, max_length=4096, description="a HF checkpoint directory")
    version: int = Field(ge=0, le=INT64_MAX, description="the policy version these weights are")


ROUTE_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatBody,
    "/v1/completions": CompletionBody,
    "/v1/generate": GenerateBody,
    "/v1/sessions/release": ReleaseBody,
    "/v1/weights/load": WeightsLoadBody,
}
