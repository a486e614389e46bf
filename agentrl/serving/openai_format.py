"""Sampled tokens -> the text and log-prob fields of OpenAI responses, whole or streamed.

OpenAI semantics, which the token route (/v1/generate) deliberately does not apply because a
trainer needs every sampled token:

- the end-of-turn / EOS token (or a matched `stop_token_ids` token) ends the choice and its
  text never appears in the output;
- the output ends *before* the first stop string, which is not included;
- a stream never sends text it may have to take back: a tail that could be the start of a stop
  string, or an incomplete UTF-8 sequence, is held until the next tokens decide it.

Log-prob entries are given for every sampled token except a dropped end token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REPLACEMENT = "\ufffd"  # what a byte-level decoder gives for an incomplete UTF-8 sequence


class VisibleText:
    """One choice's text as its tokens arrive; `feed` returns the text that may be shown now."""

    def __init__(self, decode: Callable[[list[int]], str], end_ids: frozenset[int], stops: list[str]) -> None:
        self.decode, self.end_ids, self.stops = decode, end_ids, stops
        self.tokens: list[int] = []
        self.shown = 0  # characters of the visible text already returned
        self.cut = False  # a stop string was found: nothing more is shown

    def visible_tokens(self, new: list[int], finish_reason: str | None) -> list[int]:
        """`new` without a trailing end token (which ends a choice with finish_reason "stop")."""
        if finish_reason == "stop" and new and new[-1] in self.end_ids:
            return new[:-1]
        return new

    def feed(self, new: list[int], finish_reason: str | None) -> str:
        if self.cut:
            return ""
        self.tokens += self.visible_tokens(new, finish_reason)
        text = self.decode(self.tokens)
        at = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if at >= 0:
            self.cut = True
            end = at
        elif finish_reason is not None:
            end = len(text)
        else:
            end = len(text) - self._held_back(text)
        delta = text[self.shown : end] if end > self.shown else ""
        self.shown = max(self.shown, end)
        return delta

    def _held_back(self, text: str) -> int:
        """How many trailing characters might still change: a partial character or stop string."""
        hold = len(text) - len(text.rstrip(REPLACEMENT))
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        return hold


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "replace"))}


def chat_logprobs(
    pieces: list[str], logprobs: list[float], tops: list[list[tuple[str, float]]] | None
) -> dict[str, Any]:
    """`choice.logprobs` of a chat completion (one entry per token, its alternatives if asked)."""
    content = []
    for i, (piece, lp) in enumerate(zip(pieces, logprobs, strict=True)):
        alternatives = [_entry(t, v) for t, v in tops[i]] if tops is not None else []
        content.append(_entry(piece, lp) | {"top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(
    pieces: list[str], logprobs: list[float], tops: list[list[tuple[str, float]]] | None, offset: int
) -> dict[str, Any]:
    """`choice.logprobs` of a (legacy) completion: parallel lists; `offset` is the text already sent."""
    offsets, pos = [], offset
    for piece in pieces:
        offsets.append(pos)
        pos += len(piece)
    return {
        "tokens": pieces,
        "token_logprobs": logprobs,
        "top_logprobs": None if tops is None else [dict(t) for t in tops],
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
