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
``tool_sft - no_tool``, ``tool_rl - tool_sft``) with their SE, ``sd(d)/sqrt(n)``. Resumable: every arm's
evaluation is written to ``<arm>.json`` as it finishes, the warm start to ``sft/model``, RL is
checkpointed; ``--resume`` keeps what is finished.
"""

from __future__ import annotations

import json
import shutil
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError, option
from posttrain.utils.io import atomic_write_json
from posttrain.utils.stats import se_binomial
from posttrain_lab.demos.smol import paired_gain

ARMS = ("no_tool", "tool_untrained", "tool_sft", "tool_rl")
PAIRS = (
    ("tool_untrained", "no_tool"),
    ("tool_sft", "no_tool"),
    ("tool_rl", "tool_sft"),
    ("tool_rl", "no_tool"),
)


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
    from posttrain.train.evaluate import eval_runner

    params = dict(cfg.rollout.runner.params)
    if not tools:
        params["tools"] = []
    formatter = PromptFormatter(tok, chat=cfg.task.chat_template)
    runner = eval_runner(
        model,
        tok,
        formatter,
        max_batch_size=cfg.rollout.max_batch_size or 16,
        engine=cfg.rollout.engine.name,
        engine_params=cfg.rollout.engine.params,
        runner=cfg.rollout.runner.name,
        runner_params=params,
        precision=cfg.model.precision,
    )
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


def run_tools_demo(
    out_dir: str | Path = "runs/demo-tools",
    *,
    n_eval: int = 100,
    sft_steps: int = 40,
    sft_lr: float = 5e-5,
    rl_steps: int | None = None,
    overrides: list[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.saving import save_model_dir
    from posttrain.tasks import get_task
    from posttrain.tools import get_tool
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer
    from posttrain.train.run_dir import LOCK_NAME, RunDirError
    from posttrain.train.sft import sft_warm_start
    from posttrain.utils.config import build_config
    from posttrain.utils.tables import print_table

    out = Path(out_dir)
    if resume and overwrite:
        raise RunDirError(f"{option('resume')} and {option('overwrite')} exclude each other")
    held = [p for p in out.iterdir() if p.name != LOCK_NAME] if out.is_dir() else []  # the CLI's lock
    if held:
        if overwrite:
            for p in held:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        elif not resume:
            raise RunDirError(
                f"{out} already holds a demo tools; continue it with {option('resume')}, start again with "
                f"{option('overwrite')}, or choose another out_dir"
            )
    out.mkdir(parents=True, exist_ok=True)
    extra = [f"steps={rl_steps}"] if rl_steps is not None else []
    cfg = build_config(
        RLConfig, str(files("posttrain") / "configs" / "tool-calling.yaml"), [*extra, *(overrides or [])]
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
    results: dict[str, Any] = {}

    def arm(name: str, model_spec: str, with_tools: bool) -> None:
        path = out / f"{name}.json"
        if path.is_file():
            results[name] = json.loads(path.read_text())
            print(f"[tools] {name}: kept from {path}", flush=True)
            return
        model, tok = load_model_and_tokenizer(model_spec, dtype=cfg.model.dtype, device="cpu", seed=cfg.seed)
        print(f"[tools] {name}: {len(heldout)} held-out problems", flush=True)
        res = evaluate_arm(model, tok, cfg, heldout, tools=with_tools)
        res["model"] = model_spec
        atomic_write_json(path, res)
        results[name] = res
        print(
            f"[tools] {name}: accuracy {res['accuracy']:.3f}, tool_call_rate {res['tool_call_rate']:.2f}, "
            f"tool_valid_rate {res['tool_valid_rate']:.2f} ({res['wall_s']:.0f} s)",
            flush=True,
        )

    arm("no_tool", cfg.model.name, False)
    arm("tool_untrained", cfg.model.name, True)

    # the warm start: scripted tool-use conversations of the train problems
    sft_model = out / "sft" / "model"
    if not (sft_model / "config.json").is_file():
        n_rows = sft_steps * 8
        rows = [
            tool_transcript(e, [t.schema for t in tools], tools[0].name) for e in task.split("train")[:n_rows]
        ]
        model, tok = load_model_and_tokenizer(
            cfg.model.name, dtype=cfg.model.dtype, device="cpu", seed=cfg.seed
        )
        print(
            f"[tools] SFT warm start: {len(rows)} scripted tool conversations, {sft_steps} steps", flush=True
        )
        sft_warm_start(
            cfg,
            model,
            tok,
            steps=sft_steps,
            lr=sft_lr,
            seed=cfg.seed,
            out_dir=out / "sft",
            progress=progress,
            rows=rows,
            batch_size=8,
            overwrite=True,
        )
        save_model_dir(model, tok, sft_model)
    arm("tool_sft", str(sft_model), True)

    rl_model = out / "rl" / "model"
    if not (out / "tool_rl.json").is_file():
        rcfg = cfg.model_copy(deep=True)
        rcfg.model.name, rcfg.out_dir = str(sft_model), str(out / "rl")
        rcfg.eval.at_start = rcfg.eval.at_end = False
        rcfg.checkpoint.every, rcfg.checkpoint.keep, rcfg.checkpoint.final = 4, 1, True
        has_ckpt = (out / "rl" / "checkpoints" / "latest").is_file()
        print(
            f"[tools] RL {rcfg.steps} steps from the warm start" + (" (resumed)" if has_ckpt else ""),
            flush=True,
        )
        trainer = RLTrainer(rcfg, resume=True) if has_ckpt else RLTrainer(rcfg)
        with trainer:
            trainer.train(progress=progress)
            save_model_dir(trainer.model, trainer.tokenizer, rl_model)
    arm("tool_rl", str(rl_model), True)

    # the RL gate: groups whose answers differ in reward are the only ones with a gradient
    steps = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in steps if r.get("kind") == "step"]
    gate = {
        "steps": len(steps),
        "mixed_groups_mean": sum(1.0 - r["zero_var_frac"] for r in steps) / max(len(steps), 1),
        "steps_without_gradient": sum(r["zero_var_frac"] >= 1.0 for r in steps),
        "temperature": cfg.rollout.temperature,
    }
    print(
        f"[tools] RL gate: {100 * gate['mixed_groups_mean']:.0f} % of groups had mixed rewards on average "
        f"({gate['steps_without_gradient']} of {gate['steps']} steps without any), T = {gate['temperature']}",
        flush=True,
    )
    pairs = {f"{a}-{b}": _paired(results[a]["correct"], results[b]["correct"]) for a, b in PAIRS}
    summary = {
        "model": cfg.model.name,
        "task": {"name": cfg.task.name, **task.params()},
        "tools": [t.name for t in tools],
        "sft": {"steps": sft_steps, "lr": sft_lr, "rows": sft_steps * 8},
        "rl_steps": cfg.steps,
        "rl_gate": gate,
        "arms": {
            k: {x: v for x, v in results[k].items() if x not in ("correct", "ids", "transcripts")}
            for k in ARMS
        },
        "paired": pairs,
        "wall_s_this_call": time.perf_counter() - t0,
        "run_dir": str(out),
    }
    atomic_write_json(out / "summary.json", summary)
    print_table(
        f"posttrain demo tools: {cfg.model.name}, word problems (2 steps, numbers up to 9999), greedy, "
        f"n={len(heldout)}",
        ["arm", "accuracy", "SE", "tool_call_rate", "tool_valid_rate", "calls/episode"],
        [
            [
                k,
                results[k]["accuracy"],
                results[k]["accuracy_se"],
                results[k]["tool_call_rate"],
                results[k]["tool_valid_rate"],
                results[k]["tool_calls_mean"],
            ]
            for k in ARMS
        ],
    )
    print_table(
        "paired differences over problems",
        ["pair", "diff", "SE", "diff/SE", "n"],
        [[k, v["diff"], v["se"], v["gain_over_se"], v["n"]] for k, v in pairs.items()],
    )
    return summary
