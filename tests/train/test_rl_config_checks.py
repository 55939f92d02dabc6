"""Fixes from an independent audit of the RLVR methods (each test fails on the code before the fix):
ASRR's No-Thinking prefix in the assistant turn, top-p with rollout log-probs, the single-update
warning, DAPO's overlong limit and recipe values, REINFORCE++ against verl's token-level whitening."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from posttrain.algos import get_advantage, policy_loss_defaults
from posttrain.rollout import PromptFormatter
from posttrain.rollout.episodes import continue_thinking_ratio
from posttrain.train.config import SingleUpdateWarning, load_rl_config
from posttrain.utils.config import load_yaml
from posttrain_lab.recipes.asrr.hooks import NO_THINKING_PREFIX

TINY = ["model.name=tiny", "model.device=cpu", "reward.num_workers=0"]

# R1-Distill's chat template (DeepSeek-R1-Distill-Qwen), with ASCII role markers the tiny tokenizer
# can spell: the generation prompt ends with "<think>\n", so the model starts in thinking mode.
R1_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '<|User|>' + message['content'] }}{% elif message['role'] == 'assistant' %}"
    "{{ '<|Assistant|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}"
)
# the original R1 template: the generation prompt is just the assistant marker
R1_PLAIN = R1_TEMPLATE.replace("<|Assistant|><think>\\n' }}{% endif %}", "<|Assistant|>' }}{% endif %}")


@pytest.fixture(scope="module")
def tok():
    from posttrain.models import load_model_and_tokenizer

    _, t = load_model_and_tokenizer("tiny", device="cpu")
    return t


@pytest.mark.parametrize("template", [R1_TEMPLATE, R1_PLAIN])
def test_no_thinking_prefix_opens_the_assistant_turn_with_an_r1_chat_template(tok, template):
    """The prefix comes AFTER the generation prompt (the assistant turn starts closed-thinking), with
    one <think> tag whether or not the template already opened it. The old placement (user text via
    task.prompt_template) leaves the prefix before `<|Assistant|><think>`: the model then thinks."""
    tok.chat_template = template
    fmt = PromptFormatter(tok, chat=True, assistant_prefix=NO_THINKING_PREFIX)
    text = fmt.full_text("What is 2+2?")
    assert text.endswith(
        "<|User|>What is 2+2?<|Assistant|><think>\nOkay, I think I have finished thinking.\n</think>\n\n"
    )
    assert text.count("<think>") == 1
    assert tok.decode(fmt.encode("What is 2+2?")).endswith("</think>\n\n")
    old = PromptFormatter(tok, template="{prompt}" + NO_THINKING_PREFIX, chat=True)
    assert not tok.decode(old.encode("What is 2+2?")).endswith("</think>\n\n")  # the bug


def test_trainer_sft_and_eval_share_the_assistant_prefix(tmp_path, tok):
    """Rollout, SFT and `posttrain eval` build their formatters from task.assistant_prefix."""
    from posttrain.train.sft import SFTConfig, SFTTrainer

    prefix = json.dumps(NO_THINKING_PREFIX)
    cfg = load_rl_config(None, [*TINY, f"task.assistant_prefix={prefix}", f"out_dir={tmp_path / 'rl'}"])
    from posttrain.train.rl import RLTrainer

    with RLTrainer(cfg) as tr:
        assert tr.formatter.assistant_prefix == NO_THINKING_PREFIX
        assert tr.tokenizer.decode(tr.formatter.encode("1+1=?")).endswith(NO_THINKING_PREFIX)
    from posttrain.utils.config import build_config

    scfg = build_config(
        SFTConfig,
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            f"task.assistant_prefix={prefix}",
            f"out_dir={tmp_path / 'sft'}",
        ],
    )
    st = SFTTrainer(scfg)
    assert st.formatter.assistant_prefix == NO_THINKING_PREFIX


def test_continue_thinking_ratio():
    texts = ["4", "Wait, let me check: 2+2=4", "</think> 4", "The answer is 4"]
    assert continue_thinking_ratio(texts) == 0.5
    assert continue_thinking_ratio(texts, ["answer"]) == 0.25
    assert continue_thinking_ratio([]) == 0.0


# ------------------------------------------------------------------------------------------ top-p
@pytest.mark.parametrize(
    "extra",
    [["hooks.replay.name=nexgrpo"], ["rollout.engine={name: vllm, params: {tis_mode: token_truncate}}"]],
)
def test_top_p_below_one_is_refused_where_rollout_logprobs_are_used(extra):
    with pytest.raises(ValueError, match=r"rollout\.top_p=0\.9.*nucleus"):
        load_rl_config(None, [*TINY, "rollout.top_p=0.9", *extra])
    load_rl_config(None, [*TINY, "rollout.top_p=0.9"])  # nothing uses the rollout log-probs: fine
    load_rl_config(None, [*TINY, "rollout.top_p=1.0", *extra])


# ----------------------------------------------------------------------------- single update warning
@pytest.mark.parametrize("objective", ["dgpo", "maspo", "dapo"])
def test_ratio_objectives_with_one_on_policy_update_warn_at_config_time(objective):
    with pytest.warns(SingleUpdateWarning, match="ratio"):
        load_rl_config(None, [*TINY, f"objective.name={objective}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SingleUpdateWarning)
        load_rl_config(None, [*TINY, f"objective.name={objective}", "minibatches=2"])
        load_rl_config(None, [*TINY, f"objective.name={objective}", "ppo_epochs=2"])
        load_rl_config(None, [*TINY, "objective.name=ppo"])  # GRPO's plain one-update form


def test_shipped_rl_configs_say_how_many_updates_per_step():
    from importlib.resources import files

    paths = [p for p in (files("posttrain") / "configs").iterdir() if p.name.endswith(".yaml")]
    for d in (files("posttrain") / "recipes").iterdir():
        if d.is_dir():
            paths += [p for p in d.iterdir() if p.name.endswith(".yaml")]
    rl = [p for p in paths if "objective" in load_yaml(str(p))]
    assert len(rl) >= 10
    for p in rl:
        data = load_yaml(str(p))
        assert "minibatches" in data and "ppo_epochs" in data, p.name
    assert load_yaml(str(files("posttrain") / "recipes" / "dapo" / "dapo.yaml"))["minibatches"] == 16


# ------------------------------------------------------------------------------------------ DAPO
def test_dapo_recipe_values_and_overlong_limit_checked_at_config_time():
    from importlib.resources import files

    assert policy_loss_defaults("dapo")["clip_c"] == 10.0  # verl DAPO recipe clip_ratio_c
    path = str(files("posttrain") / "recipes" / "dapo" / "dapo.yaml")
    cfg = load_rl_config(path, [])
    assert cfg.objective.params["clip_c"] == 10.0
    assert cfg.hooks.sampler.params["oversample"] == 3.0
    with pytest.raises(
        ValueError, match=r"hooks\.shaper\.params\.max_length.*rollout\.max_new_tokens \(64\)"
    ):
        load_rl_config(path, ["rollout.max_new_tokens=64"])
    with pytest.raises(ValueError, match=r"hooks\.shapers\[0\]\.params\.max_length"):
        load_rl_config(
            None,
            [
                *TINY,
                "rollout.max_new_tokens=8",
                "hooks.shapers=[{name: dapo-overlong, params: {max_length: 9, buffer: 2}}]",
            ],
        )


# ------------------------------------------------------------------------------------- REINFORCE++
def _verl_masked_whiten(values, mask):
    """verl ``verl/utils/torch_functional.py::masked_whiten`` (unbiased masked variance)."""
    mean = (values * mask).sum() / mask.sum()
    centered = values - mean
    var = (centered**2 * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_rpp_baseline(scores, index, mask):
    """verl ``compute_reinforce_plus_plus_baseline_outcome_advantage`` (outcome score per sequence)."""
    s = scores.clone()
    for g in index.unique():
        rows = index == g
        if rows.sum() > 1:
            s[rows] = scores[rows] - scores[rows].mean()
    tok = s[:, None] * mask
    return _verl_masked_whiten(tok, mask) * mask


def _verl_rpp(scores, mask):
    """verl ``compute_reinforce_plus_plus_outcome_advantage`` with γ = 1: every token's return is R."""
    returns = scores[:, None] * mask
    return _verl_masked_whiten(returns, mask) * mask


