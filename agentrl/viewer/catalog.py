"""What the viewer shows, as plain JSON-ready data: runs, filtered episode lists, one episode, curves.

Kept apart from the HTTP server so it can be tested (and reused) without a socket. Every read
first polls the stores, which is what makes the page live: a run still writing shows its new
episodes on the browser's next poll.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError
from agentrl.recording import RECORDING_DIR, SUFFIX, EpisodeRecord, Recording, find_store

METRICS_FILE = "metrics.jsonl"
LIST_LIMIT = 1000  # episodes per list response; the page says how many more matched


class BadQuery(AgentRLError):
    """A request the viewer cannot answer as asked (an unknown run, episode or filter value)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class RunView:
    """One run (or one `--record` directory): its store, metrics file and tokenizer."""

    name: str
    root: Path
    store: Recording
    decode: Callable[[int], str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> dict[str, Any]:
        with self.lock:
            self.store.poll()
            current = self.store.current()
            return {
                "name": self.name,
                "path": str(self.root),
                "episodes": len(current),
                "superseded": len(self.store.summaries) - len(current),
                "steps": sorted({s["step"] for s in current if s["step"] is not None}),
                "batches": sorted(self.store.batches),
                "envs": sorted({s["env_id"] for s in current}),
                "stop_reasons": sorted({s["stop_reason"] for s in current}),
                "sources": sorted({s["source"] for s in current}),
                "has_metrics": (self.root / METRICS_FILE).is_file(),
                "tokens_decoded": self.decode is not None,
            }

    def episodes(self, query: Mapping[str, str]) -> dict[str, Any]:
        """Summaries matching every given filter, newest first.

        Episodes a resumed run superseded (recorded for steps it then redid) are left out unless
        the query asks for them: `superseded=true` lists only those, `superseded=any` all.
        """
        test = _filter(query)
        with self.lock:
            self.store.poll()
            matched = [s for s in self.store.summaries if test(s)]
        matched.reverse()
        return {"total": len(matched), "episodes": matched[:LIST_LIMIT]}

    def episode(self, key: str) -> dict[str, Any]:
        with self.lock:
            self.store.poll()
            try:
                record = self.store.episode(key)
            except AgentRLError:
                raise BadQuery(f"run {self.name!r} has no episode {key!r}", 404) from None
        return self._render(record)

    def metrics(self) -> list[dict[str, Any]]:
        """The run's metrics.jsonl records (a torn last line is skipped); non-finite numbers dropped."""
        path = self.root / METRICS_FILE
        if not path.is_file():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records.append(
                {k: v for k, v in record.items() if not (isinstance(v, float) and not math.isfinite(v))}
            )
        return records

    def _render(self, record: EpisodeRecord) -> dict[str, Any]:
        t = record.trajectory
        turns = []
        for turn in t.turns:
            tokens = [
                {"id": token, "logprob": logprob, "version": version, "text": self._text(token)}
                for token, logprob, version in zip(
                    turn.action_token_ids, turn.action_logprobs, turn.action_versions, strict=False
                )
            ]
            extra = {name: value for name, value in vars(turn).items() if name not in _SHOWN_TURN_FIELDS}
            turns.append(
                {
                    "observation": turn.observation,
                    "action": turn.action,
                    "reward": turn.reward,
                    "info": turn.info,
                    "finish_reason": turn.finish_reason,
                    "policy_seconds": turn.policy_seconds,
                    "env_seconds": turn.env_seconds,
                    "prompt_tokens": len(turn.prompt_token_ids),
                    "tokens": tokens,
                    "extra": extra,  # e.g. tool calls and tool messages, shown as they are
                }
            )
        return {
            **record.summary(),
            "system_prompt": t.system_prompt,
            "error": t.error,
            "final_observation": t.final_observation,
            "info": t.info,
            "turns": turns,
        }

    def _text(self, token: int) -> str | None:
        if self.decode is None:
            return None
        try:
            return self.decode(token)
        except Exception:  # an id outside the tokenizer's vocabulary: show the id instead
            return None


class Catalog:
    """The runs under the viewer's root: the root itself, or every run directory below it."""

    def __init__(self, root: str | Path, tokenizer: str | Path | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise AgentRLError(f"{self.root} is not a directory")
        self.tokenizer = Path(tokenizer) if tokenizer else None
        self._runs: dict[str, RunView] = {}
        self._lock = threading.Lock()
        self.refresh()
        if not self._runs:
            raise AgentRLError(
                f"{self.root} holds no recorded run: train with recording on, or "
                "`agentrl rollout ENV --record DIR`, then view that directory"
            )

    def refresh(self) -> None:
        """Pick up runs that started recording since the last call."""
        with self._lock:
            for directory in self._candidates():
                name = "." if directory == self.root else str(directory.relative_to(self.root))
                if name not in self._runs:
                    store = Recording(find_store(directory))
                    self._runs[name] = RunView(name, directory, store, _decoder(directory, self.tokenizer))

    def _candidates(self) -> list[Path]:
        if _is_run(self.root):
            return [self.root]
        found = {p.parent.parent for p in self.root.glob(f"**/{RECORDING_DIR}/*{SUFFIX}")}
        found |= {p.parent for p in self.root.glob(f"**/*{SUFFIX}") if p.parent.name != RECORDING_DIR}
        return sorted(found)

    def runs(self) -> list[dict[str, Any]]:
        self.refresh()
        return [run.info() for run in self._runs.values()]

    def run(self, name: str) -> RunView:
        self.refresh()
        if name not in self._runs:
            raise BadQuery(f"no run named {name!r}; known runs: {sorted(self._runs)}", 404)
        return self._runs[name]


def _is_run(directory: Path) -> bool:
    return any((directory / RECORDING_DIR).glob("*" + SUFFIX)) or any(directory.glob("*" + SUFFIX))


def _decoder(run: Path, tokenizer: Path | None) -> Callable[[int], str] | None:
    """Token id -> text with the run's tokenizer, when the `tokenizers` package and a file are here."""
    candidates = [tokenizer] if tokenizer else []
    candidates += [run / "model_init", run / "sft", *sorted(run.glob("checkpoints/step_*"))]
    for directory in candidates:
        path = directory if directory.suffix == ".json" else directory / "tokenizer.json"
        if path.is_file():
            try:
                from tokenizers import Tokenizer
            except ImportError:
                return None
            loaded = Tokenizer.from_file(str(path))
            return lambda token: loaded.decode([token], skip_special_tokens=False)
    return None


# Turn fields the page lays out itself; any other (tool calls, tool messages) is shown as it is.
_SHOWN_TURN_FIELDS = frozenset(
    {
        "observation",
        "action",
        "reward",
        "info",
        "prompt_token_ids",
        "action_token_ids",
        "action_logprobs",
        "action_versions",
        "finish_reason",
        "policy_seconds",
        "env_seconds",
    }
)
_TEXT_FILTERS = ("env", "stop_reason", "source", "policy")
_FIELD = {"env": "env_id"}


def _filter(query: Mapping[str, str]) -> Callable[[dict[str, Any]], bool]:
    """A predicate from query parameters; a malformed value is a 400 naming the parameter."""
    equal: dict[str, Any] = {_FIELD.get(name, name): query[name] for name in _TEXT_FILTERS if query.get(name)}
    for name in ("step", "seed"):
        if query.get(name):
            equal[name] = _number(query, name, int)
    if query.get("success"):
        if query["success"] not in ("true", "false"):
            raise BadQuery(f"success must be true or false, got {query['success']!r}")
        equal["success"] = query["success"] == "true"
    superseded = query.get("superseded") or "false"
    if superseded not in ("true", "false", "any"):
        raise BadQuery(f"superseded must be true, false or any, got {superseded!r}")
    if superseded != "any":
        equal["superseded"] = superseded == "true"
    low = _number(query, "min_reward", float) if query.get("min_reward") else -math.inf
    high = _number(query, "max_reward", float) if query.get("max_reward") else math.inf

    def matches(summary: dict[str, Any]) -> bool:
        return low <= summary["reward"] <= high and all(summary[k] == v for k, v in equal.items())

    return matches


def _number(query: Mapping[str, str], name: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(query[name])
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise BadQuery(f"{name} must be {what}, got {query[name]!r}") from None
