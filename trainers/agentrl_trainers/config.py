"""The training configuration: one YAML file, validated by pydantic, with defaults for everything.

A config file only names what differs from the embedded defaults, so the smallest useful file is

    env: {id: games/GuessNumber-v0}

Every section forbids unknown fields: a typo is an error that names the field, the allowed
fields or values, and the closest match, instead of a setting that silently does nothing.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


LossName = Literal["ppo_clip", "tis", "decoupled_ppo", "cispo", "topr", "gspo"]
AdvantageEstimator = Literal["grpo", "lite_ppo"]
Aggregation = Literal["token", "sequence"]
CreditAssignment = Literal["episode", "turn_return", "turn_group"]
TurnStateKey = Literal["history", "observation"]


class LearnerConfig(_Section):
    """The loss, the advantage estimator and the optimizer, with the usual defaults of each paper."""

    loss: LossName = "decoupled_ppo"
    advantage: AdvantageEstimator = "grpo"
    # How the advantage reaches the turns of a multi-turn episode (docs/algorithms.md):
    # episode = one group-relative advantage for every turn; turn_return = reward-to-go over turns
    # minus the group's mean at that turn index; turn_group = GiGPO-style, the episode advantage
    # plus a group-relative one among the turns that acted from the same state
    credit: CreditAssignment = "episode"
    gamma: float = Field(default=1.0, gt=0, le=1)  # discount over turns of the reward-to-go (turn_*)
    turn_group_weight: float = Field(default=1.0, ge=0)  # weight of the turn-level term (turn_group)
    # What makes two turns of a group "the same state" for turn_group: history = the whole
    # conversation up to the turn (always right, often unique); observation = the turn's last
    # observation alone (GiGPO's anchor states; right only when the env's observations are its
    # state, e.g. games/GuessNumberInterval-v0, and then far more turns find a partner)
    turn_state: TurnStateKey = "history"
    aggregation: Aggregation = "token"  # token: sum / loss tokens in the batch; sequence: mean of means
    clip_eps: float = Field(default=0.2, ge=0, lt=1)  # PPO lower clip (1 - eps)
    clip_eps_hi: float = Field(default=0.28, ge=0)  # PPO upper clip (1 + eps_hi); also CISPO's weight cap
    dual_clip_c: float | None = Field(default=None, gt=1)  # dual-clip bound for A < 0 (ppo_clip); None = off
    tis_cap: float = Field(default=2.0, gt=0)  # TIS: cap C on exp(logp_old - logp_behav)
    # decoupled PPO: cap on the behaviour weight exp(logp_old - logp_behav); None = uncapped
    behav_cap: float | None = Field(default=5.0, gt=0)
    behav_reject: bool = False  # decoupled PPO: drop tokens over behav_cap instead of clamping their weight
    gspo_eps: float = Field(default=3e-4, ge=0)
    gspo_eps_hi: float = Field(default=4e-4, ge=0)
    # beta of the k3 KL to the initial weights; 0 keeps no reference model (saves memory and a forward)
    kl_coef: float = Field(default=0.0, ge=0)
    entropy_coef: float = Field(default=0.0, ge=0)
    lr: float = Field(default=3e-4, gt=0)
    # Linear lr warmup over the first N train steps. Adam's first updates move every weight by about
    # `lr` whatever the gradient's size, so a fresh optimizer on noisy RL gradients can wreck a
    # warm-started policy in a few steps; ramping the lr lets the moment estimates settle first.
    warmup_steps: int = Field(default=0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)  # None = no clipping
    micro_batch_tokens: int = Field(default=4096, ge=1)  # padded tokens (rows * longest row) per forward pass
    grad_accumulation: int = Field(default=1, ge=1)  # at least this many micro-batches per optimizer step
    # optimizer steps per train_step, each on a slice of the batch (PPO-style); the version bumps once
    minibatches: int = Field(default=1, ge=1)
    # torch CPU threads of the trainer (and the warm start); None = every core. On a loaded machine
    # 1 is far faster for small models: torch's threads spin-wait for each other at every op, and
    # a descheduled one stalls the rest (measured under load 17 on 2 cores, tiny model: 14.6 s per
    # SFT step with 2 threads, 1.3-2.1 s with 1)
    threads: int | None = Field(default=None, ge=1)


class ModelSourceConfig(_Section):
    """Which model to train: an existing HF-format directory, or one agentrl builds from a size."""

    path: str | None = None  # an existing checkpoint directory; None = build `init` under the run dir
    init: str = "tiny"  # size preset used when `path` is None (`agentrl model init --help` lists them)
    seed: int = 0  # seed of the initial weights


class EnvConfig(_Section):
    """The environment and how the manager runs it."""

    id: str = "games/GuessNumber-v0"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    group_size: int = Field(8, ge=1)  # episodes per task (seed), compared by group-relative advantages
    redundancy: int = Field(0, ge=0)  # extra episodes launched per group; the slowest are dropped
    max_turns: int = Field(8, ge=1)
    concurrency: int = Field(32, ge=1)  # episodes in flight at once
    # "async": env-level asynchronous rollout; "batch": the synchronous batch-level baseline (each
    # step's groups are played in lockstep turns, the next batch starts when the whole one ended);
    # "rounds": the same batches without the lockstep (each episode on its own clock within them)
    rollout: Literal["async", "batch", "rounds"] = "async"
    # rollout-side tail batching (RollPacker), with rollout "batch" or "rounds" and sync training:
    # each step's batch launches this many extra groups (and `redundancy` extra episodes per group),
    # stops once groups_per_step are done, and re-rolls the cut-off ones together in a dedicated
    # long round without extras (docs/performance.md)
    speculative_groups: int = Field(0, ge=0)
    step_timeout: float | None = Field(60.0, gt=0)
    episode_timeout: float | None = Field(600.0, gt=0)


class SamplingConfig(_Section):
    """How the policy samples during training (evaluation is greedy unless `eval_temperature` > 0)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(24, ge=1)  # per action
    eval_temperature: float = Field(0.0, ge=0)


