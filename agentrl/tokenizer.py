"""Chat tokenization without a deep-learning stack: `tokenizers` for ids, jinja2 for templates.

`ChatTokenizer` wraps any Hugging Face tokenizer directory (`tokenizer.json` plus
`tokenizer_config.json` with a chat template; the project's own or e.g. SmolLM2's) with what the
engine, server and rollout client need: encode/decode, chat rendering, the end-of-turn token and
the text the template puts between an assistant's end-of-turn token and the next message.

It reads the files itself instead of going through `transformers.AutoTokenizer` so that the
rollout side (`pip install agentrl`, no extras) needs neither transformers nor torch; the ids are
the same, since a fast HF tokenizer is this `tokenizers.Tokenizer` underneath. The project's own
chat template is ChatML:

    <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n   (generation prompt)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.errors import PolicyError
from agentrl.tools import template_has_tool_format, template_messages

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


class ChatTokenizer:
    """Encode/decode and chat rendering over a HF tokenizer directory."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.path = Path(path)
        try:
            self.backend = Tokenizer.from_file(str(self.path / "tokenizer.json"))
            config = json.loads((self.path / "tokenizer_config.json").read_text())
        except (OSError, ValueError, Exception) as exc:  # tokenizers raises a bare Exception
            raise PolicyError(f"cannot load a tokenizer from {self.path}: {exc}") from exc
        self.config: dict[str, Any] = config
        template = config.get("chat_template") or self._template_file()
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if not template:
            raise PolicyError(f"the tokenizer in {self.path} has no chat template")
        self.chat_template: str = template
        self.eos_token = _token_text(config.get("eos_token"))
        self.bos_token = _token_text(config.get("bos_token"))
        eos_id = None if self.eos_token is None else self.backend.token_to_id(self.eos_token)
        if eos_id is None:
            raise PolicyError(f"the tokenizer in {self.path} names no usable eos_token")
        self.end_of_turn_id: int = eos_id
        self.eos_token_ids = self._eos_ids()
        self._template = _compile_template(self.chat_template)
        #: whether the template renders tools itself; if not, `agentrl.tools`' default format is used
        self.native_tools = template_has_tool_format(self.chat_template)
        self._cleanup_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.turn_separator = self._turn_separator()

    def _template_file(self) -> str | None:
        path = self.path / "chat_template.jinja"
        return path.read_text() if path.is_file() else None

    def _eos_ids(self) -> list[int]:
        ids = {self.end_of_turn_id}
        gen = self.path / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos])
        return sorted(i for i in ids if i is not None)

    def _turn_separator(self) -> str:
        """The text the template writes after an assistant's end-of-turn token (ChatML: "\\n")."""
        eos = self.eos_token
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        text = self.render(probe, add_generation_prompt=False)
        if eos is None or eos not in text:
            raise PolicyError(f"the chat template does not end assistant turns with {eos!r}")
        return text[text.rindex(eos) + len(eos) :]

    @property
    def pad_token_id(self) -> int | None:
        pad = _token_text(self.config.get("pad_token"))
        return self.backend.token_to_id(pad) if pad else None

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids; nothing is added."""
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text: str = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_spaces(text) if self._cleanup_spaces else text

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The chat template applied to `messages` and `tools` (see `agentrl.tools` for the format).

        Messages may be OpenAI-shaped: assistant messages with `tool_calls`, `tool` messages.
        """
        try:
            text: str = self._template.render(
                messages=template_messages(messages, tools, self.native_tools),
                tools=(tools or None) if self.native_tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except Exception as exc:  # a template's raise_exception() or a TemplateError
            raise PolicyError(f"the chat template rejected the messages: {exc}") from exc
        return text

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt, tools))

    def continuation_text(
        self, new_messages: list[dict[str, Any]], closed: bool, tools: list[dict[str, Any]] | None = None
    ) -> str:
        """Text to append after a sampled assistant turn: separator, new messages, generation prompt.

        Rendered as the difference between a conversation with and without the new messages, so
        templates that add a default system prompt or per-turn decorations stay right. `closed`
        says whether the sampled turn already ended with the end-of-turn token; if not (length
        limit, stop string), the end-of-turn token is written first so the turn is well formed.
        """
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        head = self.render(base, add_generation_prompt=False, tools=tools)
        full = self.render(base + list(new_messages), add_generation_prompt=True, tools=tools)
        if not full.startswith(head):
            raise PolicyError("the chat template is not prefix-stable; cannot render turns incrementally")
        prefix = "" if closed else (self.eos_token or "")
        return prefix + self.turn_separator + full[len(head) :]


def _token_text(token: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _compile_template(source: str) -> Any:
    """A sandboxed jinja2 template with the helpers HF chat templates expect."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise PolicyError(f"the chat template does not compile: {exc}") from exc


_CLEANUPS = [
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
]  # fmt: skip


def _clean_up_spaces(text: str) -> str:
    """transformers' `clean_up_tokenization_spaces`, for tokenizers configured with it."""
    for before, after in _CLEANUPS:
        text = text.replace(before, after)
    return text
