r"""Hook interfaces of the RL loop, with trivial default implementations.

The loop in ``posttrain.train.rl`` calls only these interfaces. Methods plug in by subclassing and
registering under a name, then selecting it in the config (``hooks.sampler.name`` etc.):

==================  ======================================  ==============================================
interface           called                                  methods it is for (paper)
==================  ======================================  ==============================================
PromptSampler       before rollout: which prompts, how      E3 per-prompt budgets (arXiv:2505.18573,
                    many completions each; observe each     Alg. 1), APARL curriculum (arXiv:2507.01327)
                    filtered round and the step's outcomes
Controller          before each step (set knobs) and        E3 entropy-targeting temperature (arXiv:
                    after it (update from metrics)          2505.18573, Eq. 4): the knob is used for
                                                            rollout AND training logits
ReplayBuffer        before rollout: trajectories to put     failure / experience replay (NexGRPO, ACL 2026
                    into groups; after rewards: observe;    2026.acl-long.1682; ExGRPO, arXiv:2510.02245):
                    importance weights for replayed tokens  replayed tokens get per-token ``is_weights``
GroupFilter         after rewards: keep or drop each group  DAPO dynamic sampling (arXiv:2503.14476 §3.3),
                    (with a reason); the loop samples more  also APARL's inner loop (arXiv:2507.01327)
                    rounds until enough groups are kept,
                    at most ``max_rounds``
GroupRewardShaper   after rewards, before the advantage,    ASRR accuracy-gated length penalty (arXiv:
                    seeing whole groups; ``hooks.shapers``  2505.15400, Eqs. 5-7), DAPO overlong shaping
                    is a list applied in order
==================  ======================================  ==============================================

How the slots compose in one step (the contract the trainer keeps, tested in ``tests/hooks`` and
``tests/train``):

1. controllers ``apply`` the knobs (temperature);
2. the sampler ``plan``\s round 1; the replay buffer ``mix``\es and ``draw``\s **exactly once per
   step, on round 1's plan, before any sampling round** (later rounds of a filtering step are fresh
   samples only, so a buffer never sees the same step twice);
3. each round is rolled out; with a group filter the loop waits for rewards, the sampler's
   ``observe_round`` sees the round's groups (also those about to be dropped), the filter decides per
   group (keep / drop + reason) and, while fewer than ``rollout.prompts_per_step`` groups are kept and
   fewer than ``max_rounds`` rounds were drawn, the sampler plans another round;
4. the shapers map raw rewards to the rewards the advantage sees, in list order;
5. after the update, every hook that defines ``observe`` sees the step; every hook that defines
   ``observe_eval(result, step)`` sees each held-out evaluation (curricula); controllers ``update``.

Under asynchronous rollout (``rollout.max_staleness`` = η > 0, :mod:`posttrain.train.async_rollout`,
docs/async.md) the same slots act at these moments: the sampler ``plan``\s when groups are dispatched
to the generation workers (so prompts are chosen with the policy and step of that moment; a step
trains on groups planned up to η steps earlier); controllers' knobs (temperature) apply to the groups
dispatched in their step; the group filter decides on each batch of consumed groups; ``observe``
sees the consumed groups. A replay buffer is refused (config error) until it can mix stored
trajectories into groups generated ahead.

Every interface is a :class:`Hook`, which gives three optional methods:

* ``step_metrics(episodes)``: numbers the hook measures on the step's episodes (texts, batch), merged
  into the step's metrics under the hook's own keys (ASRR's ``continue_thinking_frac``), so the loop
  computes no method's metric itself; ``eval_metrics(episodes)`` does the same for the greedy
  completions of each held-out evaluation. A key the loop logs itself is refused.
* ``validate_config(params, config)``: checks the hook's params against the whole run config when it
  loads (DAPO's overlong penalty needs ``max_length == rollout.max_new_tokens``), for every configured
  hook; it raises ``ValueError`` (an :class:`~posttrain.utils.errors.InvalidValueError`) whose message
  starts with the param's name.

A hook class may also define ``validate_params(params)`` (raise ``InvalidValueError`` naming the key):
the config calls it when it is loaded, before the params are matched with the constructor, so bad
values are config errors. State for checkpoints: ``state_dict()`` returns JSON-serialisable data (no
pickle anywhere). Samplers may report numbers about their latest plan via ``metrics()`` (logged as
``sampler/<key>``); controllers get the vocabulary size and configured steps once via
``bind(RunInfo)`` and read the step's metrics (``entropy_pre_update``: no-grad entropy of the sampling
policy at τ) in ``update``. Implementations of the methods above live in packages that declare them
as entry points of these registries' groups (``docs/sampling-methods.md``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from posttrain.utils.data import EpochShuffler
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError
from posttrain.utils.registry import Registry

SAMPLERS: Registry[type[PromptSampler]] = Registry("prompt sampler", group="posttrain.samplers")
CONTROLLERS: Registry[type[Controller]] = Registry("controller", group="posttrain.controllers")
REPLAY_BUFFERS: Registry[type[ReplayBuffer]] = Registry("replay buffer", group="posttrain.replay_buffers")
GROUP_SHAPERS: Registry[type[GroupRewardShaper]] = Registry("group reward shaper", group="posttrain.shapers")
GROUP_FILTERS: Registry[type[GroupFilter]] = Registry("group filter", group="posttrain.group_filters")


# --------------------------------------------------------------------------------------------- data
@dataclass
class PromptPlan:
    """The prompts of one rollout round and how many completions each gets (variable group sizes)."""

    examples: list[Any]
    n_per_prompt: list[int]

    def __post_init__(self) -> None:
        if len(self.examples) != len(self.n_per_prompt):
            raise InvalidValueError(
                f"PromptPlan: {len(self.examples)} examples but {len(self.n_per_prompt)} group sizes"
            )
        if any(n < 0 for n in self.n_per_prompt):
            raise InvalidValueError(f"PromptPlan: negative group size in {self.n_per_prompt}")


@dataclass
class GroupOutcome:
    """What happened to one prompt's group: raw rewards, correctness, completion lengths (tokens)."""

    example: Any
    rewards: list[float]
    correct: list[bool]
    lengths: list[int]

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / len(self.correct) if self.correct else 0.0

    @property
    def zero_variance(self) -> bool:
        return len(self.rewards) < 2 or max(self.rewards) - min(self.rewards) < 1e-12


