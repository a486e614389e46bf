"""Parsing the agent's action text.

Accepted forms (case-insensitive, surrounding whitespace ignored), either bare or wrapped in
`<answer>...</answer>` (then only the last such block counts, so a model may think first):

    search[query]        type `query` into the page's search box and submit it
    click[id]            follow a link or press a button listed as [id]
    type[id][text]       type `text` into input [id] and submit its form
    back                 return to the previous page
    answer[text]         give a final answer (sites that take answers)

Anything else raises `ActionError` with a message saying what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentrl.errors import AgentRLError

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_PATTERNS = {
    "search": re.compile(r"search\s*\[(.*)\]", re.DOTALL | re.IGNORECASE),
    "click": re.compile(r"click\s*\[\s*(\d+)\s*\]", re.IGNORECASE),
    "type": re.compile(r"type\s*\[\s*(\d+)\s*\]\s*\[(.*)\]", re.DOTALL | re.IGNORECASE),
    "back": re.compile(r"back(?:\s*\[\s*\])?", re.IGNORECASE),
    "answer": re.compile(r"answer\s*\[(.*)\]", re.DOTALL | re.IGNORECASE),
}
USAGE = "search[query], click[id], type[id][text], back, answer[text]"


class ActionError(AgentRLError, ValueError):
    """The action text is not one of the accepted forms, or cannot apply to the current page."""


@dataclass(frozen=True)
class Action:
    kind: str  # "search", "click", "type", "back" or "answer"
    target: int | None = None  # element id for click/type
    text: str = ""  # query, typed text or answer


def parse_action(text: str) -> Action:
    tagged = _ANSWER_TAG.findall(text)
    body = (tagged[-1] if tagged else text).strip()
    for kind, pattern in _PATTERNS.items():
        match = pattern.fullmatch(body)
        if match is None:
            continue
        if kind == "click":
            return Action("click", int(match.group(1)))
        if kind == "type":
            return Action("type", int(match.group(1)), match.group(2).strip())
        if kind == "back":
            return Action("back")
        return Action(kind, text=match.group(1).strip())
    shown = body if len(body) <= 60 else body[:57] + "..."
    raise ActionError(f"Unrecognised action {shown!r}; expected one of: {USAGE}")
