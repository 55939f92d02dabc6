"""``posttrain demo tools``: does a calculator help the real model, untrained, after a tool-use warm
start, and after RL with the tool? (issue 43 item 4)

The task is ``src/posttrain/configs/tool-calling.yaml``'s: word problems with 3-4 digit numbers
(``word_problems``, 2 operations, ``max_value`` 9999), one scored answer per episode (environment
``answer``, reward ``last_number``), tools through the multi-turn runner. Arms, all greedy on the same
held-out problems:

1. ``no_tool``: the model alone (runner without tools);
2. ``tool_untrained``: the calculator described in the system message (SmolLM2-135M's template has no
   tool support: posttrain's ``fallback`` format), the model as shipped;
3. ``tool_sft``: after an SFT warm start on scripted tool-use conversations of the train problems
   (call ``calculator`` with the problem's expression, answer with the number the tool returned),
   rendered exactly as the runner renders a tool episode; the SFT loss is on the agent's turns only;
4. ``tool_rl``: RL (GRPO on the answer's reward, tools in the loop) from the warm start.

Each arm's held-out accuracy, the share of episodes that call the tool, the share of valid calls and
the calls per episode; paired differences over problems (``tool_untrained - no_tool``,
``tool_sft - no_tool``, ``tool_rl - tool_sft``) with their SE, ``sd(d)/sqrt(n)``. With ``--seeds S``
the trained arms run for S seeds (each its own warm start and RL run under ``seed<N>/``); the pooled
difference averages each problem's verdicts over seeds (SE over problems) and ``se_seeds`` is the
spread of the seeds' own differences. RL samples at T = 1.3 (``DEMO_TEMPERATURE``). Resumable: every
arm's evaluation is written to ``<arm>.json`` as it finishes (``seed<N>/<arm>.json`` for the trained
arms), the warm start to ``seed<N>/sft/model``, RL is checkpointed; ``--resume`` keeps what is finished.
"""

from __future__ import annotations

import json
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import atomic_write_json, read_jsonl
from posttrain.utils.stats import paired_gain, se_binomial

ARMS = ("no_tool", "tool_untrained", "tool_sft", "tool_rl")
PAIRS = (
    ("tool_untrained", "no_tool"),
    ("tool_sft", "no_tool"),
    ("tool_rl", "tool_sft"),
    ("tool_rl", "no_tool"),
)
# the demo's sampling temperature for RL (tool-calling.yaml keeps 1.0): measured on SmolLM2-135M after
# the warm start, T = 1.0 gave no group with mixed rewards in the first 2 steps (no gradient), T = 1.3
# gave 22 % mixed groups over 12 steps (docs/tools.md)
DEMO_TEMPERATURE = 1.3


def tool_transcript(example: Any, schemas: list[dict[str, Any]], tool: str = "calculator") -> dict[str, Any]:
    """A scripted tool-use conversation for ``example`` (``meta["expression"]`` gives its answer) in
    the runner's ``fallback`` rendering with ``system: false``: the tools in the system message, the
    question, a call, the result as a ``<tool_response>`` user turn, the answer."""
    from posttrain.tools.calls import fallback_instructions, fallback_results

    expr = example.meta.get("expression") if example.meta else None
    if not expr:
        raise InvalidValueError(f"demo tools: example {example.id!r} has no meta['expression']")
    call = json.dumps({"name": tool, "arguments": {"expression": expr}})
    return {
        "messages": [
            {"role": "system", "content": fallback_instructions(schemas)},
            {"role": "user", "content": str(example.prompt)},
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "user", "content": fallback_results([example.answer])},
            {"role": "assistant", "content": example.answer},
        ]
    }


def _paired(after: list[float], before: list[float]) -> dict[str, float]:
    g = paired_gain(before, after)
    return {
        "diff": g["gain"],
        "se": g["se"],
        "gain_over_se": g["gain"] / g["se"] if g["se"] > 0 else 0.0,
        "n": len(after),
    }


