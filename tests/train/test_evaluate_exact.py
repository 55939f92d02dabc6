"""Held-out evaluation against a scripted model whose outputs are known exactly.

The model is a real `transformers` causal LM (the tiny preset's class) whose next-token logits are
replaced by a script, so evaluation runs through the real engine (`HFEngine`, KV-cache `generate`),
the real prompt formatter and the task's own reward. For example i, the j-th copy of its prompt in a
generate call (j = 0 for greedy decoding, j = 0..n-1 for the n samples of pass@k) answers correctly
iff j is in CORRECT[i]; otherwise it answers "x". Every script row is one-hot, so sampling at any
temperature reproduces the script. The expected figures below are worked out by hand from CORRECT.
"""

from __future__ import annotations

import warnings
from math import comb

import pytest
import torch

from posttrain.models import load_model_and_tokenizer
from posttrain.tasks import get_task
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

#: which copies (by index within their group) of each held-out example answer correctly; n = 4 samples
CORRECT = [{0, 1, 2, 3}, {0}, {1, 3}, set()]
N_SAMPLES, K = 4, 2
WRONG = "x"


def _scripted_lm(tok, heldout):
    """A tiny-preset LM whose generation follows CORRECT (see the module docstring)."""
    base, _ = load_model_and_tokenizer("tiny", seed=0)
    prompts = {tuple(tok.encode(ex.prompt, add_special_tokens=False)): i for i, ex in enumerate(heldout)}
    assert len(prompts) == len(heldout), "held-out prompts must be distinct for the script"
    eos = tok.eos_token_id

    def target(i: int, j: int) -> list[int]:
        text = heldout[i].answer if j in CORRECT[i] else WRONG
        return [*tok.encode(text, add_special_tokens=False), eos]

    class ScriptedLM(type(base)):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            before = cache.get_seq_length() if cache is not None else 0  # positions already processed
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            if before == 0:  # prefill: a new batch of (left-padded) prompts
                mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
                rows, seen = [], {}
                for ids, m in zip(input_ids.tolist(), mask.tolist(), strict=True):
                    key = tuple(t for t, keep in zip(ids, m, strict=True) if keep)
                    j = seen.get(key, 0)
                    seen[key] = j + 1
                    rows.append(target(prompts[key], j))
                self._script, self._prompt_width = rows, input_ids.shape[1]
            self._done = before + input_ids.shape[1] - self._prompt_width  # tokens generated so far
            logits = torch.full_like(out.logits, -1e4)
            for r, script in enumerate(self._script):
                logits[r, -1, script[min(self._done, len(script) - 1)]] = 0.0
            out["logits"] = logits
            return out

    model = ScriptedLM(base.config)
    model.load_state_dict(base.state_dict())
    return model


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    cfg = load_rl_config(
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            'task.params={digits: 1, ops: "+", n_train: 8, n_heldout: 4}',
            "reward.num_workers=0",
            "rollout.max_new_tokens=4",
            f"eval.n={len(CORRECT)}",
            f"eval.k={K}",
            f"eval.samples={N_SAMPLES}",
            "eval.temperature=1.0",
            f"out_dir={tmp_path_factory.mktemp('eval') / 'run'}",
        ],
    )
    _, tok = load_model_and_tokenizer("tiny", seed=0)
    heldout = get_task(cfg.task.name, **cfg.task.params).split("heldout")[: len(CORRECT)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        tr = RLTrainer(cfg, _scripted_lm(tok, heldout), tok)
        try:
            return tr.evaluate(), heldout
        finally:
            tr.close()


def test_greedy_accuracy_reward_and_lengths_are_the_scripted_ones(evaluated):
    """Greedy = copy 0: examples 0 and 1 right, 2 and 3 wrong -> accuracy 0.5. Mutant tried:
    accuracy from the sampled completions (7/16) -> fails."""
    out, heldout = evaluated
    assert out["n"] == 4
    assert out["accuracy"] == 0.5 and out["reward_mean"] == 0.5
    # lengths in tokens, EOS included: the answer or "x", then EOS; nothing hit max_new_tokens
    lengths = [len(heldout[i].answer) + 1 if 0 in CORRECT[i] else len(WRONG) + 1 for i in range(4)]
    assert out["length_mean"] == pytest.approx(sum(lengths) / 4)
    assert out["truncated"] == 0.0
    assert [s["completion"] for s in out["samples"]] == [heldout[0].answer, heldout[1].answer, WRONG, WRONG]


def test_pass_at_k_is_the_unbiased_estimator_per_example_then_the_mean(evaluated):
    """pass@2 from 4 samples with c = 4, 1, 2, 0 correct: 1 - C(n-c, k)/C(n, k) per example = 1, 1/2,
    5/6, 0 -> mean 7/12. Mutants tried: the biased 1 - (1 - c/n)^k (mean 0.546875); pooling all 16
    samples into one problem (1 - C(9,2)/C(16,2) = 0.7); counting every correct sample into group 0
    (group ids ignored)."""
    out, _ = evaluated
    n, k = N_SAMPLES, K
    per_example = [1 - comb(n - len(c), k) / comb(n, k) for c in CORRECT]
    assert per_example == pytest.approx([1.0, 0.5, 5 / 6, 0.0])
    assert out[f"pass@{k}"] == pytest.approx(sum(per_example) / len(per_example)) == pytest.approx(7 / 12)
    assert out["sampled_accuracy"] == pytest.approx(7 / 16)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_posttrain_eval_generates_in_the_runs_precision(precision, monkeypatch):
    """`posttrain eval` (evaluate_run) builds its runner as the trainer's evaluation does
    (config_eval_runner): the run's model.precision reaches the engine. Before, it dropped the precision,
    so a bf16 run was evaluated in fp32, unlike its own in-run evaluations."""
    import posttrain.train.evaluate as ev
    from posttrain.rollout.spec import RolloutSpec

    seen = []
    real = RolloutSpec.build

    def spy(self, *args, **kwargs):
        seen.append(self.precision)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RolloutSpec, "build", spy)
    loc = ev.locate_model("tiny")
    cfg = ev.evaluate_cli_settings(loc, None, [f"model.precision={precision}"], n=2, max_new_tokens=2)
    res = ev.evaluate_run(loc, cfg)
    assert seen == [precision]
    assert res["settings"]["precision"] == precision
