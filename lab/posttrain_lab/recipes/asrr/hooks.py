"""ASRR: accuracy-gated dynamic length penalty and the No-Thinking prompt prefix.

Source: "When to Continue Thinking: Adaptive Thinking Mode Switching for Efficient Reasoning"
(ASRR), arXiv:2505.15400 — Eq. 1 (No-Thinking prefix), Eqs. 5-7 (dynamic length penalty), Table 3
(β = 0.5, L_window = 2048, τ = 100 %). The authors' code is not public. Formulas:
``docs/sampling-methods.md``.

Choices where the paper is open: ε = 1e-6 (the paper says "small constant"); a group without a correct
rollout gets no length term (O_i = 0; α is 0 there anyway unless τ = 0); the "α = 1.0" row of Table 3
conflicts with the dynamic α and is ignored; the prefix uses the figures' wording ("Okay, I think I
have finished thinking.") inside think tags, as the assistant turn's opening; the Continue-Thinking
detector (:func:`continue_thinking_ratio`) is a marker list, the paper's is not published.

The shaper reports the Continue-Thinking ratio itself (``continue_thinking_frac`` per step,
``continue_thinking`` per evaluation, through ``Hook.step_metrics`` / ``Hook.eval_metrics``): the
markers are ASRR's parameter (``hooks.shapers[i].params.markers``), not the task's, while the prefix
that opens the assistant turn (``task.assistant_prefix``) is the library's, general to any prompt format.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.hooks.base import GROUP_SHAPERS, GroupRewardShaper
from posttrain.utils.errors import InvalidValueError

#: The No-Thinking prefix as the paper's figures render it (arXiv:2505.15400, Fig. 4): it OPENS THE
#: ASSISTANT TURN, after the chat template's generation prompt. Use it as ``task.assistant_prefix``
#: (the trainer's prompt formatter puts it after the generation prompt in rollout, SFT and evaluation
#: alike). In the user text (``task.prompt_template``) a chat model such as R1-Distill would still open
#: its own ``<think>`` block and think: the method would never run.
NO_THINKING_PREFIX = "<think>\nOkay, I think I have finished thinking.\n</think>\n\n"
#: Deprecated: a ``task.prompt_template`` with the prefix at the end of the USER text. Equivalent to
#: ``task.assistant_prefix`` only without a chat template; kept for old configs.
NO_THINKING_TEMPLATE = "{prompt}" + NO_THINKING_PREFIX

#: Default markers of reasoning resumed after a No-Thinking prefix (case-insensitive substrings).
CONTINUE_THINKING_MARKERS = ("</think>", "<think>", "wait", "hmm", "let me", "step by step")


def continue_thinking_ratio(
    texts: list[str], markers: tuple[str, ...] | list[str] = CONTINUE_THINKING_MARKERS
) -> float:
    """ASRR's Continue-Thinking ratio (arXiv:2505.15400, §4): the share of completions generated after
    the No-Thinking prefix that resume reasoning, detected as containing any of ``markers``
    (case-insensitive). The paper does not publish its detector; the markers are a choice, set them
    per run (``ASRRShaper(markers=...)``). Empty list of texts: 0."""
    if not texts:
        return 0.0
    low = [m.lower() for m in markers]
    return sum(any(m in t.lower() for m in low) for t in texts) / len(texts)


def asrr_length_penalty(
    correct: list[bool],
    lengths: list[int],
    *,
    beta: float = 0.5,
    window: float = 2048,
    tau: float = 1.0,
    eps: float = 1e-6,
) -> list[float]:
    """Per-rollout length penalty α·O_i of one group (arXiv:2505.15400, Eqs. 5-7); the shaped reward
    is ``1[correct_i] − penalty_i`` for every rollout, correct or not.

    ``Acc = mean(correct)``; ``O_i = clip((L_i − L_shortest_correct) / window, 0, 1)``;
    ``α = 0`` if ``Acc < τ`` else ``β · (Acc − τ + ε) / (1 − τ + ε)``. No correct rollout → all 0.
    """
    validate_asrr(beta=beta, window=window, tau=tau, eps=eps)
    if len(correct) != len(lengths):
        raise InvalidValueError(
            f"asrr_length_penalty: {len(correct)} correctness flags but {len(lengths)} lengths"
        )
    if not any(correct):
        return [0.0] * len(correct)
    acc = sum(bool(c) for c in correct) / len(correct)
    if acc < tau:
        return [0.0] * len(correct)
    alpha = beta * (acc - tau + eps) / (1.0 - tau + eps)
    shortest = min(n for n, c in zip(lengths, correct, strict=True) if c)
    return [alpha * min(max((n - shortest) / window, 0.0), 1.0) for n in lengths]


def validate_asrr(*, beta: Any, window: Any, tau: Any, eps: Any) -> None:
    if not (isinstance(beta, int | float) and beta >= 0):
        raise InvalidValueError(f"beta must be a number >= 0, got {beta!r}")
    if not (isinstance(window, int | float) and window > 0):
        raise InvalidValueError(f"window must be a length in tokens > 0, got {window!r}")
    if not (isinstance(tau, int | float) and 0 <= tau <= 1):
        raise InvalidValueError(f"tau must lie in [0, 1] (an accuracy threshold), got {tau!r}")
    if not (isinstance(eps, int | float) and eps > 0):
        raise InvalidValueError(f"eps must be > 0, got {eps!r}")


@GROUP_SHAPERS.register("asrr")
class ASRRShaper(GroupRewardShaper):
    """ASRR dynamic length penalty per group (arXiv:2505.15400, Eqs. 5-7): ``R'_i = R_i − α·O_i``.

    The paper's reward is the 0/1 correctness; here the raw reward R_i stands in for it (identical
    for exact-match tasks; a task with partial credit keeps it). Lengths are the policy's tokens.
    Use it with ``task.assistant_prefix`` = :data:`NO_THINKING_PREFIX` (the paper trains and
    evaluates in No-Thinking mode); ``window`` should be scaled to the task's completion lengths.
    ``beta = 0`` leaves every reward as it is (the prefix-only control, which still reports the ratio).

    Reports the Continue-Thinking ratio (:func:`continue_thinking_ratio` with ``markers``) of the
    step's completions as ``continue_thinking_frac`` and of each evaluation's greedy completions as
    ``continue_thinking``.
    """

    def __init__(
        self,
        *,
        beta: float = 0.5,
        window: float = 2048,
        tau: float = 1.0,
        eps: float = 1e-6,
        markers: list[str] | tuple[str, ...] = CONTINUE_THINKING_MARKERS,
    ) -> None:
        self.validate_params({"beta": beta, "window": window, "tau": tau, "eps": eps, "markers": markers})
        self.beta, self.window, self.tau, self.eps = beta, window, tau, eps
        self.markers = tuple(markers)

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        validate_asrr(
            beta=params.get("beta", 0.5),
            window=params.get("window", 2048),
            tau=params.get("tau", 1.0),
            eps=params.get("eps", 1e-6),
        )
        markers = params.get("markers", CONTINUE_THINKING_MARKERS)
        if (
            not isinstance(markers, list | tuple)
            or not markers
            or not all(isinstance(m, str) and m for m in markers)
        ):
            raise InvalidValueError(f"markers must be a list of non-empty strings, got {markers!r}")

    def step_metrics(self, episodes: Any) -> dict[str, float]:
        return {"continue_thinking_frac": continue_thinking_ratio(list(episodes.texts), self.markers)}

    def eval_metrics(self, episodes: Any) -> dict[str, float]:
        return {"continue_thinking": continue_thinking_ratio(list(episodes.texts), self.markers)}

    def shape(self, rewards, group_ids, *, correct, lengths, truncated):
        out = rewards.clone()
        for g in torch.unique(group_ids).tolist():
            rows = (group_ids == g).nonzero().flatten()
            pen = asrr_length_penalty(
                correct[rows].tolist(),
                lengths[rows].tolist(),
                beta=self.beta,
                window=self.window,
                tau=self.tau,
                eps=self.eps,
            )
            out[rows] = out[rows] - torch.tensor(pen, dtype=out.dtype)
        return out
