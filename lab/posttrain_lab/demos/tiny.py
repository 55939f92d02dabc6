"""``posttrain demo``: tiny model, short SFT warm start, RL, held-out before/after.

1. build the ``tiny`` preset (0.94 M parameters, character tokenizer) with a fixed seed;
2. SFT (completion tokens only, lr 1e-3, batch 32) on the reference completions of 2-digit
   addition in the scratchpad format, digit by digit with carries (``style="long"``), stopped early
   so the model is only partly right (the "before" number): at the first check (every 25 steps, at
   most 400) where greedy accuracy on 200 calibration questions held back from the SFT rows (the
   train split's last 200) reaches 30 % (``SFT_UNTIL``). A fixed step count did not hold across CPUs:
   350 steps at lr 3e-3 gave 36.0 % held-out on an AVX-512 machine and 6.5 % on an AVX2 one, because
   the curve is steep there and the kernels' last bits move it (docs/demo.md);
3. RL with the chosen objective (DGPO by default) from that warm start through the full loop of
   :mod:`posttrain.train.rl` (16 prompts x 8 completions per step at T = 1, exact-match reward in a
   worker pool, GRPO advantages, one on-policy AdamW update per step at lr 1e-4, 60 steps);
4. greedy pass@1 on the 200 held-out questions (never trained on) before and after RL; a table,
   ``curves.png`` and ``summary.json`` in the run directory.

Layout of the run directory (``runs/demo``): ``sft/`` (the SFT run: ``metrics.jsonl``, ``model/``),
``rl/`` (the RL run: ``metrics.jsonl``, ``config.yaml``, the RL policy in ``model/``, loadable with
``posttrain eval --model runs/demo/rl``), ``curves.png`` and ``summary.json``. A directory that
already holds a demo is refused unless ``overwrite`` (see :mod:`posttrain.train.run_dir`).

Why the scratchpad: the column-wise procedure is shared by all questions, so what RL reinforces on
training questions (column sums, carries, copying the digits into the final answer) transfers to
held-out ones. With the plain format (``12+34=`` -> ``46``) the tiny model mostly memorises, and RL
on training questions barely moves held-out accuracy (measured: 12% -> 11% in 60 steps).
The RL settings live in ``posttrain_lab/demos/demo.yaml``; CLI ``key=value`` arguments override them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from posttrain.train.sft import sft_warm_start
from posttrain.utils.io import atomic_write_json

SFT_UNTIL = 0.3
"""The warm start's target: greedy accuracy on the calibration questions (posttrain's design)."""
SFT_MAX_STEPS = 400
SFT_LR = 1e-3


def demo_overrides(out: Path, *, objective: str, rl_steps: int, seed: int) -> list[str]:
    """The RL settings of the demo (also shipped as ``configs/demo.yaml``)."""
    return [
        f"out_dir={out / 'rl'}",
        f"objective.name={objective}",
        f"steps={rl_steps}",
        f"seed={seed}",
    ]


def run_demo(
    out_dir: str | Path = "runs/demo",
    *,
    objective: str = "dgpo",
    quick: bool = False,
    sft_steps: int | None = None,
    rl_steps: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
    overrides: list[str] | None = None,
    sft_lr: float = SFT_LR,
    sft_until: float | None = SFT_UNTIL,
    sft_style: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    from importlib.resources import files

    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.saving import save_model_dir
    from posttrain.train.config import RLConfig
    from posttrain.train.plot import plot_run
    from posttrain.train.rl import RLTrainer
    from posttrain.train.run_dir import prepare_run_dir
    from posttrain.utils.config import build_config
    from posttrain.utils.tables import print_table

    t0 = time.perf_counter()
    out = Path(out_dir)
    base = files("posttrain_lab.demos") / "demo.yaml"
    sft_steps = sft_steps if sft_steps is not None else (10 if quick else SFT_MAX_STEPS)
    sft_until = None if quick else sft_until
    rl_steps = rl_steps if rl_steps is not None else (2 if quick else 60)

    quick_overrides = ["eval.n=20", "rollout.prompts_per_step=4"] if quick else []  # a smoke test
    cfg: RLConfig = build_config(
        RLConfig,
        str(base),
        [
            *demo_overrides(out, objective=objective, rl_steps=rl_steps, seed=seed),
            *quick_overrides,
            *(overrides or []),
        ],
    )
    prepare_run_dir(out, overwrite=overwrite, can_resume=False)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model_and_tokenizer(cfg.model.name, dtype=cfg.model.dtype, device="cpu", seed=seed)

    sft_summary = sft_warm_start(
        cfg,
        model,
        tok,
        steps=sft_steps,
        lr=sft_lr,
        style=sft_style,
        seed=seed,
        out_dir=out / "sft",
        progress=progress,
        stop_at=sft_until,
    )
    t_sft = time.perf_counter() - t0

    cfg.eval.at_start = True
    cfg.eval.at_end = True
    cfg.checkpoint.final = False
    with RLTrainer(cfg, model, tok) as trainer:
        rl_summary = trainer.train(progress=progress)
        policy = save_model_dir(
            trainer.model, trainer.tokenizer, out / "rl" / "model"
        )  # for `posttrain eval`
    before, after = rl_summary["eval_start"], rl_summary["eval_end"]
    plot = plot_run(out / "rl", out / "curves.png")
    wall = time.perf_counter() - t0
    from posttrain.models.precision import cpu_capability

    summary = {
        # the result depends on the CPU's kernels (docs/demo.md: 6.5 % -> 26.5 % on AVX2, 36 % -> 71.5 %
        # on AVX-512): the kernel level it ran with, to compare with those figures
        "cpu_capability": cpu_capability(),
        "objective": objective,
        "task": {"name": cfg.task.name, **cfg.task.params},
        "model": cfg.model.name,
        "sft_steps": sft_summary["steps"],
        # the warm start's stop (None: it ran all its steps without reaching the target)
        "sft_until": sft_until,
        "sft_stopped_at": sft_summary.get("stopped_at"),
        "sft_calibration_accuracy": (sft_summary.get("eval") or {}).get("accuracy"),
        "rl_steps": rl_summary["steps"],
        "before": before,
        "after": after,
        "gain_points": 100 * (after["accuracy"] - before["accuracy"]),
        "sft_wall_s": t_sft,
        "rl_wall_s": rl_summary["wall_s"],
        "wall_s": wall,
        "plot": str(plot),
        "run_dir": str(out),
        "rl_model": str(policy),
    }
    atomic_write_json(out / "summary.json", summary)
    print_table(
        f"posttrain demo: {cfg.model.name} preset, arithmetic, SFT {sft_summary['steps']} steps -> RL ({objective}) {rl_steps} steps",
        ["held-out (greedy pass@1)", "after SFT", "after RL"],
        [
            ["accuracy", before["accuracy"], after["accuracy"]],
            ["reward mean", before["reward_mean"], after["reward_mean"]],
            ["completion length", before["length_mean"], after["length_mean"]],
        ],
    )
    print(
        f"CPU kernels {summary['cpu_capability']} (figures per kernel level: docs/demo.md); "
        f"wall {wall:.0f} s (SFT {t_sft:.0f} s, RL {rl_summary['wall_s']:.0f} s); curves: {plot}; "
        f"summary: {out / 'summary.json'}; metrics: {out / 'rl' / 'metrics.jsonl'}; RL policy: {policy}"
    )
    return summary
