"""The project's own tokenizer (byte-level BPE trained offline) and the chat-template helpers.

There is no model hub here, so `agentrl model init` trains a small byte-level BPE at init time on
generated text in the shapes environments produce (English-like sentences, numbers, arithmetic,
chat turns with <answer> tags, JSON tool calls, code lines, grids), so the same seed gives the
same tokenizer, and so the same model, on every version of the package. (The corpus used to
include the package's own sources: then every edit changed the model `model init` built.)
Byte-level means every string round-trips: unseen text falls back to single-byte tokens. The
chat template is ChatML:

    <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n   (generation prompt)

`ChatTokenizer` wraps any HF tokenizer directory (ours or e.g. Qwen2.5's) with what the engine,
server and client need: encode/decode, chat rendering, the end-of-turn token and the text the
template puts between an assistant's end-of-turn token and the next message.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.errors import PolicyError

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

_WORD_TEXT = (
    "the a an agent action answer board box call cell code count done down east error file find "
    "game goal grid guess have health hint item key left level list look move north number observe "
    "open path pick place player point reward right room run score search south state step stop "
    "take test think tool try turn up use value wall west win word you your is are was not and or "
    "if then else yes no good bad more less high low correct wrong invalid please "
    "i am it its this that there here what which who how why when where of to in on at by for "
    "from with as into after before each every all any some one two three first last next new "
    "old big small bigger smaller higher lower between integer guess reply like say says thinking "
    "number numbers letter letters target use make get give put show write read return print "
    "only must can will should may try again out over under above below position row column "
    "empty wall box target push sokoban wordle frozen lake hole start end solve solved puzzle "
    "valid format feedback remaining attempts"
)
_WORDS = _WORD_TEXT.split()


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(4, 16))).capitalize() + "."


def _generated_lines(seed: int, n: int) -> Iterator[str]:
    """Deterministic synthetic text in the shapes environments produce."""
    rng = random.Random(seed)
    for _ in range(n):
        kind = rng.randrange(7)
        if kind == 0:
            a, b = rng.randrange(1000), rng.randrange(1000)
            op = rng.choice("+-*")
            yield f"What is {a} {op} {b}? The answer is {eval(f'{a}{op}{b}')}."  # ints only
        elif kind == 1:
            yield _sentence(rng)
        elif kind == 2:
            args = {rng.choice(_WORDS): rng.randrange(100) for _ in range(rng.randrange(1, 4))}
            yield json.dumps({"tool": rng.choice(_WORDS), "arguments": args})
        elif kind == 3:
            answer = rng.choice([str(rng.randrange(100)), rng.choice(_WORDS), rng.choice(_WORDS).upper()])
            yield (
                f"{IM_START}user\n{_sentence(rng)} {rng.randrange(100)}{IM_END}\n"
                f"{IM_START}assistant\n<answer>{answer}</answer>{IM_END}\n"
            )
        elif kind == 4:
            name, arg = rng.choice(_WORDS), rng.choice(_WORDS)
            yield f"def {name}_{rng.choice(_WORDS)}({arg}):\n    return {arg} + {rng.randrange(10)}\n"
        elif kind == 5:
            yield f"{_sentence(rng)} Reply like <answer>{rng.randrange(10)}</answer>."
        else:
            row = "".join(rng.choice(".#@x ") for _ in range(rng.randrange(4, 12)))
            yield f"{row}\n" * rng.randrange(1, 4)


def training_corpus(seed: int = 0) -> Iterator[str]:
    """Generated lines only: deterministic for a seed, whatever the package's files say."""
    yield from _generated_lines(seed, 30_000)


def build_tokenizer(vocab_size: int = 2048, seed: int = 0):
    """Train a byte-level BPE and wrap it as a `transformers` fast tokenizer with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise PolicyError(f"vocab_size must exceed the 256 byte tokens plus specials, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(seed), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )


class ChatTokenizer:
    """Encode/decode and chat rendering over a HF tokenizer directory."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self.path = Path(path)
        try:
            self.hf = AutoTokenizer.from_pretrained(str(self.path))
        except (OSError, ValueError) as exc:
            raise PolicyError(f"cannot load a tokenizer from {self.path}: {exc}") from exc
        if self.hf.chat_template is None:
            raise PolicyError(f"the tokenizer in {self.path} has no chat template")
        self.eos_token_ids = self._eos_ids()
        self.end_of_turn_id = self.hf.eos_token_id
        self.turn_separator = self._turn_separator()

    def _eos_ids(self) -> list[int]:
        ids = {self.hf.eos_token_id}
        gen = self.path / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos])
        return sorted(i for i in ids if i is not None)

    def _turn_separator(self) -> str:
        """The text the template writes after an assistant's end-of-turn token (ChatML: "\\n")."""
        eos = self.hf.eos_token
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        text = self.render(probe, add_generation_prompt=False)
        if eos not in text:
            raise PolicyError(f"the chat template does not end assistant turns with {eos!r}")
        return text[text.rindex(eos) + len(eos) :]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it become their ids; nothing is added."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt))

    def continuation_text(self, new_messages: list[dict[str, Any]], closed: bool) -> str:
        """Text to append after a sampled assistant turn: separator, new messages, generation prompt.

        Rendered as the difference between a conversation with and without the new messages, so
        templates that add a default system prompt or per-turn decorations stay right. `closed`
        says whether the sampled turn already ended with the end-of-turn token; if not (length
        limit, stop string), the end-of-turn token is written first so the turn is well formed.
        """
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        head = self.render(base, add_generation_prompt=False)
        full = self.render(base + list(new_messages), add_generation_prompt=True)
        if not full.startswith(head):
            raise PolicyError("the chat template is not prefix-stable; cannot render turns incrementally")
        prefix = "" if closed else self.hf.eos_token
        return prefix + self.turn_separator + full[len(head) :]
