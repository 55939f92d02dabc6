"""The environment interface for multi-turn agent RL, and the environment registry.

An :class:`Env` is one conversation partner (a simulated user, a tool, a game). The multi-turn runner
(:class:`posttrain.rollout.multiturn.MultiTurnRunner`) creates one instance per conversation and
drives it::

    obs = env.reset(example, seed)          # the first observation (e.g. the user's opening line)
    while True:
        agent_text = <policy samples a turn given the conversation so far>
        res = env.step(agent_text)          # StepResult(observation, turn_rewards, done, session_reward)
        if res.done:
            break                           # res.session_reward is the session's (sparse) reward
        obs = res.observation               # shown to the policy before its next turn

Contract:

* ``criteria``: the names of the turn-level reward criteria, in a fixed order; every
  ``StepResult.turn_rewards`` has exactly these keys (one float per criterion).
* ``max_turns``: the turn limit. The environment itself ends the session (``done=True``) at the latest
  on turn ``max_turns``; the runner refuses an environment that does not.
* ``session_reward`` is set (a float) exactly on the step that returns ``done=True``.
* :meth:`Env.abort` gives the session reward of a conversation the runner had to cut (context length
  cap) before the environment ended it (default 0.0).
* Deterministic per seed: the same ``example``, ``seed`` and agent turns give the same observations
  and rewards.

Several agents (:class:`MultiAgentEnv`): one policy plays every seat of a session (a multi-agent
benchmark case). The runner keeps one conversation (one training row) per seat and plays the seats in
lock step: ``opening = env.reset_seats(example, seed)`` gives each seat its opening messages; each
round, every seat still acting samples a turn (all seats of all sessions in one batched generation)
and ``env.step_seats({seat: text})`` returns each seat's next observation and turn rewards, whether
that seat acts again, and, when the whole session is over, the session reward every seat's row gets.

Environments are registered by name in :data:`ENVS` as factories ``(**params) -> Env`` (a class
whose ``__init__(**params)`` fits is a factory); the runner names one in its config
(``rollout.runner.params.env`` / ``env_params``), or by import path ``package.module:Name``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from posttrain.utils.errors import InvalidTypeError, InvalidValueError
from posttrain.utils.registry import PluginError, Registry, any_callable, check_params


@dataclass(frozen=True)
class StepResult:
    """What :meth:`Env.step` returns: the next ``observation`` (text shown to the agent; ignored when
    ``done``), the turn's ``turn_rewards`` (criterion name -> float), ``done`` and, when done, the
    ``session_reward``; ``info`` is free-form (logged in transcripts)."""

    observation: str
    turn_rewards: dict[str, float]
    done: bool
    session_reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """A multi-turn environment (see the module docstring for the contract)."""

    criteria: tuple[str, ...] = ()
    max_turns: int = 1

    @abstractmethod
    def reset(self, example: Any, seed: int) -> str:
        """Start a session for ``example`` (a task example); return the first observation."""

    @abstractmethod
    def step(self, agent_text: str) -> StepResult:
        """Consume the agent's turn; return the next observation, the turn rewards and whether the
        session is over (with its session reward)."""

    def abort(self) -> float:
        """Session reward of a conversation cut before ``done`` (e.g. by the context cap)."""
        return 0.0

    def summary(self) -> dict[str, Any]:
        """Per-session facts for evaluation metrics and transcripts (e.g. ``converted``)."""
        return {}


@dataclass(frozen=True)
class SeatsResult:
    """What :meth:`MultiAgentEnv.step_seats` returns for one round: ``seats`` maps every seat that
    acted to its :class:`StepResult` (its next observation and turn rewards; ``done``: this seat acts
    no more, its ``session_reward`` left None); ``done`` / ``session_reward``: the whole session is
    over, with the reward every seat's row gets."""

    seats: dict[int, StepResult]
    done: bool = False
    session_reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


class MultiAgentEnv(Env):
    """A session with several seats, all played by the policy (module docstring). ``max_turns`` is the
    round limit: the session ends (``SeatsResult.done``) at the latest in that round. ``metrics()``
    gives per-session numbers (a benchmark's own scores) that the runner averages over sessions."""

    @abstractmethod
    def reset_seats(self, example: Any, seed: int) -> list[list[dict[str, Any]]]:
        """Start a session; per seat, its opening chat messages (a system message and/or user
        messages, ending with a user message)."""

    @abstractmethod
    def step_seats(self, texts: Mapping[int, str]) -> SeatsResult:
        """One round: ``texts`` maps each seat that acts to the turn it sampled."""

    def metrics(self) -> dict[str, float]:
        """Per-session numbers (e.g. success, messages per agent), averaged per session by the runner."""
        return {}

    def reset(self, example: Any, seed: int) -> str:
        raise InvalidTypeError(f"environment {type(self).__name__} has several seats: use reset_seats")

    def step(self, agent_text: str) -> StepResult:
        raise InvalidTypeError(f"environment {type(self).__name__} has several seats: use step_seats")


