"""PAR training of a pointwise judge through :class:`~posttrain.train.rl.RLTrainer` (no separate loop).

Three registered components turn preference pairs into an ordinary RL run (PaTaRM, arXiv 2510.24235):

* task ``preferences`` (:class:`PreferenceTask`): one example per pair (a file, or synthetic pairs
  from a verifiable task); ``heldout`` pairs never share a prompt with ``train`` pairs;
* episode runner ``par`` (:class:`PARRunner`): for each pair it builds the pointwise judge prompt of
  the chosen AND of the rejected response and samples ``rollout.group_size`` = n judgments of each —
  two groups per pair, so GRPO normalises within the n judgments of one response;
* reward source ``par`` (:class:`PARRewardSource`): parses the scores and applies
  :func:`posttrain_lab.recipes.patarm.par.par_rewards` per pair (proposed design: rule ``antisymmetric``
  or ``indicator``; graded option).

A judgment that ran into ``rollout.max_new_tokens`` without ending (finish reason ``length``) is never
scored as a verdict: the runner marks it (``par_truncated``) and the reward source treats it as
unparsable, whatever number it contains (a cut-off ``<think>`` block often ends in one).
``enable_thinking`` (runner param; chat-templated judges such as Qwen3) is passed to the tokenizer's
chat template.

Any registered objective / advantage estimator works. A config (``recipes/patarm/rm-par-demo.yaml``)::

    task: {name: preferences, params: {synthetic_task: arithmetic, synthetic_params: {digits: 2}}}
    rollout: {group_size: 4, runner: {name: par, params: {rubric_style: none}}}
    reward: {source: {name: par, params: {rule: antisymmetric}}, success_threshold: 1.0}

Held-out evaluation (``eval.*``) runs the same runner greedily: one judgment per side, so the mean
``accuracy`` is the pairwise accuracy of the judge (ties count as wrong).
"""

from __future__ import annotations

import itertools
from typing import Any

from posttrain.rollout.base import SamplingParams
from posttrain.rollout.episodes import EpisodeRunner, Episodes
from posttrain.rollout.reward_source import RewardHandle, RewardSource, ScoredBatch, _Ready
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.patarm.data import PreferencePair
from posttrain_lab.recipes.patarm.par import par_rewards
from posttrain_lab.recipes.patarm.preference_task import example_pair
from posttrain_lab.recipes.patarm.prompts import DEFAULT_SCALE, parse_score, pointwise_prompt


