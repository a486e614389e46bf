"""Read the code the agent submitted.

Format (documented to the agent in the system prompt): a submission is the last ```python fenced
block (```py or a bare ``` also work), or the text inside the last <answer>...</answer> (which may
itself hold a fenced block). Tool calls (`code/PythonTool-v0`) are read by `agentrl.tools`.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str | None:
    """The submitted code, or None when the text holds no non-empty code block or answer."""
    answers = _ANSWER.findall(text)
    if answers:
        inner = answers[-1]
        blocks = _FENCE.findall(inner)
        code = blocks[-1] if blocks else inner
    else:
        blocks = _FENCE.findall(text)
        if not blocks:
            return None
        code = blocks[-1]
    return code.strip("\n") + "\n" if code.strip() else None


def format_submission(code: str) -> str:
    """`code` as a submission in the canonical format (what `expert_action()` returns)."""
    return f"```python\n{code.strip()}\n```"