@dataclass
class Knobs:
    """Per-step settings that controllers may change. ``temperature`` is used both for sampling and for
    the training log-probs (logits / T), which keeps old_logp, logp and the ratios consistent (E3)."""

    temperature: float


@dataclass(frozen=True)
class RunInfo:
    """What a hook may need to know about the run (given once via ``bind``): the policy's vocabulary
    size and the number of steps the run is configured for; for samplers and replay buffers that score
    text with the policy (APARL perplexities, NexGRPO embeddings) also the policy's
    :class:`~posttrain.models.ModelAdapter` (``policy``, None outside the trainer), the prompt encoder
    (``encode_prompt``: prompt text -> ids, with the run's template), ``chunk_size`` for log-probs and
    the run's ``task`` (e.g. its ``reference_completion``; None outside the trainer)."""

    vocab_size: int
    total_steps: int
    policy: Any = None
    encode_prompt: Any = None
    chunk_size: int = 1024
    task: Any = None


@dataclass
class Trajectory:
    """A stored completion: token ids, per-token log-probs under the policy that produced it.

    ``action_mask`` (same length; None = all 1) marks the policy's tokens of a multi-turn episode
    (environment tokens 0); ``advantage_inputs`` holds the episode's row of each advantage input the
    runner produced (a number, or a list with one entry per completion token for per-token inputs),
    so a replayed trajectory can join fresh episodes that carry them. Plain JSON data, so buffers can
    checkpoint it.
    """

    completion_ids: list[int]
    logp_past: list[float]
    finish_reason: str = "stop"
    action_mask: list[int] | None = None
    advantage_inputs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logp_past):
            raise InvalidValueError("Trajectory: completion_ids and logp_past must have the same length")
        if self.action_mask is not None and len(self.action_mask) != len(self.completion_ids):
            raise InvalidValueError("Trajectory: action_mask must have one entry per completion token")


# ---------------------------------------------------------------------------------------- interfaces
class Hook:
    """What every hook slot shares: optional metrics of its own and a config-time check.

    The loop merges each hook's :meth:`step_metrics` into the step's metrics and its
    :meth:`eval_metrics` into each held-out evaluation (:func:`hook_metrics`), so a method's numbers
    come from the method's hook and the loop names no method."""

    def step_metrics(self, episodes: Any) -> dict[str, float]:
        """Numbers about the step's episodes (``posttrain.rollout.Episodes``: texts, batch, examples)
        this hook reports, logged under these keys; default none."""
        return {}

    def eval_metrics(self, episodes: Any) -> dict[str, float]:
        """Numbers about the greedy completions of a held-out evaluation (``Episodes``), added to the
        evaluation's result under these keys; default none."""
        return {}

    @classmethod
    def validate_config(cls, params: dict[str, Any], config: Any) -> None:
        """Check ``params`` against the run's whole config (``RLConfig``) when it loads; raise an
        :class:`~posttrain.utils.errors.InvalidValueError` whose message starts with the param's name
        (the config puts the hook's key in front). Default: nothing to check."""