def _check_turn_rewards(env: Env, rewards: Mapping[str, Any], where: str) -> None:
    """Exactly the environment's criteria, each a finite number; errors start with ``where``."""
    if set(rewards) != set(env.criteria):
        raise InvalidValueError(
            f"{where}: turn_rewards has keys {sorted(rewards)}, expected exactly its criteria {list(env.criteria)}"
        )
    for k, v in rewards.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise InvalidValueError(f"{where}: turn_rewards[{k!r}] = {v!r} is not a finite number")


def check_seats(env: MultiAgentEnv, res: Any, texts: Mapping[int, str], turn: int) -> SeatsResult:
    """Validate one ``env.step_seats`` result (every acting seat answered, criteria, session reward,
    round limit); raise naming the environment and round."""
    name = type(env).__name__
    if not isinstance(res, SeatsResult):
        raise InvalidTypeError(
            f"environment {name}: step_seats() must return a SeatsResult, got {type(res).__name__}"
        )
    if set(res.seats) != set(texts):
        raise InvalidValueError(
            f"environment {name}, round {turn}: step_seats() answered seats {sorted(res.seats)}, "
            f"expected exactly the seats that acted {sorted(texts)}"
        )
    for seat, r in res.seats.items():
        if not isinstance(r, StepResult):
            raise InvalidTypeError(f"environment {name}, round {turn}, seat {seat}: not a StepResult")
        _check_turn_rewards(env, r.turn_rewards, f"environment {name}, round {turn}, seat {seat}")
    if res.done:
        if res.session_reward is None or not math.isfinite(float(res.session_reward)):
            raise InvalidValueError(
                f"environment {name}, round {turn}: done=True needs a finite session_reward, got "
                f"{res.session_reward!r}"
            )
    elif turn >= env.max_turns:
        raise InvalidValueError(
            f"environment {name}: round {turn} reached max_turns={env.max_turns} but step_seats() did "
            "not return done=True; an environment must end its sessions within its round limit"
        )
    return res


def check_step(env: Env, res: Any, turn: int) -> StepResult:
    """Validate one ``env.step`` result against the contract; raise naming the environment and turn."""
    name = type(env).__name__
    if not isinstance(res, StepResult):
        raise InvalidTypeError(
            f"environment {name}: step() must return a StepResult, got {type(res).__name__}"
        )
    _check_turn_rewards(env, res.turn_rewards, f"environment {name}, turn {turn}")
    if res.done:
        if res.session_reward is None or not math.isfinite(float(res.session_reward)):
            raise InvalidValueError(
                f"environment {name}, turn {turn}: done=True needs a finite session_reward, got "
                f"{res.session_reward!r}"
            )
    elif turn >= env.max_turns:
        raise InvalidValueError(
            f"environment {name}: turn {turn} reached max_turns={env.max_turns} but step() did not "
            "return done=True; an environment must end its sessions within its turn limit"
        )
    return res


EnvFactory = Callable[..., Env]
ENVS: Registry[EnvFactory] = Registry("environment", group="posttrain.envs")
ENVS.accept(any_callable, "a factory (**params) -> Env (a function or an Env class)")


def register_env(name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[EnvFactory], EnvFactory]:
    """Decorator: ``@register_env("sales")`` on an :class:`Env` subclass or a factory function."""
    return ENVS.register(name, aliases=aliases)


def list_envs() -> list[str]:
    return ENVS.names()


def env_factory(name: str, params: Mapping[str, Any] | None = None) -> Callable[[], Env]:
    """A zero-argument callable making fresh environments ``name(**params)``; ``params`` are checked
    against the factory's signature now, and the first instance is built to check its type."""
    params = dict(params or {})
    factory = ENVS.get(name)
    check_params(ENVS.kind, name, factory, params)

    def make() -> Env:
        env = factory(**params)
        if not isinstance(env, Env):
            raise PluginError(f"environment {name!r} returned a {type(env).__name__}, not an Env")
        if not env.criteria:
            raise PluginError(f"environment {name!r} declares no turn-reward criteria (Env.criteria)")
        if isinstance(env.max_turns, bool) or not isinstance(env.max_turns, int) or env.max_turns < 1:
            raise PluginError(f"environment {name!r}: max_turns must be an int >= 1, got {env.max_turns!r}")
        return env

    make()
    return make
