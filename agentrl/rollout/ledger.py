"""The token layout of an episode, written once: what the policy saw, token by token.

Token-in/token-out means an episode's training data is exactly the tokens the policy server
received and sampled, never a re-tokenization of the conversation's text. `TokenLedger` is the
one place that decides those tokens; the RL client (`PolicyClient`) and the supervised warm
start (SFT) both use it, so the two cannot disagree on a separator.

The layout, per turn:

- the first prompt is the chat template applied to the conversation so far, with the generation
  prompt (`<|im_start|>assistant\\n` in ChatML);
- a later prompt renders ONLY the messages the ledger has not seen (the policy's own previous
  reply is skipped: its exact sampled tokens are already there) as the template's continuation
  after an assistant turn: the separator the template writes after the end-of-turn token, the
  new messages, and the generation prompt;
- if the previous sampled turn did not end with the end-of-turn token (length limit, a stop
  string), the ledger writes the end-of-turn token first, so the context stays a well-formed
  conversation.

Tool turns follow the same rule: the env's tools are rendered into the first prompt (the chat
template's own tool format, or the default `<tool_call>` one, see `agentrl.tools`); the policy's
reply with its calls is its sampled tokens as they are; the `tool` messages with the results are
new messages, rendered as the continuation after it. A forced call opening (`tool_choice`
"required" or a named tool) is appended after the generation prompt as prompt tokens: the model
saw it, but did not sample it.

Concatenating every turn's prompt tokens and sampled tokens gives exactly the last prompt the
server received plus its last sample. Where the model sampled a non-canonical split of its text,
these tokens are the truth (they are what the model saw) and re-tokenizing the conversation would
differ: that drift is what the ledger exists to avoid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.errors import PolicyError
from agentrl.tokenizer import ChatTokenizer


class TokenLedger:
    """The exact token ids of one episode so far, and the rule for appending the next turn."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.messages_seen = 0  # how many of the conversation's messages are already in `tokens`
        self.closed = True  # the last sampled turn ended with the end-of-turn token

    def next_prompt(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        forced: str = "",
    ) -> list[int]:
        """The tokens to append before sampling, for the messages not yet in the ledger.

        `tools`: the episode's tools (the same list every turn). `forced`: text that opens the
        reply (`agentrl.tools.forced_prefix`), appended as its own tokens after the prompt.
        """
        tokenizer = self.tokenizer
        forced_ids = tokenizer.encode(forced) if forced else []
        if not self.tokens:
            return tokenizer.encode_chat(list(messages), add_generation_prompt=True, tools=tools) + forced_ids
        new = list(messages[self.messages_seen :])
        if new and new[0]["role"] == "assistant":
            new = new[1:]  # our own reply: its exact sampled tokens are already in the context
        if not new:
            raise PolicyError("no new message since the last turn; nothing to respond to")
        return (
            tokenizer.encode(tokenizer.continuation_text(new, closed=self.closed, tools=tools)) + forced_ids
        )

    def record(self, prompt: Sequence[int], sampled: Sequence[int], messages_seen: int) -> None:
        """Append one turn: the prompt tokens sent and the tokens sampled after them."""
        self.tokens += [*prompt, *sampled]
        self.messages_seen = messages_seen
        self.closed = bool(sampled) and sampled[-1] == self.tokenizer.end_of_turn_id

    def action_tokens(self, text: str) -> list[int]:
        """The tokens an engine samples to say `text` and stop: the text, then end-of-turn.

        For actions that were not sampled (scripted play used as SFT data).
        """
        return [*self.tokenizer.encode(text), self.tokenizer.end_of_turn_id]
