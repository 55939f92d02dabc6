"""E3: per-prompt rollout budgets from difficulty ranks, and an entropy-targeting temperature.

Source: "E3" (Liao et al.), arXiv:2505.18573 (Alg. 1, Eq. 4), and the authors' code
``LiaoMengqi/E3-RL4LLMs``: ``e3/data/rl_dataset.py::update_prompt_stats / update_rank``,
``e3/trainer/ray_trainer.py::get_rollout_n_per_prompt`` and ``fit()`` (budget schedule),
``e3/worker/temperature_scheduler.py::TemperatureScheduler``. Formulas: ``docs/sampling-methods.md``.

Differences from the authors' code, on purpose:

* :func:`allocate_rollouts` follows the authors' ``get_rollout_n_per_prompt`` by default
  (``leftover="hardest-first"``): the proportional step is not capped, and the rounding leftover goes
  to the hardest prompt first, up to ``G_max``, then the next. So one very hard prompt can exceed
  ``G_max``: ranks [0, 0.05, 0.1, 0.95], 4/12, total 32 give [4, 4, 7, 17]. ``leftover="capped"``
  (posttrain's earlier rule, kept as an option) caps the proportional step at ``g_max`` and hands the
  overflow out one at a time round-robin in descending difficulty: [6, 6, 8, 12] there.
* The entropy the temperature controller reads is the loop's ``entropy_pre_update`` metric: the
  token-mean entropy of the temperature-scaled policy on the step's action tokens, measured without a
  gradient and independent of any loss term. The authors' code reads ``actor/entropy_loss``, which verl
  only computes when the entropy coefficient is non-zero (E3 runs with 0).
"""

from __future__ import annotations

import math
from typing import Any

from posttrain.hooks.base import (
    CONTROLLERS,
    SAMPLERS,
    Controller,
    GroupOutcome,
    Knobs,
    PromptPlan,
    RunInfo,
    UniformSampler,
)
from posttrain.utils.errors import InvalidValueError

UNSEEN = -100.0  # rank of a question not seen yet (the authors' marker; allocation weight 0)
#: How an unranked question counts once ranks exist (:meth:`E3Sampler.rank_of`).
UNSEEN_RULES = ("tail", "hardest", "zero")


# ------------------------------------------------------------------------------------ pure functions
#: How :func:`allocate_rollouts` hands out what the proportional step leaves over.
LEFTOVER_RULES = ("hardest-first", "capped")


def allocate_rollouts(
    difficulty: list[float], total: int, g_min: int, g_max: int, *, leftover: str = "hardest-first"
) -> list[int]:
    """Completions per prompt for one batch (arXiv:2505.18573, Alg. 1; authors' code
    ``e3/trainer/ray_trainer.py::get_rollout_n_per_prompt``).

    ``difficulty[i]`` is prompt i's rank in [0, 1) (larger = harder); a negative value (``UNSEEN``)
    counts as weight 0. Every prompt gets ``g_min`` plus ``floor((total − B·g_min) · k_i / Σk)``.

    * ``leftover="hardest-first"`` (default; the authors' rule): the proportional step is not capped,
      ``k`` is normalised as ``k / (Σk + 1e-8)`` as in their code, and the rounding leftover is given to
      the hardest prompt up to ``g_max``, then to the next hardest, and so on (so one prompt may hold
      more than ``g_max``: ranks [0, 0.05, 0.1, 0.95], 4/12, total 32 → [4, 4, 7, 17]).
    * ``leftover="capped"`` (posttrain's earlier rule): the proportional step is capped at ``g_max``
      and the leftover is handed out one at a time, visiting prompts in descending difficulty
      (cycling), skipping prompts at ``g_max`` (→ [6, 6, 8, 12]); counts stay in [g_min, g_max].

    Both: the counts sum to ``total``; a harder prompt never gets fewer than an easier one. When
    Σk = 0 (all unseen or all rank 0) the split is uniform. Raises ValueError when
    ``B·g_min <= total <= B·g_max`` fails or ``leftover`` is unknown.
    """
    if leftover not in LEFTOVER_RULES:
        raise InvalidValueError(
            f"allocate_rollouts: leftover must be one of {', '.join(LEFTOVER_RULES)}, got {leftover!r}"
        )
    b = len(difficulty)
    if g_min < 1 or g_min > g_max:
        raise InvalidValueError(
            f"allocate_rollouts: need 1 <= g_min <= g_max, got g_min={g_min}, g_max={g_max}"
        )
    if b == 0:
        if total:
            raise InvalidValueError(f"allocate_rollouts: total={total} rollouts for an empty batch")
        return []
    if not b * g_min <= total <= b * g_max:
        raise InvalidValueError(
            f"allocate_rollouts: total={total} is outside [{b}·g_min, {b}·g_max] = [{b * g_min}, {b * g_max}]"
        )
    k = [max(float(d), 0.0) for d in difficulty]
    s = sum(k)
    if s <= 0:
        base, rest = divmod(total, b)
        return [base + (i < rest) for i in range(b)]
    extra = total - b * g_min
    order = sorted(range(b), key=lambda i: (-k[i], i))
    if leftover == "hardest-first":
        counts = [g_min + math.floor(extra * (ki / (s + 1e-8))) for ki in k]
        left = total - sum(counts)
        for i in order:
            if left <= 0:
                break
            add = min(left, max(g_max - counts[i], 0))
            counts[i] += add
            left -= add
        return counts
    counts = [min(g_min + math.floor(extra * ki / s), g_max) for ki in k]
    left = total - sum(counts)
    while left > 0:
        for i in order:
            if left == 0:
                break
            if counts[i] < g_max:
                counts[i] += 1
                left -= 1
    return counts