def evaluate_arm(model: Any, tok: Any, cfg: Any, examples: list[Any], *, tools: bool) -> dict[str, Any]:
    """Greedy episodes of ``examples`` through the config's runner (with or without its tools)."""
    from posttrain.rollout import PromptFormatter, SamplingParams
    from posttrain.train.evaluate import config_eval_runner

    params = dict(cfg.rollout.runner.params)
    if not tools:
        params["tools"] = []
    formatter = PromptFormatter(tok, chat=cfg.task.chat_template)
    runner = config_eval_runner(cfg, model, tok, formatter, runner_params=params)
    t0 = time.perf_counter()
    eps = runner.run(
        examples,
        [1] * len(examples),
        SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens, logprobs=False),
    )
    correct = [float(r >= 1.0) for r in eps.rewards.tolist()]
    st = eps.row_stats
    calls = st["tool_calls"].tolist() if "tool_calls" in st else [0.0] * len(examples)
    valid = st["tool_valid_calls"].tolist() if "tool_valid_calls" in st else [0.0] * len(examples)
    n = len(examples)
    return {
        "n": n,
        "accuracy": sum(correct) / n,
        "accuracy_se": se_binomial(sum(correct) / n, n),
        "tool_call_rate": sum(c > 0 for c in calls) / n,
        "tool_valid_rate": sum(valid) / max(sum(calls), 1.0),
        "tool_calls_mean": sum(calls) / n,
        "correct": correct,
        "ids": [e.id for e in examples],
        "transcripts": [s.transcript() for s in runner.last_sessions[:3]],
        "wall_s": time.perf_counter() - t0,
    }


