"""The answer-tag parser shared by every game."""

from __future__ import annotations

import time

import pytest
from agentrl_games import answer, extract_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>left</answer>", "left"),
        ("<ANSWER>  Left \n</Answer>", "Left"),
        ("< answer >up</ answer >", "up"),
        ("I think <answer>up</answer>. No wait: <answer>down</answer>", "down"),  # last block wins
        ("<think>reply <answer>x</answer> format</think> so <answer>42</answer> done", "42"),
        ("<answer>a<answer>b</answer>", "b"),  # the innermost opening before the last close
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer_reads_the_last_complete_block(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text", ["", "left", "<answer>left", "left</answer>", "</answer><answer>x", None, 7])
def test_extract_answer_without_a_complete_block_is_none(text):
    assert extract_answer(text) is None


def test_extract_answer_is_linear_on_adversarial_text():
    text = "<answer>" * 100_000 + "< " * 100_000
    start = time.process_time()  # CPU time: other processes on the machine do not count
    assert extract_answer(text) is None
    assert extract_answer(text + "</answer>") == ("< " * 100_000).strip()
    assert time.process_time() - start < 2.0


def test_answer_round_trips():
    assert extract_answer(answer("crane")) == "crane"