def e3_temperature_step(tau: float, entropy: float, target_entropy: float, vocab_size: int) -> float:
    """One step of E3's temperature controller (arXiv:2505.18573, Eq. 4; authors' code
    ``TemperatureScheduler``): ``τ' = τ · (1 + τ · ln(H_target / H) / (ln|V| + ln ln|V|))``.

    Below the target entropy the temperature rises, above it falls; at the target it stays."""
    if vocab_size < 3:
        raise InvalidValueError(f"e3_temperature_step: vocab_size must be >= 3, got {vocab_size}")
    if not (tau > 0 and entropy > 0 and target_entropy > 0):
        raise InvalidValueError(
            f"e3_temperature_step: tau, entropy and target_entropy must be > 0, got {tau}, {entropy}, "
            f"{target_entropy}"
        )
    factor = math.log(vocab_size) + math.log(math.log(vocab_size))
    return tau * (1.0 + tau * math.log(target_entropy / entropy) / factor)


def e3_annealed_target(h_init: float, step: int, max_steps: int, *, eta: float = 0.9) -> float:
    """Target entropy with E3's cosine annealing (authors' code ``enable_annealing``): constant
    ``h_init`` until ``t_anneal = max_steps − int(0.4·max_steps)``, then
    ``h_init · [η + (1 − η) · ½(1 + cos(π · (t − t_anneal) / (max_steps − t_anneal)))]``.
    (The paper's Eq. 5 prints an extra (1 + η²/t²) factor; the code form is used.)"""
    t_anneal = max_steps - int(0.4 * max_steps)
    if step < t_anneal or max_steps <= t_anneal:
        return h_init
    progress = min((step - t_anneal) / (max_steps - t_anneal), 1.0)
    return h_init * (eta + (1.0 - eta) * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ------------------------------------------------------------------------------------------ sampler
@SAMPLERS.register("e3")
class E3Sampler(UniformSampler):
    """E3 per-prompt rollout budget (arXiv:2505.18573, Alg. 1).

    Prompts come in the uniform sampler's shuffled epochs. Per question the sampler accumulates the
    reward sum and count; at the end of each epoch it ranks the questions by mean reward (not the sum;
    descending: rank = index / |D| in [0, 1), larger = harder; unvisited ones per ``unseen``) and widens
    the budget bounds: ``[G − widen·e, G + widen·e]`` clipped to ``[g_min, g_max]`` after e epochs
    (G = ``rollout.group_size``; authors' scripts: G 8, g_min 4, g_max 12, widen 2 → 8/8, 6/10, 4/12).
    Each batch keeps the total ``prompts · G`` and splits it with :func:`allocate_rollouts`
    (``leftover``: ``hardest-first``, the authors' rule, default; or ``capped``).

    ``unseen``: how a question not yet visited counts once ranks exist. ``tail`` (default, the authors'
    ``update_rank``, which sorts every question of the dataset by average reward with 0 for an unvisited
    one): unvisited questions are ranked with mean reward 0, so they tie with the seen mean-0 questions
    at the hard end of the ranking (ties in the dataset's order, as the authors' stable sort keeps
    them; a question no longer in the dataset after them, by id); ``hardest`` gives
    every unvisited question the single top rank ``(|D| − 1)/|D|`` (posttrain's earlier rule); ``zero``
    gives it weight 0 (g_min). Before the first epoch ends no question has a rank and the split is
    uniform whichever rule.

    Under asynchronous rollout (``rollout.max_staleness`` = η > 0, docs/async.md) ``plan`` runs when
    groups are dispatched to the generation workers, with as many prompts as one generate call takes
    (``rollout.generators.prompts_per_call``), so the budget split keeps ``prompts · G`` per call;
    ``observe`` sees the groups a step trains on, generated by a policy up to η versions old, so the
    ranks lag by up to η steps more than synchronously.
    """

    def __init__(
        self,
        examples: list[Any],
        *,
        seed: int = 0,
        g_min: int = 4,
        g_max: int = 12,
        widen: int = 2,
        leftover: str = "hardest-first",
        unseen: str = "tail",
    ) -> None:
        self.validate_params(
            {"g_min": g_min, "g_max": g_max, "widen": widen, "leftover": leftover, "unseen": unseen}
        )
        super().__init__(examples, seed=seed)
        self.g_min, self.g_max, self.widen = g_min, g_max, widen
        self.leftover, self.unseen = leftover, unseen
        self.stats: dict[str, list[float]] = {}  # question id -> [reward sum, count]
        self.ranks: dict[str, float] = {}
        self.epochs_done = 0
        self._last: dict[str, float] = {}

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        g_min, g_max, widen = params.get("g_min", 4), params.get("g_max", 12), params.get("widen", 2)
        if not isinstance(g_min, int) or g_min < 1:
            raise InvalidValueError(f"g_min must be an integer >= 1, got {g_min!r}")
        if not isinstance(g_max, int) or g_max < g_min:
            raise InvalidValueError(f"g_max must be an integer >= g_min ({g_min}), got {g_max!r}")
        if not isinstance(widen, int) or widen < 0:
            raise InvalidValueError(f"widen must be an integer >= 0, got {widen!r}")
        if params.get("leftover", "hardest-first") not in LEFTOVER_RULES:
            raise InvalidValueError(
                f"leftover must be one of {', '.join(LEFTOVER_RULES)}, got {params.get('leftover')!r}"
            )
        if params.get("unseen", "tail") not in UNSEEN_RULES:
            raise InvalidValueError(
                f"unseen must be one of {', '.join(UNSEEN_RULES)}, got {params.get('unseen')!r}"
            )

    def bounds(self, group_size: int) -> tuple[int, int]:
        """[G_min, G_max] of the current epoch."""
        if not self.g_min <= group_size <= self.g_max:
            raise InvalidValueError(
                f"hooks.sampler 'e3': rollout.group_size={group_size} must lie in "
                f"[g_min, g_max] = [{self.g_min}, {self.g_max}]"
            )
        e = self.epochs_done
        return max(group_size - self.widen * e, self.g_min), min(group_size + self.widen * e, self.g_max)

    def _end_epochs(self) -> None:
        """Rank the questions seen so far (the authors' ``update_rank``), once per finished epoch."""
        while self.epochs_done < self.epoch:
            # mean reward (not the sum: E3's own budgets give questions different rollout counts)
            means = {qid: total / count for qid, (total, count) in self.stats.items()}
            if self.unseen == "tail":  # the authors' sort covers the whole dataset, unvisited at mean 0
                for ex in self.examples:
                    means.setdefault(_qid(ex), 0.0)
            # ties keep the dataset's order, as the authors' stable sort over the dataset's indices does
            pos = {_qid(ex): i for i, ex in enumerate(self.examples)}
            order = sorted(means, key=lambda qid: (-means[qid], pos.get(qid, len(pos)), qid))
            self.ranks = {qid: i / len(self.examples) for i, qid in enumerate(order)}
            self.epochs_done += 1

    def plan(self, step: int, num_prompts: int, group_size: int) -> PromptPlan:
        picked = super().plan(step, num_prompts, group_size).examples
        self._end_epochs()
        lo, hi = self.bounds(group_size)
        ranks = [self.rank_of(_qid(ex)) for ex in picked]
        counts = allocate_rollouts(ranks, num_prompts * group_size, lo, hi, leftover=self.leftover)
        hard = [n for r, n in zip(ranks, counts, strict=True) if r >= 0.5]
        easy = [n for r, n in zip(ranks, counts, strict=True) if 0 <= r < 0.5]
        self._last = {"g_min": lo, "g_max": hi, "ranked_frac": sum(r >= 0 for r in ranks) / len(ranks)}
        if hard and easy:
            self._last.update(n_hard=sum(hard) / len(hard), n_easy=sum(easy) / len(easy))
        return PromptPlan(picked, counts)

    def rank_of(self, qid: str) -> float:
        """A question's rank; unranked (before any ranking, or ``unseen="zero"``): ``UNSEEN``; with
        ``unseen="hardest"`` the top rank ``(|D| − 1) / |D|``; with ``"tail"`` every question is ranked."""
        if qid in self.ranks:
            return self.ranks[qid]
        if self.ranks and self.unseen == "hardest":
            return (len(self.examples) - 1) / len(self.examples)
        return UNSEEN

    def observe(self, outcomes: list[GroupOutcome], step: int) -> None:
        for o in outcomes:
            s = self.stats.setdefault(_qid(o.example), [0.0, 0])
            s[0] += sum(o.rewards)
            s[1] += len(o.rewards)

    def metrics(self) -> dict[str, float]:
        return dict(self._last)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "stats": self.stats,
            "ranks": self.ranks,
            "epochs_done": self.epochs_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.stats = {k: [float(v[0]), int(v[1])] for k, v in state["stats"].items()}
        self.ranks = {k: float(v) for k, v in state["ranks"].items()}
        self.epochs_done = int(state["epochs_done"])


def _qid(example: Any) -> str:
    return str(getattr(example, "id", None) or getattr(example, "prompt", example))


# --------------------------------------------------------------------------------------- controller
@CONTROLLERS.register("e3-temperature")
class E3Temperature(Controller):
    """E3 entropy-targeting temperature (arXiv:2505.18573, Eq. 4).

    The first step's measured entropy (``entropy_pre_update``: no-grad, at the current temperature,
    over the step's action tokens) becomes the target; after every step
    :func:`e3_temperature_step` moves τ towards it. The new τ is set on the loop's
    :class:`~posttrain.hooks.Knobs`, which the trainer uses for sampling AND the training
    log-probs (logits / τ). ``init`` is the first τ (None: ``rollout.temperature``); τ stays in
    ``[min_temperature, max_temperature]`` (a guard, not in the paper). ``anneal=True`` lowers the target to ``eta · H_init`` over the last 40 %
    of the run (cosine, :func:`e3_annealed_target`); it is on by default, as in the paper's E3.

    Under asynchronous rollout (``rollout.max_staleness`` = η > 0, docs/async.md): a group is sampled
    at the τ of the step that dispatched it, the trainer's log-probs use the current step's τ, and the
    behaviour weight min(π_old,τ_s / μ_τ_v, C) corrects for the temperature change as for the weight
    change (μ is the sampling distribution actually used). ``entropy_pre_update`` is measured on the
    consumed groups at the current τ, so τ reacts to groups up to η steps old (a feedback delay of η).
    """

    def __init__(
        self,
        *,
        init: float | None = None,
        anneal: bool = True,
        eta: float = 0.9,
        min_temperature: float = 0.05,
        max_temperature: float = 5.0,
    ) -> None:
        self.validate_params(
            {"init": init, "eta": eta, "min_temperature": min_temperature, "max_temperature": max_temperature}
        )
        self.tau = None if init is None else float(init)
        self.anneal, self.eta = anneal, eta
        self.lo, self.hi = min_temperature, max_temperature
        self.h_init: float | None = None
        self.vocab_size: int | None = None
        self.total_steps = 0

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        init = params.get("init")
        eta = params.get("eta", 0.9)
        lo, hi = params.get("min_temperature", 0.05), params.get("max_temperature", 5.0)
        if init is not None and not (isinstance(init, int | float) and init > 0):
            raise InvalidValueError(
                f"init must be a temperature > 0 (or null: rollout.temperature), got {init!r}"
            )
        if not (isinstance(eta, int | float) and 0 < eta <= 1):
            raise InvalidValueError(f"eta must lie in (0, 1], got {eta!r}")
        mid = lo if init is None else init
        if not (isinstance(lo, int | float) and isinstance(hi, int | float) and 0 < lo <= mid <= hi):
            raise InvalidValueError(
                f"min_temperature / max_temperature must satisfy 0 < min_temperature <= init <= "
                f"max_temperature, got {lo!r}, {init!r}, {hi!r}"
            )

    def bind(self, run: RunInfo) -> None:
        self.vocab_size, self.total_steps = run.vocab_size, run.total_steps

    def target(self, step: int) -> float | None:
        if self.h_init is None:
            return None
        if not self.anneal:
            return self.h_init
        return e3_annealed_target(self.h_init, step, self.total_steps, eta=self.eta)

    def apply(self, knobs: Knobs, step: int) -> None:
        if self.tau is None:  # init: null -> start from rollout.temperature
            self.tau = float(knobs.temperature)
        knobs.temperature = self.tau

    def update(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        if "entropy_pre_update" not in metrics:
            raise InvalidValueError(
                "controller 'e3-temperature': the step reported no 'entropy_pre_update' metric"
            )
        if self.vocab_size is None:
            raise InvalidValueError(
                "controller 'e3-temperature': bind(RunInfo) was not called by the trainer"
            )
        h = float(metrics["entropy_pre_update"])
        if self.h_init is None:  # init_steps = 1: the first step's entropy is the target
            self.h_init = h
        target = self.target(step)
        if h > 0 and target is not None:
            self.tau = min(max(e3_temperature_step(self.tau, h, target, self.vocab_size), self.lo), self.hi)
        return {"temperature": self.tau, "target_entropy": float(target or 0.0), "entropy": h}

    def state_dict(self) -> dict[str, Any]:
        return {"tau": self.tau, "h_init": self.h_init}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tau = None if state["tau"] is None else float(state["tau"])
        self.h_init = None if state["h_init"] is None else float(state["h_init"])