@pytest.mark.parametrize("lengths", [[7] * 8, [1, 3, 7, 2, 5, 7, 4, 6]])
def test_reinforce_pp_matches_verl_token_level_whitening(lengths):
    """8 sequences x 7 tokens: counting sequences instead of tokens gives 0.944x verl's advantage."""
    g = torch.Generator().manual_seed(0)
    r = torch.rand(8, generator=g, dtype=torch.float64)
    gids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 3])
    n = torch.tensor(lengths)
    mask = (torch.arange(7)[None, :] < n[:, None]).double()
    ref = _verl_rpp_baseline(r, gids, mask)
    got = get_advantage("reinforce_pp")(r, gids, token_counts=n)
    torch.testing.assert_close(got[:, None] * mask, ref)
    ref_plain = _verl_rpp(r, mask)
    got_plain = get_advantage("reinforce_plus_plus")(r, gids, token_counts=n)
    torch.testing.assert_close(got_plain[:, None] * mask, ref_plain)


def test_trainer_passes_token_counts_to_reinforce_pp(tmp_path):
    from posttrain.train.rl import RLTrainer

    cfg = load_rl_config(
        None,
        [
            *TINY,
            'task.params={digits: 1, ops: "+", n_train: 20, n_heldout: 4}',
            "reward.num_workers=0",
            "rollout.prompts_per_step=2",
            "rollout.group_size=3",
            "rollout.max_new_tokens=4",
            "advantage.name=reinforce_pp",
            f"out_dir={tmp_path}",
        ],
    )
    with RLTrainer(cfg) as tr:
        ro = tr.rollout()
        tr.forward_without_rewards(ro)
        sc = tr.score(ro)
    b = ro.episodes.batch
    expected = get_advantage("reinforce_pp")(sc.shaped, b.group_ids, token_counts=b.action_lengths.cpu())
    torch.testing.assert_close(sc.advantages, expected)