def hook_metrics(
    hooks: Iterable[Hook | None],
    episodes: Any,
    *,
    kind: Literal["step", "eval"],
    reserved: Collection[str] = (),
) -> dict[str, float]:
    """Every hook's :meth:`Hook.step_metrics` (``kind="step"``) or :meth:`Hook.eval_metrics`
    (``"eval"``) on ``episodes``, merged in hook order (None entries skipped). A key in ``reserved``
    (one the loop logs itself) or reported by two hooks is a :class:`PosttrainRuntimeError`: neither
    may silently overwrite the other."""
    out: dict[str, float] = {}
    for hook in hooks:
        if hook is None:
            continue
        got = hook.step_metrics(episodes) if kind == "step" else hook.eval_metrics(episodes)
        for key, value in got.items():
            if key in reserved or key in out:
                who = "the loop" if key in reserved else "another hook"
                raise PosttrainRuntimeError(
                    f"{type(hook).__name__}.{kind}_metrics: key {key!r} is already logged by {who}; "
                    "give the hook's metric its own name"
                )
            out[key] = value
    return out


class PromptSampler(Hook, ABC):
    """Chooses prompts and per-prompt completion budgets. Keeping or dropping groups is the group
    filter's job (``hooks.filter``); a sampler that needs to see every round's groups, also those the
    filter drops, defines :meth:`observe_round`."""

    @abstractmethod
    def plan(self, step: int, num_prompts: int, group_size: int) -> PromptPlan: ...

    def bind(self, run: RunInfo) -> None:
        """Called once by the trainer before the first step (policy, prompt encoder, configured steps)."""

    def observe_round(self, outcomes: list[GroupOutcome], step: int) -> None:
        """With an active group filter: the groups of each sampling round of ``step``, before the filter
        decides (so also the groups it drops). Without one nothing calls it (one round, seen by
        :meth:`observe`)."""

    def observe_eval(self, result: dict[str, Any], step: int) -> None:
        """The trainer's held-out evaluation (``accuracy`` ...) after ``step`` steps (curricula)."""

    def observe(self, outcomes: list[GroupOutcome], step: int) -> None:
        """Statistics after each step (difficulty ranks, curriculum): the groups the step trained on."""

    def metrics(self) -> dict[str, float]:
        """Numbers about the latest step's plan, logged as ``sampler/<key>`` (e.g. budgets, rounds)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Controller(Hook, ABC):
    """Updates a knob from the metrics of the finished step; applies it before the next one."""

    def bind(self, run: RunInfo) -> None:
        """Called once by the trainer before the first step (vocabulary size, configured steps)."""

    @abstractmethod
    def apply(self, knobs: Knobs, step: int) -> None: ...

    @abstractmethod
    def update(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        """Returns metrics to log (e.g. the new temperature)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class ReplayBuffer(Hook, ABC):
    """Offers stored trajectories to put into groups next to fresh samples (off-policy)."""

    #: True when the buffer needs the per-token sampling log-probs of fresh rollouts in :meth:`observe`
    #: (to store them as ``Trajectory.logp_past``). The trainer then refuses an engine whose batches
    #: come without log-probs, instead of failing inside the buffer.
    needs_logprobs: bool = False

    def bind(self, run: RunInfo) -> None:
        """Called once by the trainer before the first step (e.g. the policy, for embeddings)."""

    def mix(self, plan: PromptPlan, step: int) -> PromptPlan:
        """The plan to roll out: by default the sampler's; a buffer may swap some prompts for stored
        questions (the ExGRPO batch mix, arXiv:2510.02245 §3). Called before :meth:`draw`."""
        return plan

    def metrics(self) -> dict[str, float]:
        """Numbers about the buffer (size, replayed, gated), logged as ``replay/<key>``."""
        return {}

    @abstractmethod
    def draw(self, plan: PromptPlan, step: int) -> list[list[Trajectory]]:
        """For each prompt of the plan, the trajectories to include in its group (at most its size;
        the loop samples the rest fresh)."""

    def observe(self, episodes: Any, rewards: torch.Tensor, correct: torch.Tensor, step: int) -> None:
        """See the scored episodes of a step (store failures, update statistics)."""

    def is_weights(self, logp: torch.Tensor, logp_past: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-token importance weights of replayed tokens, default ``min(exp(logp − logp_past), 10)``
        with ``logp`` detached (π_θ / π_past, the off-policy correction of experience replay as in
        ExGRPO, arXiv:2510.02245)."""
        w = torch.exp((logp.detach() - logp_past).clamp(-20, 20)).clamp(max=10.0)
        return torch.where(mask.bool(), w, torch.ones_like(w))

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass(frozen=True)
class GroupDecision:
    """A group filter's verdict on one group: ``keep`` it or not, and why (logged as
    ``filter/dropped_<reason>`` counts)."""

    keep: bool
    reason: str = "kept"


class GroupFilter(Hook, ABC):
    """Keeps or drops whole groups once their rewards are known (DAPO-style dynamic sampling).

    ``max_rounds``: at most this many sampling rounds per step; ``oversample``: a round asks the
    sampler for ``ceil(missing_groups · oversample)`` prompts. The trainer calls :meth:`start_step`,
    then per round :meth:`start_round` (the round's plan) and :meth:`decide` (outcomes of the round's
    groups, ``need`` = groups still wanted), which returns one :class:`GroupDecision` per outcome.
    """

    max_rounds: int = 1
    oversample: float = 1.0
    #: False for the no-op filter: the loop then does one round and does not wait for rewards
    active: bool = True

    def bind(self, run: RunInfo) -> None:
        """Called once by the trainer before the first step."""

    def start_step(self, step: int, requested: int) -> None:
        """A new step that wants ``requested`` groups."""

    def start_round(self, plan: PromptPlan) -> None:
        """The plan of the round about to be rolled out."""

    @abstractmethod
    def decide(self, outcomes: list[GroupOutcome], need: int) -> list[GroupDecision]: ...

    def metrics(self) -> dict[str, float]:
        """Numbers about the latest step (rounds, groups kept, drops by reason), logged as
        ``filter/<key>``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class GroupRewardShaper(Hook, ABC):
    """Maps raw rewards to shaped rewards with whole-group statistics visible."""

    @abstractmethod
    def shape(
        self,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        *,
        correct: torch.Tensor,
        lengths: torch.Tensor,
        truncated: torch.Tensor,
    ) -> torch.Tensor: ...


