"""Wordle: feedback with repeated letters, the shipped word list, and the expert's guarantee."""

from __future__ import annotations

import pytest
from agentrl_games.wordle import _opening, best_guess, feedback, word_list

import agentrl


@pytest.mark.parametrize(
    ("guess", "target", "marks"),
    [
        ("crane", "crane", "GGGGG"),
        ("crane", "pilot", "XXXXX"),
        ("speed", "abide", "XXYXY"),  # one e in the target: only the first e is marked
        ("speed", "erase", "YXYYX"),  # two e's in erase: both e's of speed are yellow
        ("geese", "eager", "YYYXX"),  # eager has two e's: the first two e's of geese take them
        ("eerie", "sheep", "YYXXX"),  # the third e of eerie finds no e left
        ("error", "order", "YGXYG"),  # both r's of order are matched by greens: the middle r is gray
        ("llama", "hello", "YYXXX"),
        ("hello", "llama", "XXYYX"),
        ("apple", "paper", "YYGXY"),
        ("lever", "eerie", "XGXYY"),
    ],
)
def test_feedback_handles_repeated_letters(guess, target, marks):
    assert feedback(guess, target) == marks


def test_word_list_is_shipped_clean():
    words = word_list()
    assert len(words) >= 300
    assert len(set(words)) == len(words)
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in words)


def test_expert_finds_every_word_of_the_list_in_six_guesses():
    words = word_list()
    opening = _opening(words)
    worst = 0
    for target in words:
        candidates, guess, guesses = words, opening, 1
        while guess != target:
            marks = feedback(guess, target)
            candidates = tuple(w for w in candidates if feedback(guess, w) == marks)
            assert target in candidates
            guess, guesses = best_guess(candidates), guesses + 1
        worst = max(worst, guesses)
    assert worst <= 6


def test_expert_guesses_stay_consistent_after_off_list_guesses():
    env = agentrl.make("games/Wordle-v0")
    env.reset(seed=4)
    env.step("<answer>zzzzz</answer>")  # any five letters are a legal guess by default
    while True:
        guess = env.expert_action()
        word = guess.removeprefix("<answer>").removesuffix("</answer>")
        assert all(feedback(g, word) == m for g, m in env.history)
        *_, terminated, truncated, info = env.step(guess)
        if terminated or truncated:
            break
    assert info["success"]
    env.close()


def test_unknown_words_are_rejected_when_the_list_is_enforced():
    env = agentrl.make("games/Wordle-v0", allow_any_word=False)
    env.reset(seed=0)
    observation, *_, info = env.step("<answer>zzzzz</answer>")
    assert info["format_error"] and "not in the word list" in observation
    _, _, _, _, info = env.step("<answer>CRANE</answer>")  # case does not matter
    assert not info["format_error"]
    env.close()