# ------------------------------------------------------------------- DGPO/MASPO authors' aggregation
def test_token_mean_micro_is_the_authors_per_micro_batch_mean_and_differs_from_global_token_mean():
    """Two micro-batches of 2 sequences, 2 and 6 valid tokens: the authors' mode averages the two
    micro-batch token means (each scaled by 2/4 of the minibatch); posttrain's token-mean divides by
    the 8 tokens of the whole minibatch."""
    from posttrain.algos import agg_loss, list_agg_modes

    assert "token-mean-micro" in list_agg_modes()
    v = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [3.0, 3, 3], [3.0, 3, 3]])
    m = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [1.0, 1, 1], [1.0, 1, 1]])
    micro = [agg_loss(v[r], m[r], "token-mean-micro", global_seqs=4) for r in (slice(0, 2), slice(2, 4))]
    assert float(sum(micro)) == pytest.approx(0.5 * 1.0 + 0.5 * 3.0)
    glob = [agg_loss(v[r], m[r], "token-mean", global_tokens=8) for r in (slice(0, 2), slice(2, 4))]
    assert float(sum(glob)) == pytest.approx((2 * 1.0 + 6 * 3.0) / 8)
    load_rl_config(None, [*TINY, "objective.name=dgpo", "objective.agg=token-mean-micro", "minibatches=2"])