def _pooled(
    pairs_by_seed: dict[int, dict[str, Any]], per_seed: dict[int, dict[str, Any]], shared: dict[str, Any]
) -> dict[str, Any]:
    """Each pair over all seeds: the per-problem difference averaged over seeds, paired over problems
    (``se``: problem-level), and the spread of the seeds' own differences (``se_seeds``, sd/sqrt(S))."""
    seeds = sorted(per_seed)
    out: dict[str, Any] = {}
    for a, b in PAIRS:

        def verdicts(arm: str) -> list[float]:
            if arm in shared:
                return list(shared[arm]["correct"])
            rows = [per_seed[s][arm]["correct"] for s in seeds]
            return [sum(col) / len(col) for col in zip(*rows, strict=True)]

        key = f"{a}-{b}"
        pooled = _paired(verdicts(a), verdicts(b))
        diffs = [pairs_by_seed[s][key]["diff"] for s in seeds]
        m = sum(diffs) / len(diffs)
        sd = (sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5 if len(diffs) > 1 else 0.0
        out[key] = {
            **pooled,
            "by_seed": dict(zip([str(s) for s in seeds], diffs, strict=True)),
            "se_seeds": sd / len(diffs) ** 0.5,
            "seeds": len(diffs),
        }
    return out


def _arm_mean(per_seed: dict[int, dict[str, Any]], arm: str) -> dict[str, Any]:
    seeds = sorted(per_seed)
    rows = [per_seed[s][arm] for s in seeds]
    mean = {
        k: sum(r[k] for r in rows) / len(rows)
        for k in ("accuracy", "tool_call_rate", "tool_valid_rate", "tool_calls_mean", "wall_s")
    }
    n = rows[0]["n"]
    return {
        "n": n,
        **mean,
        "accuracy_se": se_binomial(mean["accuracy"], n * len(rows))
        if len(rows) > 1
        else rows[0]["accuracy_se"],
        "accuracy_by_seed": {str(s): r["accuracy"] for s, r in zip(seeds, rows, strict=True)},
        "model": [r["model"] for r in rows],
    }


def run_tools_demo(
    out_dir: str | Path = "runs/demo-tools",
    *,
    n_eval: int = 100,
    sft_steps: int = 40,
    sft_lr: float = 5e-5,
    rl_steps: int | None = None,
    seeds: int = 1,
    overrides: list[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    """The four arms; ``tool_sft`` and ``tool_rl`` for ``seeds`` training seeds (the config's ``seed``,
    ``seed + 1``, ...; each its own warm start and RL run under ``seed<N>/``), the untrained arms once
    (greedy, they do not depend on the seed)."""
    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.saving import save_model_dir
    from posttrain.tasks import get_task
    from posttrain.tools import get_tool
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import train_to_end
    from posttrain.train.run_dir import prepare_driver_dir
    from posttrain.train.sft import sft_warm_start
    from posttrain.utils.config import build_config
    from posttrain.utils.tables import print_table

    if seeds < 1:
        raise InvalidValueError(f"demo tools: seeds must be at least 1, got {seeds}")
    out = prepare_driver_dir(out_dir, "demo tools", resume=resume, overwrite=overwrite)
    extra = [f"steps={rl_steps}"] if rl_steps is not None else []
    cfg = build_config(
        RLConfig,
        str(files("posttrain") / "configs" / "tool-calling.yaml"),
        [f"rollout.temperature={DEMO_TEMPERATURE}", *extra, *(overrides or [])],
    )
    task = get_task(cfg.task.name, **cfg.task.params)
    heldout = task.split("heldout")[:n_eval]
    tools = [get_tool(t) for t in cfg.rollout.runner.params.get("tools") or []]
    if not tools:
        raise InvalidValueError("demo tools: the config names no tools (rollout.runner.params.tools)")
    if cfg.threads:  # the run's torch CPU threads, for the evaluations too
        import torch

        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()

    def arm(folder: Path, name: str, model_spec: str, with_tools: bool, seed: int) -> dict[str, Any]:
        path = folder / f"{name}.json"
        if path.is_file():
            print(f"[tools] {name}: kept from {path}", flush=True)
            return json.loads(path.read_text())
        model, tok = load_model_and_tokenizer(model_spec, dtype=cfg.model.dtype, device="cpu", seed=seed)
        print(f"[tools] {name}: {len(heldout)} held-out problems", flush=True)
        res = evaluate_arm(model, tok, cfg, heldout, tools=with_tools)
        res["model"] = model_spec
        atomic_write_json(path, res)
        print(
            f"[tools] {name}: accuracy {res['accuracy']:.3f}, tool_call_rate {res['tool_call_rate']:.2f}, "
            f"tool_valid_rate {res['tool_valid_rate']:.2f} ({res['wall_s']:.0f} s)",
            flush=True,
        )
        return res

    shared = {
        "no_tool": arm(out, "no_tool", cfg.model.name, False, cfg.seed),
        "tool_untrained": arm(out, "tool_untrained", cfg.model.name, True, cfg.seed),
    }
    per_seed: dict[int, dict[str, Any]] = {}
    gates: dict[int, dict[str, Any]] = {}
    for seed in range(cfg.seed, cfg.seed + seeds):
        sd = out / f"seed{seed}"
        sd.mkdir(exist_ok=True)
        # the warm start: scripted tool-use conversations of the train problems
        sft_model = sd / "sft" / "model"
        if not (sft_model / "config.json").is_file():
            n_rows = sft_steps * 8
            rows = [
                tool_transcript(e, [t.schema for t in tools], tools[0].name)
                for e in task.split("train")[:n_rows]
            ]
            model, tok = load_model_and_tokenizer(
                cfg.model.name, dtype=cfg.model.dtype, device="cpu", seed=seed
            )
            print(
                f"[tools] seed {seed}: SFT warm start, {len(rows)} scripted tool conversations, {sft_steps} steps",
                flush=True,
            )
            sft_warm_start(
                cfg,
                model,
                tok,
                steps=sft_steps,
                lr=sft_lr,
                seed=seed,
                out_dir=sd / "sft",
                progress=progress,
                rows=rows,
                batch_size=8,
                overwrite=True,
            )
            save_model_dir(model, tok, sft_model)
        res = {"tool_sft": arm(sd, "tool_sft", str(sft_model), True, seed)}

        rl_model = sd / "rl" / "model"
        if not (sd / "tool_rl.json").is_file():
            rcfg = cfg.model_copy(deep=True)
            rcfg.seed, rcfg.model.name, rcfg.out_dir = seed, str(sft_model), str(sd / "rl")
            rcfg.checkpoint.every = 4
            train_to_end(rcfg, progress=progress, label=f"[tools] seed {seed}")
        res["tool_rl"] = arm(sd, "tool_rl", str(rl_model), True, seed)
        per_seed[seed] = res

        # the RL gate: groups whose answers differ in reward are the only ones with a gradient
        steps = [r for r in read_jsonl(sd / "rl" / "metrics.jsonl") if r.get("kind") == "step"]
        gates[seed] = {
            "steps": len(steps),
            "mixed_groups_mean": sum(1.0 - r["zero_var_frac"] for r in steps) / max(len(steps), 1),
            "steps_without_gradient": sum(r["zero_var_frac"] >= 1.0 for r in steps),
            "temperature": cfg.rollout.temperature,
        }
        g = gates[seed]
        print(
            f"[tools] seed {seed}: RL gate: {100 * g['mixed_groups_mean']:.0f} % of groups had mixed "
            f"rewards on average ({g['steps_without_gradient']} of {g['steps']} steps without any), "
            f"T = {g['temperature']}",
            flush=True,
        )

    def both(s: int) -> dict[str, Any]:
        return {**shared, **per_seed[s]}

    pairs_by_seed = {
        s: {f"{a}-{b}": _paired(both(s)[a]["correct"], both(s)[b]["correct"]) for a, b in PAIRS}
        for s in per_seed
    }
    pairs = _pooled(pairs_by_seed, per_seed, shared)
    arms = {
        k: {x: v for x, v in shared[k].items() if x not in ("correct", "ids", "transcripts")} for k in shared
    }
    arms.update({k: _arm_mean(per_seed, k) for k in ("tool_sft", "tool_rl")})
    summary = {
        "model": cfg.model.name,
        "task": {"name": cfg.task.name, **task.params()},
        "tools": [t.name for t in tools],
        "sft": {"steps": sft_steps, "lr": sft_lr, "rows": sft_steps * 8},
        "rl_steps": cfg.steps,
        "seeds": sorted(per_seed),
        "rl_gate": {
            "by_seed": {str(s): g for s, g in gates.items()},
            "mixed_groups_mean": sum(g["mixed_groups_mean"] for g in gates.values()) / len(gates),
            "steps_without_gradient": sum(g["steps_without_gradient"] for g in gates.values()),
            "steps": sum(g["steps"] for g in gates.values()),
            "temperature": cfg.rollout.temperature,
        },
        "arms": arms,
        "paired": pairs,
        "paired_by_seed": {str(s): p for s, p in pairs_by_seed.items()},
        "wall_s_this_call": time.perf_counter() - t0,
        "run_dir": str(out),
    }
    atomic_write_json(out / "summary.json", summary)
    ns = len(per_seed)
    print_table(
        f"posttrain demo tools: {cfg.model.name}, word problems (2 steps, numbers up to 9999), greedy, "
        f"n={len(heldout)}" + (f", trained arms: mean over {ns} seeds" if ns > 1 else ""),
        ["arm", "accuracy", "SE", "tool_call_rate", "tool_valid_rate", "calls/episode"],
        [
            [
                k,
                arms[k]["accuracy"],
                arms[k]["accuracy_se"],
                arms[k]["tool_call_rate"],
                arms[k]["tool_valid_rate"],
                arms[k]["tool_calls_mean"],
            ]
            for k in ARMS
        ],
    )
    print_table(
        "paired differences over problems"
        + (
            " (verdicts averaged over seeds; SE seeds: sd/sqrt(S) of the seeds' differences)"
            if ns > 1
            else ""
        ),
        ["pair", "diff", "SE", "diff/SE", "SE seeds", "n"],
        [[k, v["diff"], v["se"], v["gain_over_se"], v["se_seeds"], v["n"]] for k, v in pairs.items()],
    )
    return summary