class PARRunner(EpisodeRunner):
    """Two groups per pair: n judgments of the chosen response, n of the rejected one (proposed
    design after PaTaRM). Each judgment's example carries ``par_pair`` (the pair's key in this batch)
    and ``par_side`` (``chosen`` / ``rejected``) for :class:`PARRewardSource`."""

    def __init__(
        self,
        engine: Any,
        formatter: Any,
        *,
        rubric_style: str = "full",
        scale: tuple[float, float] = DEFAULT_SCALE,
        enable_thinking: bool | None = None,
    ) -> None:
        if enable_thinking is not None:
            from posttrain_lab.recipes.patarm.judge import JudgeFormatter

            formatter = JudgeFormatter.wrap(formatter, enable_thinking=enable_thinking)
        self.engine, self.formatter = engine, formatter
        self.rubric_style = rubric_style
        self.scale = scale
        self._calls = itertools.count()
        self._cache: dict[str, list[int]] = {}

    def judge_prompt(self, pair: PreferencePair, side: str) -> str:
        response = pair.chosen if side == "chosen" else pair.rejected
        return pointwise_prompt(
            pair.prompt,
            response,
            pair.task_type,
            rubric_style=self.rubric_style,
            scale=self.scale,  # type: ignore[arg-type]
        )

    def _encode(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = self._cache[text] = self.formatter.encode(text)
        return ids

    def run(self, examples: list[Any], n_per_prompt: list[int], params: SamplingParams) -> Episodes:
        call = next(self._calls)
        side_examples: list[Example] = []
        prompts: list[list[int]] = []
        counts: list[int] = []
        for k, (ex, n) in enumerate(zip(examples, n_per_prompt, strict=True)):
            pair = example_pair(ex)
            for side in ("chosen", "rejected"):
                text = self.judge_prompt(pair, side)
                side_examples.append(
                    Example(
                        id=f"{ex.id}/{side}",
                        prompt=text,
                        answer="",
                        meta={"par_pair": f"{call}:{k}", "par_side": side, "task_type": pair.task_type},
                    )
                )
                prompts.append(self._encode(text))
                counts.append(n)
        batch = self.engine.generate(prompts, counts, params)
        texts = self.formatter.tokenizer.batch_decode(batch.completion_lists(), skip_special_tokens=True)
        truncated = batch.truncated.tolist()
        per_seq = []
        for g, cut in zip(batch.group_ids.tolist(), truncated, strict=True):
            ex = side_examples[g]
            if cut:  # never scored as a verdict (PARRewardSource)
                ex = Example(id=ex.id, prompt=ex.prompt, answer="", meta={**ex.meta, "par_truncated": True})
            per_seq.append(ex)
        return Episodes(batch=batch, texts=list(texts), examples=per_seq)


class PARRewardSource(RewardSource):
    """PAR rewards per pair (:func:`posttrain_lab.recipes.patarm.par.par_rewards`). Components: ``par_parsed`` (the
    judgment had a score; a truncated judgment — ``par_truncated`` in its example's meta — has none),
    ``par_truncated``, ``par_score`` (the score, scale minimum when none), ``par_pair_correct``
    (the pair's chosen mean is above its rejected mean), ``par_unpaired`` (the other side of the pair was
    not in the batch — e.g. a group filter dropped it; those judgments earn 0 and count as errors)."""

    def __init__(
        self,
        *,
        rule: str = "antisymmetric",
        graded: bool = False,
        alpha: float = 0.5,
        delta: float | None = None,
        format_penalty: float = 0.0,
        scale: tuple[float, float] = DEFAULT_SCALE,
        fallback: bool = True,
    ) -> None:
        self.kw = dict(
            rule=rule, graded=graded, alpha=alpha, delta=delta, format_penalty=format_penalty, scale=scale
        )
        self.scale = (float(scale[0]), float(scale[1]))
        self.fallback = fallback
        par_rewards([1.0], [0.0], **self.kw)  # validate the options now

    def submit(self, completions: list[str], examples: list[Any]) -> RewardHandle:
        return _Ready(self.score_now(completions, examples))

    def score_now(self, completions: list[str], examples: list[Any]) -> ScoredBatch:
        n = len(completions)
        metas = [getattr(ex, "meta", {}) or {} for ex in examples]
        cut = [bool(m.get("par_truncated")) for m in metas]
        scores = [
            None if c else parse_score(t, scale=self.scale, fallback=self.fallback)
            for t, c in zip(completions, cut, strict=True)
        ]
        sides: dict[str, dict[str, list[int]]] = {}
        for i, meta in enumerate(metas):
            if "par_pair" not in meta:
                raise InvalidValueError(
                    "reward source 'par' needs the episodes of the runner 'par' (examples without "
                    "'par_pair' in meta)"
                )
            sides.setdefault(meta["par_pair"], {"chosen": [], "rejected": []})[meta["par_side"]].append(i)
        rewards = [0.0] * n
        pair_ok = [0.0] * n
        unpaired = [0.0] * n
        for rows in sides.values():
            c, r = rows["chosen"], rows["rejected"]
            if not c or not r:
                for i in c + r:
                    unpaired[i] = 1.0
                continue
            rc, rr = par_rewards([scores[i] for i in c], [scores[i] for i in r], **self.kw)  # type: ignore[arg-type]
            for i, v in zip(c + r, rc + rr, strict=True):
                rewards[i] = v
            vc = [scores[i] for i in c if scores[i] is not None]
            vr = [scores[i] for i in r if scores[i] is not None]
            ok = float(bool(vc) and bool(vr) and sum(vc) / len(vc) > sum(vr) / len(vr))  # type: ignore[arg-type]
            for i in c + r:
                pair_ok[i] = ok
        lo = self.scale[0]
        return ScoredBatch(
            rewards=rewards,
            errors=int(sum(unpaired)),
            components={
                "par_parsed": [float(s is not None) for s in scores],
                "par_truncated": [float(c) for c in cut],
                "par_score": [lo if s is None else float(s) for s in scores],
                "par_pair_correct": pair_ok,
                "par_unpaired": unpaired,
            },
        )
