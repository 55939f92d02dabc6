"""ASRR: accuracy-gated dynamic length penalty and the No-Thinking prompt prefix.

Source: "When to Continue Thinking: Adaptive Thinking Mode Switching for Efficient Reasoning"
(ASRR), arXiv:2505.15400 — Eq. 1 (No-Thinking prefix), Eqs. 5-7 (dynamic length penalty), Table 3
(β = 0.5, L_window = 2048, τ = 100 %). The authors' code is not public. Formulas:
``docs/sampling-methods.md``.

Choices where the paper is open: ε = 1e-6 (the paper says "small constant"); a group without a correct
rollout gets no length term (O_i = 0; α is 0 there anyway unless τ = 0); the "α = 1.0" row of Table 3
conflicts with the dynamic α and is ignored; the prefix uses the figures' wording ("Okay, I think I
have finished thinking.") inside think tags, as the assistant turn's opening; the Continue-Thinking
detector (``posttrain.rollout.episodes.continue_thinking_ratio``) is a marker list, the paper's is not
published.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.hooks.base import GROUP_SHAPERS, GroupRewardShaper

#: The No-Thinking prefix as the paper's figures render it (arXiv:2505.15400, Fig. 4): it OPENS THE
#: ASSISTANT TURN, after the chat template's generation prompt. Use it as ``task.assistant_prefix``
#: (the trainer's prompt formatter puts it after the generation prompt in rollout, SFT and evaluation
#: alike). In the user text (``task.prompt_template``) a chat model such as R1-Distill would still open
#: its own ``<think>`` block and think: the method would never run.
NO_THINKING_PREFIX = "<think>\nOkay, I think I have finished thinking.\n</think>\n\n"
#: Deprecated: a ``task.prompt_template`` with the prefix at the end of the USER text. Equivalent to
#: ``task.assistant_prefix`` only without a chat template; kept for old configs.
NO_THINKING_TEMPLATE = "{prompt}" + NO_THINKING_PREFIX


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
        raise ValueError(f"asrr_length_penalty: {len(correct)} correctness flags but {len(lengths)} lengths")
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
        raise ValueError(f"beta must be a number >= 0, got {beta!r}")
    if not (isinstance(window, int | float) and window > 0):
        raise ValueError(f"window must be a length in tokens > 0, got {window!r}")
    if not (isinstance(tau, int | float) and 0 <= tau <= 1):
        raise ValueError(f"tau must lie in [0, 1] (an accuracy threshold), got {tau!r}")
    if not (isinstance(eps, int | float) and eps > 0):
        raise ValueError(f"eps must be > 0, got {eps!r}")


@GROUP_SHAPERS.register("asrr")
class ASRRShaper(GroupRewardShaper):
    """ASRR dynamic length penalty per group (arXiv:2505.15400, Eqs. 5-7): ``R'_i = R_i − α·O_i``.

    The paper's reward is the 0/1 correctness; here the raw reward R_i stands in for it (identical
    for exact-match tasks; a task with partial credit keeps it). Lengths are the policy's tokens.
    Use it with ``task.assistant_prefix`` = :data:`NO_THINKING_PREFIX` (the paper trains and
    evaluates in No-Thinking mode); ``window`` should be scaled to the task's completion lengths.
    """

    def __init__(
        self, *, beta: float = 0.5, window: float = 2048, tau: float = 1.0, eps: float = 1e-6
    ) -> None:
        self.validate_params({"beta": beta, "window": window, "tau": tau, "eps": eps})
        self.beta, self.window, self.tau, self.eps = beta, window, tau, eps

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        validate_asrr(
            beta=params.get("beta", 0.5),
            window=params.get("window", 2048),
            tau=params.get("tau", 1.0),
            eps=params.get("eps", 1e-6),
        )

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
