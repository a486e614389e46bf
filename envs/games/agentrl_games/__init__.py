"""agentrl's first-party games: small seedable text puzzles with scripted experts.

Each game is an `agentrl.Env` registered through the `agentrl.envs` entry points (see this
distribution's pyproject.toml), so `agentrl.make("games/Sokoban-v0")` works once it is installed.
The shared turn loop (answer parsing, format penalty, turn limit) is in `agentrl_games.base`.
"""

from agentrl_games.base import BadAnswer, Result, TextGame, answer, extract_answer
from agentrl_games.calculator import CalculatorEnv
from agentrl_games.countdown import CountdownEnv
from agentrl_games.frozen_lake import FrozenLakeEnv
from agentrl_games.guess_number import GuessNumberEnv
from agentrl_games.sokoban import SokobanEnv
from agentrl_games.wordle import WordleEnv

__all__ = [
    "BadAnswer",
    "CalculatorEnv",
    "CountdownEnv",
    "FrozenLakeEnv",
    "GuessNumberEnv",
    "Result",
    "SokobanEnv",
    "TextGame",
    "WordleEnv",
    "answer",
    "extract_answer",
]
