"""Wordle: find a hidden five-letter word from per-letter colour feedback.

The word list (`data/words.txt`, about 500 common English words) was written for this project
and ships as package data. The expert only ever guesses words consistent with all feedback so
far, choosing among them the one that splits the remaining candidates into the most even groups,
which finds every word of the list within six guesses.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from importlib import resources
from typing import Any

import numpy as np

from agentrl import EnvSpec
from agentrl_games.base import BadAnswer, Result, TextGame

GREEN, YELLOW, GRAY = "G", "Y", "X"
_WORD = re.compile(r"[a-z]{5}")


@functools.cache
def word_list() -> tuple[str, ...]:
    """The shipped list of five-letter words (lower case, sorted, no duplicates)."""
    text = resources.files("agentrl_games").joinpath("data/words.txt").read_text(encoding="utf-8")
    return tuple(sorted({line.strip() for line in text.splitlines() if line.strip()}))


def feedback(guess: str, target: str) -> str:
    """Per-letter marks for `guess`: G right letter and place, Y elsewhere in the word, X absent.

    Repeated letters follow the game's rule: greens are marked first, then each remaining letter
    is yellow only while the target still has an unmatched copy of it, left to right. So "speed"
    against "abide" gives "XXYXY": "abide" has one e, which the first e of "speed" takes.
    """
    marks = [GRAY] * len(guess)
    unmatched: Counter[str] = Counter()
    for i, (g, t) in enumerate(zip(guess, target, strict=True)):
        if g == t:
            marks[i] = GREEN
        else:
            unmatched[t] += 1
    for i, g in enumerate(guess):
        if marks[i] != GREEN and unmatched[g] > 0:
            marks[i] = YELLOW
            unmatched[g] -= 1
    return "".join(marks)


def best_guess(candidates: tuple[str, ...]) -> str:
    """The candidate whose feedback splits `candidates` into the smallest expected group.

    Only consistent words are considered, so every guess could be the answer.
    """
    if len(candidates) <= 2:
        return candidates[0]
    return min(candidates, key=lambda guess: _expected_group(guess, candidates))


def _expected_group(guess: str, candidates: tuple[str, ...]) -> float:
    sizes = Counter(feedback(guess, target) for target in candidates)
    return sum(n * n for n in sizes.values())


@functools.cache
def _opening(candidates: tuple[str, ...]) -> str:
    """The first guess depends only on the list: compute it once per process."""
    return best_guess(candidates)


class WordleEnv(TextGame[str]):
    """Guess the hidden five-letter word in `max_turns` (6) tries.

    After each guess the env answers `guess: MARKS`, one mark per letter: G (green) right letter
    in the right place, Y (yellow) in the word but elsewhere, X (gray) not in the word (repeated
    letters are marked as in the original game). Rewards: 1.0 for guessing the word (terminates);
    `format_penalty` (-0.1) for an answer that is not five letters (or, with
    `allow_any_word=False`, not in the word list); `-step_cost` (0 by default) for a wrong guess.

    Kwargs: `allow_any_word` (default True: any five letters are a legal guess, so a small model
    is not punished for spelling), `max_turns` (default 6).
    """

    default_max_turns = 6

    def __init__(self, *, allow_any_word: bool = True, **kwargs: Any) -> None:
        self.allow_any_word = bool(allow_any_word)
        self.words = word_list()
        self._known = frozenset(self.words)
        super().__init__(**kwargs)
        self.system_prompt = (
            f"Wordle. Guess the hidden 5-letter English word in {self.max_turns} tries. After each guess "
            "you get one mark per letter: G = right letter, right place; Y = in the word, wrong place; "
            "X = not in the word. Reply with your guess like <answer>crane</answer>."
        )

    def new_game(self) -> str:
        self.target = self.words[int(self.np_random.integers(len(self.words)))]
        self.history: list[tuple[str, str]] = []
        self._candidates = self.words
        return self.render_state()

    def parse_move(self, text: str) -> str:
        word = text.strip().lower()
        if not _WORD.fullmatch(word):
            raise BadAnswer("Answer with one 5-letter word.")
        if not self.allow_any_word and word not in self._known:
            raise BadAnswer(f"{word} is not in the word list.")
        return word

    def play(self, move: str) -> Result:
        marks = feedback(move, self.target)
        self.history.append((move, marks))
        self._candidates = tuple(w for w in self._candidates if feedback(move, w) == marks)
        return Result(f"{move}: {marks}", success=move == self.target)

    def render_state(self) -> str:
        if not self.history:
            return "Guess the 5-letter word."
        return "\n".join(f"{guess}: {marks}" for guess, marks in self.history)

    def expert_move(self) -> str:
        if not self.history:
            return _opening(self.words)
        # Guesses outside the list do not narrow `_candidates` incorrectly: they are filtered by
        # the same feedback rule, so the target always stays among them.
        return best_guess(self._candidates)

    def random_move(self, rng: np.random.Generator) -> str:
        return self.words[int(rng.integers(len(self.words)))]


WORDLE = EnvSpec(
    id="games/Wordle-v0",
    entry_point=WordleEnv,
    kwargs={},
    description="Wordle over ~500 common 5-letter words, G/Y/X feedback, 6 guesses.",
)
