"""Build the project's own tokenizer: a byte-level BPE trained offline on generated text.

There is no model hub here, so `agentrl model init` trains a small byte-level BPE at init time on
generated text in the shapes environments produce (English-like sentences, numbers, arithmetic,
chat turns with <answer> tags, JSON tool calls, code lines, grids), so the same seed gives the
same tokenizer, and so the same model, on every version of the package. (The corpus used to
include the package's own sources: then every edit changed the model `model init` built.)
Byte-level means every string round-trips: unseen text falls back to single-byte tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from agentrl.errors import PolicyError
from agentrl.tokenizer import CHAT_TEMPLATE, END_OF_TEXT, IM_END, IM_START, SPECIAL_TOKENS

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
