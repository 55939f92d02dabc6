"""DuCA vs GRPO on the ``sales`` simulator, end to end on the tiny preset.

1. **Warm start**: a noisy scripted seller (:class:`NoisySeller`: the rule-based
   :class:`~posttrain_lab.recipes.duca.sales.ScriptedSeller` that, at random, says it is an AI, repeats a stock
   sentence or makes a forbidden claim) plays the training scenarios through the SAME multi-turn
   runner and rendering as RL (:class:`TeacherEngine`); the policy is fine-tuned on its turns only
   (negative log-likelihood over ``action_mask``).
2. **RL** from that checkpoint with ``lab/posttrain_lab/recipes/duca/duca-sales.yaml``, three variants with the
   same seed, scenarios and step budget: ``duca`` (HIAN, proposed design), ``grpo`` on summed rewards
   (session + every turn criterion), ``grpo`` on the session reward only.
3. **Evaluation** on held-out scenarios (greedy): conversion, repetition, AI-disclosure and
   forbidden-claim rates, average turns; ``results.json``, ``table.md``, ``compare.png`` and
   ``transcripts.jsonl`` in the output folder.

Run: ``python -m posttrain_lab.recipes.duca.demo --out runs/duca-compare`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from posttrain.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from posttrain.rollout.episodes import Episodes, PromptFormatter
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.duca.sales import ScriptedSeller

CONFIG = Path(__file__).resolve().parent / "duca-sales.yaml"
VARIANTS: dict[str, list[str]] = {
    "duca": [],
    "grpo_sum": [
        "advantage.name=grpo",
        "advantage.params={}",
        "rollout.runner.params.reward=sum",
        "rollout.runner.params.turn_inputs=false",
    ],
    "grpo_session": ["advantage.name=grpo", "advantage.params={}", "rollout.runner.params.turn_inputs=false"],
}
METRICS = (
    "conversion_rate",
    "repetition_rate",
    "ai_disclosure_rate",
    "ai_disclosure_session_rate",
    "forbidden_claim_rate",
    "format_rate",
    "avg_turns",
)


class NoisySeller(ScriptedSeller):
    """:class:`ScriptedSeller` with the failure modes DuCA's turn rewards target: with probability
    ``p_disclose`` the turn starts "As an AI, ", with ``p_repeat`` it starts with a stock sentence
    (a repetition from its second use on), with ``p_claim`` it ends with a forbidden guarantee, with
    ``p_format`` it ends by writing the customer's next line itself (" Customer: ok?", a role marker:
    a ``format`` violation). ``p_format`` is 0 by default and then draws nothing, so the demo's
    conversations are those of before it existed."""

    FORMAT_NOISE = " Customer: ok?"

    def __init__(
        self,
        *,
        p_disclose: float = 0.25,
        p_repeat: float = 0.35,
        p_claim: float = 0.2,
        p_format: float = 0.0,
        seed: int = 0,
    ):
        self.p = (p_disclose, p_repeat, p_claim)
        self.p_format = p_format
        self.rng = random.Random(seed)

    def reply(self, observations: list[str]) -> str:
        text = super().reply(observations)
        p_disclose, p_repeat, p_claim = self.p
        if self.rng.random() < p_repeat:
            text = "Happy to help. " + text
        if self.rng.random() < p_disclose:
            text = "As an AI, " + text[0].lower() + text[1:]
        if self.rng.random() < p_claim:
            text += " Guaranteed!"
        if self.p_format > 0 and self.rng.random() < self.p_format:
            text += self.FORMAT_NOISE
        return text


class TeacherEngine(RolloutEngine):
    """An engine whose "samples" are a seller's replies: it reads the customer's lines back from each
    context (rendered with the runner's plain ``user_turn``) and returns the seller's turn + EOS."""

    def __init__(self, tokenizer: Any, seller: ScriptedSeller, *, user_turn: str) -> None:
        self.tok, self.seller = tokenizer, seller
        self.marker = user_turn.split("{observation}")[0].lstrip("\n")
        if not self.marker:
            raise InvalidValueError("TeacherEngine: user_turn must put a marker before '{observation}'")

    @property
    def pad_token_id(self) -> int:
        return int(self.tok.pad_token_id)

    def generate(
        self, prompt_ids: list[list[int]], n_per_prompt: list[int], params: SamplingParams
    ) -> RolloutBatch:
        comps, reasons, groups, prompts = [], [], [], []
        for g, (p, n) in enumerate(zip(prompt_ids, n_per_prompt, strict=True)):
            text = self.tok.decode(p, skip_special_tokens=True)
            obs = [ln[len(self.marker) :].strip() for ln in text.split("\n") if ln.startswith(self.marker)]
            for _ in range(n):
                ids = [
                    *self.tok.encode(self.seller.reply(obs), add_special_tokens=False),
                    self.tok.eos_token_id,
                ]
                comps.append(ids[: params.max_new_tokens])
                reasons.append("length" if len(ids) > params.max_new_tokens else "stop")
                groups.append(g)
                prompts.append(p)
        return RolloutBatch.from_token_lists(
            prompts,
            comps,
            pad_token_id=self.pad_token_id,
            group_ids=groups,
            finish_reasons=reasons,
            logprobs=[[0.0] * len(c) for c in comps],
        )


def teacher_episodes(
    tokenizer: Any,
    examples: list[Any],
    runner_params: dict[str, Any],
    *,
    max_new_tokens: int,
    seed: int,
    p_format: float = 0.0,
) -> Episodes:
    """The teacher's conversations on ``examples`` (one each), tokenised exactly as RL renders them;
    ``p_format``: :class:`NoisySeller`'s format-noise probability."""
    params = dict(runner_params)
    params.pop("transcripts", None)
    engine = TeacherEngine(
        tokenizer, NoisySeller(seed=seed, p_format=p_format), user_turn=params["user_turn"]
    )
    runner = MultiTurnRunner(engine, PromptFormatter(tokenizer), seed=seed, **params)
    return runner.run(
        examples, [1] * len(examples), SamplingParams(max_new_tokens=max_new_tokens, logprobs=False)
    )


def sft_on_episodes(
    model: Any, episodes: Episodes, *, steps: int, batch_size: int, lr: float, seed: int
) -> list[float]:
    """Token-mean NLL of the policy turns (``action_mask``) of ``episodes``; returns the losses."""
    from posttrain.models import sequence_logprobs

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    ids, attn, act = episodes.batch.model_inputs()
    losses = []
    model.train()
    for _ in range(steps):
        rows = torch.randperm(len(episodes), generator=gen)[:batch_size]
        lp, _ = sequence_logprobs(model, ids[rows], attn[rows], response_mask=act[rows])
        m = act[rows].float()
        loss = -(lp * m).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def _row(ev: dict[str, Any]) -> dict[str, float]:
    return {k: float(ev[k]) for k in METRICS}


def compare(
    out: Path,
    *,
    sft_steps: int = 300,
    sft_batch: int = 16,
    rl_steps: int = 20,
    n_heldout: int = 40,
    seed: int = 0,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Warm start, then the three RL variants with the same seed and budget; writes the artefacts."""
    import yaml

    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.saving import save_model_dir
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import RLTrainer

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base = [
        f"seed={seed}",
        f"steps={rl_steps}",
        f"eval.n={n_heldout}",
        "logging.progress=false",
        *(overrides or []),
    ]
    cfg0 = load_rl_config(str(CONFIG), [*base, f"out_dir={out / 'sft'}"])
    if cfg0.threads:
        torch.set_num_threads(cfg0.threads)
    torch.manual_seed(seed)
    model, tok = load_model_and_tokenizer(cfg0.model.name, device="cpu", seed=seed)
    from posttrain_lab.recipes.duca.sales import SalesTask

    task = SalesTask(**cfg0.task.params)
    runner_params = {k: v for k, v in cfg0.rollout.runner.params.items()}
    max_new = cfg0.rollout.max_new_tokens
    eps = teacher_episodes(tok, task.split("train"), runner_params, max_new_tokens=max_new, seed=seed)
    print(f"[duca-demo] warm start: {len(eps)} teacher conversations, {sft_steps} SFT steps", flush=True)
    losses = sft_on_episodes(model, eps, steps=sft_steps, batch_size=sft_batch, lr=1e-3, seed=seed)
    if losses:
        print(f"[duca-demo] SFT loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    # the warm start, reusable as `posttrain rl --config duca-sales.yaml model.name=<out>/sft/model`
    save_model_dir(model, tok, out / "sft" / "model")
    teacher = MultiTurnRunner(
        TeacherEngine(tok, NoisySeller(seed=seed + 1), user_turn=runner_params["user_turn"]),
        PromptFormatter(tok),
        seed=1234,
        **{k: v for k, v in runner_params.items() if k != "transcripts"},
    )
    t_eps = teacher.run(
        task.split("heldout")[:n_heldout], [1] * n_heldout, SamplingParams(max_new_tokens=max_new)
    )
    results: dict[str, Any] = {
        "seed": seed,
        "sft_steps": sft_steps,
        "sft_batch": sft_batch,
        "rl_steps": rl_steps,
        "n_heldout": n_heldout,
        "sft_loss_first_last": [losses[0], losses[-1]] if losses else None,
        "teacher": _row(teacher.eval_metrics(t_eps)),
        "config": yaml.safe_load(CONFIG.read_text()),
        "overrides": base,
        "variants": {},
    }
    transcripts = []
    for j, (name, extra) in enumerate(VARIANTS.items()):
        # every variant starts from the same warm start: evaluate it once (with the first variant)
        at_start = [] if j == 0 else ["eval.at_start=false"]
        cfg = load_rl_config(str(CONFIG), [*base, *extra, *at_start, f"out_dir={out / name}"])
        print(f"[duca-demo] RL {name}: {rl_steps} steps", flush=True)
        trainer = RLTrainer(cfg, copy.deepcopy(model), tok)
        summary = trainer.train(progress=False)
        rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if r["kind"] == "eval"]
        results["variants"][name] = {
            "start": _row(evals[0]) if j == 0 else results["variants"]["duca"]["start"],
            "end": _row(evals[-1]),
            "wall_s": summary.get("wall_s"),
        }
        for t in evals[-1].get("transcripts", []):
            transcripts.append({"variant": name, **t})
    results["wall_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(results, indent=2))
    with (out / "transcripts.jsonl").open("w") as f:
        for t in transcripts:
            f.write(json.dumps(t) + "\n")
    (out / "table.md").write_text(table(results))
    plot(results, out / "compare.png")
    return results


def _rel(a: float, b: float) -> str:
    return "n/a" if b == 0 else f"{100 * (a - b) / b:+.0f} %"


def table(results: dict[str, Any]) -> str:
    """A markdown table of the held-out metrics (warm start, each variant after RL) and DuCA's relative
    change against each GRPO baseline."""
    cols = METRICS
    head = "| policy | " + " | ".join(cols) + " |\n" + "|---" * (len(cols) + 1) + "|\n"
    lines = [head]
    lines.append("| noisy teacher | " + " | ".join(f"{results['teacher'][c]:.3f}" for c in cols) + " |\n")
    start = results["variants"]["duca"]["start"]
    lines.append("| warm start (SFT) | " + " | ".join(f"{start[c]:.3f}" for c in cols) + " |\n")
    for name, v in results["variants"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v['end'][c]:.3f}" for c in cols) + " |\n")
    d = results["variants"]["duca"]["end"]
    for base in ("grpo_sum", "grpo_session"):
        b = results["variants"][base]["end"]
        lines.append(f"| duca vs {base} | " + " | ".join(_rel(d[c], b[c]) for c in cols) + " |\n")
    return "".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("conversion_rate", "repetition_rate", "ai_disclosure_rate", "forbidden_claim_rate")
    bars = {"warm start": results["variants"]["duca"]["start"]}
    bars.update({n: v["end"] for n, v in results["variants"].items()})
    fig, ax = plt.subplots(figsize=(8, 3.6))
    w = 0.8 / len(bars)
    for j, (name, row) in enumerate(bars.items()):
        ax.bar([i + j * w for i in range(len(keys))], [row[k] for k in keys], w, label=name)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(keys))], [k.replace("_rate", "") for k in keys])
    ax.set_ylabel("held-out rate (greedy)")
    ax.set_title(f"sales simulator, tiny preset: {results['rl_steps']} RL steps, seed {results['seed']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/duca-compare")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--sft-batch", type=int, default=16)
    ap.add_argument("--rl-steps", type=int, default=20)
    ap.add_argument("--n-heldout", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a smoke run (few steps, few scenarios)")
    ap.add_argument("overrides", nargs="*", help="RL config overrides, key=value")
    a = ap.parse_args(argv)
    if a.quick:
        a.sft_steps, a.sft_batch, a.rl_steps, a.n_heldout = 5, 4, 1, 4
        a.overrides = [
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.runner.params.env_params={max_turns: 2}",
            *a.overrides,
        ]
    res = compare(
        Path(a.out),
        sft_steps=a.sft_steps,
        sft_batch=a.sft_batch,
        rl_steps=a.rl_steps,
        n_heldout=a.n_heldout,
        seed=a.seed,
        overrides=a.overrides,
    )
    print(table(res))


if __name__ == "__main__":
    main()