class BufferConfig(_Section):
    """The staleness-aware buffer between rollout and training."""

    max_staleness: int = Field(1, ge=0)  # in policy versions; 0 = synchronous on-policy
    dynamic_filter: bool = True  # drop groups whose rewards are all equal (zero advantage)
    tail_batching: bool = False  # defer long-tail groups into dedicated rounds
    # Stop the run (with a message saying why) once dynamic_filter has dropped this many batches'
    # worth of groups in a row: the policy gets the same reward on every episode, so no batch can
    # ever form. 0 = wait forever.
    max_filtered_batches: int = Field(8, ge=0)


class ScheduleConfig(_Section):
    """How long to train and when to checkpoint and evaluate."""

    steps: int = Field(20, ge=1)  # optimizer steps
    groups_per_step: int = Field(4, ge=1)
    checkpoint_every: int = Field(10, ge=1)
    eval_every: int = Field(0, ge=0)  # 0 = only at the end
    eval_episodes: int = Field(64, ge=0)
    train_seed_start: int = Field(0, ge=0)
    eval_seed_offset: int = Field(1_000_000, ge=1)  # held-out seeds start here; training seeds stay below


class SFTConfig(_Section):
    """Warm start: supervised training on a scripted player of the env before RL."""

    episodes: int = Field(0, ge=0)  # 0 = no warm start
    # "expert" (env.expert_action) or one of the env's reference policies, e.g. "random": a warm
    # start that learns the format from it but no strategy
    policy: str = "expert"
    successful_only: bool = True  # train only on episodes that solved the task
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1)
    lr: float = Field(1e-3, gt=0)
    seed_start: int = Field(2_000_000, ge=0)  # expert episodes use their own seeds, disjoint from RL and eval


class ServerConfig(_Section):
    """The local policy server the rollouts talk to over HTTP."""

    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)  # 0 = pick a free port
    startup_timeout: float = Field(180.0, gt=0)
    # CPU threads of the server's torch; None = half the cores (see TrainConfig.cpu_threads)
    threads: int | None = Field(None, ge=1)
    # A server that dies mid-run is restarted from the learner's weights this many times at most.
    max_restarts: int = Field(3, ge=0)


class RecordConfig(_Section):
    """What the run writes to its trajectory store (OUT/recording/, read by `agentrl view`)."""

    enabled: bool = True
    # Episodes recorded per step; None = every trajectory of the batch plus the batch record that
    # `agentrl replay` rebuilds the step from. A number records only that many, and no replay.
    sample: int | None = Field(None, ge=1)
    evaluations: bool = True  # held-out episodes too: the same seeds at every evaluation, to compare


class RayConfig(_Section):
    """Run rollouts and the policy on a Ray cluster (docs/ray.md); `address: null` = in process."""

    # "local" (a private cluster started here), "auto" (the one `ray start` runs on this machine),
    # or HOST:PORT. `agentrl train --ray ...` overrides it.
    address: str | None = None
    env_workers: int = Field(2, ge=1)  # env-worker actors; env.concurrency is split between them
    replicas: int = Field(1, ge=1)  # policy replica actors behind the router
    cpus_per_env_worker: float = Field(1.0, ge=0)
    cpus_per_replica: float = Field(1.0, gt=0)
    gpus_per_replica: float = Field(0.0, ge=0)
    engine: Literal["torch", "vllm"] = "torch"
    turn_timeout: float = Field(600.0, gt=0)  # seconds one policy turn may take (else: TIMEOUT)


