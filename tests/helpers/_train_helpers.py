"""Picklable test rewards (top-level classes so reward-pool workers can import them)."""

from __future__ import annotations

import time


class SleepyReward:
    """Sleeps longer than any test timeout, so every call times out."""

    name = "sleepy"

    def __init__(self, seconds: float = 30.0) -> None:
        self.seconds = seconds

    def __call__(self, completion, example) -> float:
        time.sleep(self.seconds)
        return 1.0


class FirstCharDigit:
    """1 if the completion starts with a decimal digit: trivially learnable from a random model
    (10 of 357 tokens are digits, so a few samples per step are rewarded at the start)."""

    name = "first_char_digit"

    def __call__(self, completion, example) -> float:
        return 1.0 if completion[:1].isdigit() else 0.0


class Constant:
    name = "constant"

    def __call__(self, completion, example) -> float:
        return 1.0


class Broken:
    """A reward plug-in with a bug: raises on every call (reward failures are shown, counted, stop a run)."""

    name = "broken"

    def __call__(self, completion, example) -> float:
        return {}["no-such-key"]


class NaNReward:
    """Returns NaN on every call."""

    name = "nan"

    def __call__(self, completion, example) -> float:
        return float("nan")


class HalfBroken:
    """Raises on completions of odd length, 1.0 otherwise (some of a step's rewards fail)."""

    name = "half_broken"

    def __call__(self, completion, example) -> float:
        if len(completion) % 2:
            raise ZeroDivisionError("odd length")
        return 1.0


# `posttrain rl` / `eval` overrides for a CLI run that takes seconds: tiny preset, 1-digit sums,
# 2 prompts x 2 completions of 3 tokens, in-process rewards, one thread.
CLI_TINY = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 40, n_heldout: 10}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",
    "eval.n=4",
    "threads=1",
]


# RLConfig overrides for in-process trainer tests: tiny preset, 1-digit sums, 4 prompts x 4 completions
# of 3 tokens, in-process rewards (test_rl_loop, test_step_signals).
RL_BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 60, n_heldout: 20}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    "eval.n=8",
    "eval.at_start=false",
    "optimizer.lr=1e-3",
]


def kill_at_step(
    monkeypatch, trainer_cls, step_idx: int, exc: type[BaseException] = KeyboardInterrupt
) -> None:
    """``trainer_cls.step`` raises ``exc`` when called with ``step_idx`` steps done: the run is killed
    there (``monkeypatch.undo()`` restores the real step)."""
    real_step = trainer_cls.step

    def step(self):
        if self.step_idx == step_idx:
            raise exc
        return real_step(self)

    monkeypatch.setattr(trainer_cls, "step", step)


def logp64(model, ro):
    """Float64 log-probs of the completion tokens of the step rollout ``ro`` under ``model`` at the
    step's temperature (a recomputation by hand, to check behaviour log-probs and importance weights)."""
    import copy

    import torch

    m = copy.deepcopy(model).double().eval()
    pos = (ro.attention_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = m(input_ids=ro.input_ids, attention_mask=ro.attention_mask, position_ids=pos).logits
    lp = torch.log_softmax(logits.double() / ro.temperature, dim=-1)
    tok = lp[:, :-1].gather(-1, ro.input_ids[:, 1:, None])[..., 0]
    full = torch.cat([torch.zeros_like(tok[:, :1]), tok], dim=1)
    return full[:, ro.prompt_width :]
