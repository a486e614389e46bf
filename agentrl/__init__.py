"""agentrl: train LLM agents with reinforcement learning on multi-turn environments.

The public API lives here; submodules are the implementation.
"""

from agentrl.core import ChatMessage, Env, TextSpace
from agentrl.errors import (
    AgentRLError,
    ConfigError,
    EnvLoadError,
    InvalidArgumentError,
    PolicyError,
    RegistrationError,
    SandboxError,
    UnknownEnvError,
)
from agentrl.registry import EnvSpec, list_envs, make, register, spec
from agentrl.rollout.protocol import Policy, PolicyInput, PolicyOutput
from agentrl.tools import ToolCall, ToolError, ToolResult, ToolSpec, tool
from agentrl.trajectory import StopReason, Trajectory, TrajectoryGroup, Turn

__version__ = "0.1.0"

__all__ = [
    "AgentRLError",
    "ChatMessage",
    "ConfigError",
    "Env",
    "EnvLoadError",
    "EnvSpec",
    "InvalidArgumentError",
    "Policy",
    "PolicyError",
    "PolicyInput",
    "PolicyOutput",
    "RegistrationError",
    "SandboxError",
    "StopReason",
    "TextSpace",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Trajectory",
    "TrajectoryGroup",
    "Turn",
    "UnknownEnvError",
    "__version__",
    "list_envs",
    "make",
    "register",
    "spec",
    "tool",
]