# ----------------------------------------------------------------------------------------- defaults
@SAMPLERS.register("uniform")
class UniformSampler(PromptSampler):
    """Epoch-wise shuffled pass over the training examples, ``group_size`` completions per prompt.

    Order for epoch e is a permutation drawn from ``random.Random(seed + e)`` (the ``"seeded"`` order
    of :class:`posttrain.utils.data.EpochShuffler`, shared with SFT), so the state is just
    (epoch, position) and resumes exactly."""

    def __init__(self, examples: list[Any], *, seed: int = 0) -> None:
        if not examples:
            raise InvalidValueError("UniformSampler: the training split is empty")
        self.examples = examples
        self.seed = seed
        self._shuffler = EpochShuffler(len(examples), seed=seed, order="seeded")

    @property
    def epoch(self) -> int:
        return self._shuffler.epoch

    @property
    def pos(self) -> int:
        return self._shuffler.pos

    def plan(self, step: int, num_prompts: int, group_size: int) -> PromptPlan:
        picked = [self.examples[i] for i in self._shuffler.take(num_prompts)]
        return PromptPlan(picked, [group_size] * num_prompts)

    def state_dict(self) -> dict[str, Any]:
        return self._shuffler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._shuffler.load_state_dict(state)


@CONTROLLERS.register("constant-temperature")
class ConstantTemperature(Controller):
    """Keeps the temperature at ``value`` (the trivial controller; E3's entropy-targeting controller
    implements the same interface)."""

    def __init__(self, *, value: float = 1.0) -> None:
        if not (value > 0 and math.isfinite(value)):
            raise InvalidValueError(f"constant-temperature: value must be > 0, got {value}")
        self.value = value

    def apply(self, knobs: Knobs, step: int) -> None:
        knobs.temperature = self.value

    def update(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        return {"temperature": self.value}


@REPLAY_BUFFERS.register("none")
class NoReplay(ReplayBuffer):
    """Replays nothing: every group is fresh and on-policy."""

    def draw(self, plan: PromptPlan, step: int) -> list[list[Trajectory]]:
        return [[] for _ in plan.examples]


@GROUP_FILTERS.register("none")
class KeepAll(GroupFilter):
    """Keeps every group: one sampling round, rewards scored while the forwards run."""

    active = False

    def decide(self, outcomes: list[GroupOutcome], need: int) -> list[GroupDecision]:
        return [GroupDecision(True) for _ in outcomes]


@GROUP_SHAPERS.register("none")
class IdentityShaper(GroupRewardShaper):
    """Leaves rewards unchanged."""

    def shape(self, rewards, group_ids, *, correct, lengths, truncated):
        return rewards
