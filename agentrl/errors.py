"""One exception hierarchy: catch `AgentRLError` to catch everything agentrl raises on purpose."""

from __future__ import annotations


class AgentRLError(Exception):
    """Base class of every error agentrl raises deliberately."""


class RegistrationError(AgentRLError):
    """An environment id is malformed or registered twice without `override=True`."""


class UnknownEnvError(AgentRLError, KeyError):
    """`make()` was given an id that no registration or entry point provides."""

    def __init__(self, env_id: str, suggestions: list[str]) -> None:
        self.env_id = env_id
        self.suggestions = suggestions
        hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"No environment registered as {env_id!r}.{hint} (`agentrl envs list` shows all.)")

    def __str__(self) -> str:  # KeyError would otherwise wrap the message in quotes
        return str(self.args[0])


class EnvLoadError(AgentRLError):
    """An entry point or `module:Name-vN` id was found but could not be imported or built."""


class PolicyError(AgentRLError):
    """The policy (server, engine or client) could not produce an action."""


class SandboxError(AgentRLError):
    """A sandbox could not be created, used or cleaned up."""


class ConfigError(AgentRLError):
    """A configuration file or value is invalid."""


class InvalidArgumentError(AgentRLError, ValueError, TypeError):
    """An argument outside its allowed values or of the wrong kind.

    Also a `ValueError` and a `TypeError`, so code written against Python's conventions still
    catches it.
    """


class UnknownReferencePolicy(AgentRLError):
    """An env was asked for a reference policy it does not declare in `reference_policies`."""