class TrainConfig(_Section):
    """The whole run."""

    out: str = "runs/agentrl"
    mode: Literal["sync", "async"] = "async"
    seed: int = 0
    model: ModelSourceConfig = Field(default_factory=ModelSourceConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    record: RecordConfig = Field(default_factory=RecordConfig)

    @model_validator(mode="after")
    def _seeds_disjoint(self) -> TrainConfig:
        s = self.schedule
        # Redundant episodes and dropped groups consume seeds too; bound generously.
        budget = 4 * s.steps * s.groups_per_step * (self.buffer.max_staleness + 2)
        last_train_seed = s.train_seed_start + budget
        if last_train_seed >= s.eval_seed_offset:
            raise ValueError(
                f"schedule.eval_seed_offset ({s.eval_seed_offset}) must exceed the training seeds "
                f"(up to about {last_train_seed}) so evaluation uses held-out seeds"
            )
        if self.env.speculative_groups and (
            self.env.rollout == "async" or self.effective_max_staleness or self.buffer.tail_batching
        ):
            raise ValueError(
                "env.speculative_groups (rollout-side tail batching) schedules synchronous rounds: it "
                "needs env.rollout: batch or rounds, mode: sync (or buffer.max_staleness: 0) and "
                "buffer.tail_batching: false"
            )
        if self.env.rollout != "async" and self.ray.address is not None:
            raise ValueError(
                f"env.rollout: {self.env.rollout} runs in the local EnvManager only; it is not "
                "available with ray"
            )
        return self

    @property
    def effective_max_staleness(self) -> int:
        """Sync mode is the async loop with no overlap allowed."""
        return 0 if self.mode == "sync" else self.buffer.max_staleness

    def cpu_threads(self, cores: int) -> tuple[int, int]:
        """(server, trainer) torch CPU threads on a machine with `cores` usable cores, either mode.

        The server gets half the cores: even in sync mode its decode runs beside the rollout
        client's event loop (in the trainer process), and the two fighting over every core made
        rollout slower, not faster. The trainer keeps every core: in async mode it is the
        bottleneck and takes the cycles the server leaves idle. Measured on 2 cores, 8 steps of
        examples/guess_number.yaml: sync 45.7 s with a 2-thread server vs 38.3 s with 1; async
        43.3 s with a 1/1 split vs 33.3 s with server 1, trainer 2.
        """
        return self.server.threads or max(1, cores // 2), self.learner.threads or cores


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a YAML config (or only the defaults), apply dotted `overrides`, and validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"Config file not found: {path}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            kind = type(loaded).__name__
            raise ConfigError(f"{path}: the top level must be a mapping of sections, got {kind}")
        data = loaded or {}
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_config(data, source=str(path) if path else "config")


def parse_config(data: dict[str, Any], source: str = "config") -> TrainConfig:
    """Validate a config mapping, turning pydantic's errors into one readable `ConfigError`."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_explain(error) for error in exc.errors()]
        raise ConfigError(f"Invalid {source}:\n  " + "\n  ".join(lines)) from exc


def _explain(error: Any) -> str:
    """One line per problem: the dotted field, what is wrong, and what is allowed."""
    loc = [str(part) for part in error["loc"]]
    field = ".".join(loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        allowed = sorted(_fields_at(loc[:-1]))
        close = difflib.get_close_matches(loc[-1], allowed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"{field}: unknown field.{hint} Allowed fields: {', '.join(allowed)}"
    message = error["msg"]
    allowed_values = _literal_values_at(loc)
    if allowed_values and "Input should be" not in message:
        message += f" (allowed: {', '.join(map(repr, allowed_values))})"
    return f"{field}: {message} (got {error.get('input')!r})"


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = TrainConfig
    for part in loc:
        info = model.model_fields.get(part)
        if info is None or not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)):
            return None
        model = info.annotation
    return model


def _fields_at(loc: list[str]) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model else []


def _literal_values_at(loc: list[str]) -> tuple[Any, ...]:
    model = _model_at(loc[:-1]) if loc else None
    info = model.model_fields.get(loc[-1]) if model else None
    if info is None or typing.get_origin(info.annotation) is not Literal:
        return ()
    return typing.get_args(info.annotation)
