"""`posttrain bench ablation`: the quick mode end to end (runs, table, JSON, Markdown, PNG), the CLI,
bad arguments, fresh run folders, and the per-run summary / claim checks on synthetic metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.tasks import get_task
from posttrain_lab.benchmarks.ablation import (
    ARMS,
    AblationSettings,
    aggregate,
    arm_overrides,
    check_claims,
    run_ablation,
    summarise_run,
    warm_start_pairs,
)
from posttrain_lab.recipes.asrr.hooks import NO_THINKING_PREFIX

runner = CliRunner()


def test_quick_ablation_runs_every_selected_arm_from_one_warm_start(tmp_path):
    res = run_ablation(AblationSettings.quick(arms=["grpo", "dgpo", "dapo"], sft_steps=4), tmp_path)
    assert list(res["table"]) == ["grpo", "dgpo", "dapo"]
    data = json.loads((tmp_path / "ablation.json").read_text())
    assert set(data["claims"]) == {"dapo_no_zero_variance_group"}
    assert "| dapo |" in (tmp_path / "ablation.md").read_text()
    assert (tmp_path / "ablation.png").read_bytes()[:4] == b"\x89PNG"
    runs = {r["run_dir"] for arm in data["runs"].values() for r in arm}
    assert len(runs) == 3  # each arm in its own folder
    # every arm runs two AdamW updates per rollout batch (off-policy, so GRPO / DGPO / MASPO differ)
    for r in runs:
        assert "\nminibatches: 2\n" in (tmp_path / r / "config.yaml").read_text()
    # same warm start: every arm's first held-out eval (before any RL step) is identical
    starts = {arm: data["runs"][arm][0]["heldout_acc_start"] for arm in data["runs"]}
    assert len(set(starts.values())) == 1
    # DAPO draws extra rounds; the others spend exactly the per-step budget
    assert data["runs"]["grpo"][0]["rollouts_total"] == 2 * 4 * 4
    assert data["runs"]["dapo"][0]["rollouts_total"] >= 2 * 4 * 4
    # a second ablation into the same folder is refused unless asked to overwrite or resume
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_ablation(AblationSettings.quick(arms=["grpo"]), tmp_path)
    # each finished (arm, seed) was written as it completed, with its gate; paired differences vs grpo
    for arm in ("grpo", "dgpo", "dapo"):
        saved = json.loads((tmp_path / "results" / f"{arm}-s0.json").read_text())
        assert saved["gate"]["verdict"] in ("FIRED", "NOT FIRED") and saved["correct_end"]
    assert set(data["paired"]) == {"dgpo", "dapo"} and data["paired"]["dgpo"]["n_pairs"] == 8
    assert "Paired differences vs grpo" in (tmp_path / "ablation.md").read_text()
    # resume: finished arms are loaded, only the missing one runs; a loaded result's gate is judged again
    # by this version's rule (a stale verdict stored by an older one does not survive)
    stored = tmp_path / "results" / "grpo-s0.json"
    stale = json.loads(stored.read_text())
    stored.write_text(json.dumps({**stale, "gate": {"verdict": "STALE", "detail": ""}}))
    said = []
    res2 = run_ablation(
        AblationSettings.quick(arms=["grpo", "dgpo", "maspo"], sft_steps=4),
        tmp_path,
        resume=True,
        log=said.append,
    )
    assert any("grpo: done earlier" in m for m in said) and any("dgpo: done earlier" in m for m in said)
    assert any("maspo: GATE" in m for m in said) and not any("grpo: GATE" in m for m in said)
    assert res2["runs"]["grpo"][0]["heldout_acc_end"] == data["runs"]["grpo"][0]["heldout_acc_end"]
    assert res2["runs"]["grpo"][0]["gate"] == stale["gate"]
    # summary only: nothing runs; what is missing (an arm never run, a seed never run) is said and left out
    said = []
    res3 = run_ablation(
        AblationSettings.quick(arms=["grpo", "maspo", "nexgrpo"], seeds=[0, 1], sft_steps=4),
        tmp_path,
        summary_only=True,
        log=said.append,
    )
    assert list(res3["table"]) == ["grpo", "maspo"] and res3["table"]["grpo"]["seeds"] == 1
    assert any("nexgrpo: no finished result" in m for m in said)
    assert any("seed 1 grpo: no finished result" in m for m in said)
    assert not any("GATE" in m for m in said) and not (tmp_path / "runs" / "nexgrpo-s0").exists()
    assert res3["paired"]["maspo"]["n_pairs"] == 8
    # a stored gate is not trusted: the summary re-judges it from the run's logged steps (a result written
    # before a gate rule was fixed, e.g. MASPO's read of clipfrac, shows today's verdict)
    path = tmp_path / "results" / "maspo-s0.json"
    saved = json.loads(path.read_text())
    good_mech, good_gate = saved["mech"], saved["gate"]
    assert "gated_frac" in good_mech
    saved.update(mech={"clipfrac": 0.0}, gate={"verdict": "STALE", "detail": "old rule"})
    path.write_text(json.dumps(saved))
    res4 = run_ablation(
        AblationSettings.quick(arms=["grpo", "maspo"], sft_steps=4), tmp_path, summary_only=True
    )
    assert res4["runs"]["maspo"][0]["mech"] == good_mech and res4["gates"]["maspo"] == [good_gate]
    # resuming or summarising with other settings is refused, naming what differs
    assert json.loads((tmp_path / "settings.json").read_text())["sft_steps"] == 4
    for mode in ({"resume": True}, {"summary_only": True}):
        with pytest.raises(ValueError, match=r"sft_steps: 4 there, 5 now"):
            run_ablation(AblationSettings.quick(arms=["grpo"], sft_steps=5), tmp_path, **mode)
    # each result carries its own settings: one copied in from a run with other settings is refused
    # even where settings.json agrees (the message names the file and the key)
    saved = json.loads((tmp_path / "results" / "dgpo-s0.json").read_text())
    assert saved["settings"]["sft_steps"] == 4 and "arms" not in saved["settings"]
    saved["settings"]["steps"] = 99
    (tmp_path / "results" / "dgpo-s0.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"dgpo-s0.json: made with other settings \(steps: 99 there"):
        run_ablation(AblationSettings.quick(arms=["grpo", "dgpo"], sft_steps=4), tmp_path, summary_only=True)


def test_real_model_settings_are_checked():
    with pytest.raises(ValueError, match="word_problems or instructions"):
        AblationSettings(model="smollm2-135m", task="arithmetic")
    with pytest.raises(ValueError, match="needs a real model"):
        AblationSettings(task="word_problems")
    from posttrain_lab.benchmarks.ablation import arm_overrides

    s = AblationSettings(model="smollm2-135m", task="word_problems", max_new_tokens=24)
    o = arm_overrides(s, "asrr", 0, Path("r"))
    assert "model.name=smollm2-135m" in o and "task.chat_template=true" in o and "eval.at_end=false" in o
    assert any(x.startswith("task.assistant_prefix=") for x in o) and any("window: 8" in x for x in o)
    # the pre-check gave 0.000 with `numeric` (first line) and 0.033 on startend:quotation: the real-model
    # settings read the last number, train the postscript instruction, and run bf16 on the fast engine
    assert (
        "reward.name=last_number" in o and "model.precision=auto" in o and "rollout.engine={name: fast}" in o
    )
    assert any("max_value: 10" in x for x in o)
    # the real model takes the worker's share of the cores, not the tiny base config's 1 thread
    from posttrain_lab.benchmarks.ablation import real_model_threads

    assert f"threads={real_model_threads(s)}" in o
    tiny = arm_overrides(AblationSettings.quick(), "grpo", 0, Path("r"))
    assert not any(x.startswith("threads=") for x in tiny)  # the tiny model keeps the base config's 1
    assert real_model_threads(s, cpus=2) == 2 and real_model_threads(s, cpus=16) == 16
    assert (
        real_model_threads(
            AblationSettings(model="smollm2-135m", task="word_problems", jobs=2, seeds=[0, 1, 2]), cpus=2
        )
        == 1
    )
    assert (
        real_model_threads(
            AblationSettings(model="smollm2-135m", task="word_problems", jobs=4, seeds=[0]), cpus=8
        )
        == 8
    )
    oi = arm_overrides(AblationSettings(model="smollm2-135m", task="instructions"), "grpo", 0, Path("r"))
    # issue 40: the instructions arms train the demo smol's type mix with its guarded reward (a flagged
    # answer scores -1), so a checker hack (stacked `P.S.` lines) cannot reach 1.00
    assert "reward.name=instructions_guarded" in oi
    from importlib.resources import files

    import yaml

    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config

    demo = yaml.safe_load((files("posttrain_lab.demos") / "demo_smol.yaml").read_text())
    cfg = build_config(RLConfig, None, [o for o in oi if not o.startswith("out_dir")])
    assert cfg.task.params["types"] == demo["task"]["params"]["types"] and "ood_types" not in cfg.task.params
    assert cfg.reward.name == "instructions_guarded" and cfg.reward.params == demo["reward"]["params"]
    assert cfg.reward.params["mode"] == "reject"


def test_greedy_verdicts_report_hacked_frac_on_instruction_tasks(tmp_path):
    """The ablation's instructions arms report the share of hacked held-out answers and the bare checker's
    accuracy beside the guarded reward's (a hacked answer counts for the checker, not for the reward)."""
    pytest.importorskip("if_verifiable")
    from posttrain import RLTrainer
    from posttrain_lab.benchmarks.ablation import greedy_verdicts

    cfg = {
        "model": {"name": "tiny"},
        "task": {
            "name": "instructions",
            "params": {"types": ["detectable_content:postscript"], "n_train": 8, "n_heldout": 4},
        },
        "reward": {"name": "instructions_guarded", "num_workers": 0},
        "rollout": {"max_new_tokens": 6, "prompts_per_step": 2, "group_size": 2},
        "out_dir": str(tmp_path / "r"),
    }
    with RLTrainer(cfg) as tr:
        v = greedy_verdicts(tr, tr.task.split("heldout"))
    assert 0 <= v["hacked_frac"] <= 1 and 0 <= v["checker_strict"] <= 1
    assert v["hacked_frac"] == 1.0  # six characters of a tiny model: too short and off topic, always


def test_cli_quick_and_bad_arm(tmp_path):
    r = runner.invoke(
        app,
        [
            "bench",
            "ablation",
            "--quick",
            "--arms",
            "grpo",
            "--sft-steps",
            "2",
            "--steps",
            "1",
            "--seeds",
            "0,1",
            "--jobs",
            "2",
            "--out",
            str(tmp_path / "a"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a" / "ablation.md").is_file()
    data = json.loads((tmp_path / "a" / "ablation.json").read_text())
    assert [run["seed"] for run in data["runs"]["grpo"]] == [0, 1]  # one worker process per seed
    r = runner.invoke(
        app, ["bench", "ablation", "--quick", "--arms", "grpo,nope", "--out", str(tmp_path / "b")]
    )
    assert r.exit_code != 0 and "nope" in r.output and "choose from" in r.output


def test_mixed_warm_start_teaches_both_modes_after_the_no_thinking_prefix():
    task = get_task("arithmetic", digits=2, ops="+", n_train=5, n_heldout=3, format="scratchpad")
    pairs = warm_start_pairs(task, "mixed")
    assert warm_start_pairs(task, "scratchpad") is None  # the demo's own set
    assert len(pairs) == 3 * 5
    ex = task.split("train")[0]
    long, short = task.reference_completion(ex, "long"), task.reference_completion(ex, "short")
    assert pairs[:3] == [
        (ex.prompt, long),
        (ex.prompt + NO_THINKING_PREFIX, short),
        (ex.prompt + NO_THINKING_PREFIX, long),
    ]
    assert short == f"{ex.meta['a']}+{ex.meta['b']}={ex.answer}\n#### {ex.answer}"
    with pytest.raises(ValueError, match="warm-start"):
        AblationSettings.quick(warm_start="plain")


def test_arms_cover_the_issue_list():
    assert set(ARMS) == {"grpo", "dgpo", "maspo", "e3", "asrr", "nothink", "dapo", "e3-asrr-dgpo"} | {
        "nexgrpo",
        "random-failure",
        "success",
        "aparl",
    }


def _rows(entropies, *, zero_var=0.0, hard=None):
    rows = [{"kind": "eval", "step": 0, "accuracy": 0.5, "length_mean": 40.0}]
    for i, h in enumerate(entropies):
        r = {
            "kind": "step",
            "step": i + 1,
            "entropy_pre_update": h,
            "length_mean": 40.0 - i,
            "temperature": 1.0,
            "num_sequences": 8,
            "zero_var_frac": zero_var,
        }
        if hard:
            r.update({"sampler/n_hard": hard[0], "sampler/n_easy": hard[1]})
        rows.append(r)
    rows.append({"kind": "eval", "step": len(entropies), "accuracy": 0.6, "length_mean": 30.0})
    return rows


def test_summary_measures_entropy_drift_after_warmup_and_claims_use_it():
    e3 = summarise_run(_rows([1.0, 3.0, 1.05, 0.95, 1.02], hard=(10, 6)), warmup_frac=0.4)
    grpo = summarise_run(_rows([1.0, 1.0, 0.8, 0.7, 0.6]), warmup_frac=0.4)
    assert e3["entropy_dev_max"] == pytest.approx(0.05)  # the warm-up spike at step 2 is excluded
    assert grpo["entropy_dev_max"] == pytest.approx(0.4)
    dapo = summarise_run(_rows([1.0, 1.0], zero_var=0.0))
    table = aggregate({"grpo": [grpo], "e3": [e3], "dapo": [dapo]})
    claims = check_claims(table)
    assert claims["e3_entropy_within_10pct"]["holds"] is True
    assert claims["e3_hard_prompts_get_more_rollouts"]["holds"] is True
    assert claims["dapo_no_zero_variance_group"]["holds"] is True
    assert "asrr_length_cut_25pct_acc_drop_2pts" not in claims  # ASRR not run


def test_summary_counts_the_rollouts_a_dynamic_sampling_filter_drew():
    """The summary's rollout budget counts the extra rounds a group filter drew (``filter/``; runs logged
    before 0.2.0, when a sampler could own the filter, under ``sampler/``); plain arms count their
    batch."""
    plain = summarise_run(_rows([1.0, 1.0]))
    rows = _rows([1.0, 1.0])
    rows[1]["filter/rollouts_generated"] = 20.0
    rows[2]["sampler/rollouts_generated"] = 12.0
    assert plain["rollouts_total"] == 16.0 and summarise_run(rows)["rollouts_total"] == 32.0


def test_prefix_arms_start_from_their_own_precheck():
    """ASRR and its control open the assistant turn with the No-Thinking prefix, which changes the
    starting model's accuracy and length: their pre-check (step-0 verdicts) is measured with the prefix,
    not shared with the plain arms. Mutant (the old code): one pre-check per seed for every arm."""
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config
    from posttrain_lab.benchmarks.ablation import ARMS, _precheck_key, arm_overrides

    s = AblationSettings(model="smollm2-135m", task="word_problems")
    keys = {}
    for arm in ("grpo", "asrr", "nothink", "dgpo"):
        cfg = build_config(RLConfig, None, arm_overrides(s, arm, 3, Path("r")))
        keys[arm] = _precheck_key(3, cfg)
    assert keys == {"grpo": "3", "dgpo": "3", "asrr": "3-prefix", "nothink": "3-prefix"}
    # the control differs from ASRR only by the length penalty: the same prefix, the ASRR shaper with
    # beta 0 (rewards unchanged; it still reports ASRR's Continue-Thinking ratio)
    only = (set(ARMS["asrr"]) - set(ARMS["nothink"])) | (set(ARMS["nothink"]) - set(ARMS["asrr"]))
    assert len(only) == 2 and all(o.startswith("hooks.shapers=") for o in only)
    ctl = build_config(RLConfig, None, arm_overrides(s, "nothink", 3, Path("r"))).hooks.shapers
    assert [(x.name, x.params) for x in ctl] == [("asrr", {"beta": 0.0})]


def test_arms_use_the_one_way_for_filters_and_shapers():
    """DAPO's and APARL's dynamic sampling is the group filter slot (no sampler owns a filter), every
    shaper goes in ``hooks.shapers``, and the bench's round cap reaches the filter."""
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config
    from posttrain_lab.benchmarks.ablation import arm_overrides

    assert not [o for arm in ARMS.values() for o in arm if o.startswith(("hooks.shaper=", "hooks.shaper."))]
    s = AblationSettings.quick()
    for arm in ("dapo", "aparl"):
        cfg = build_config(RLConfig, None, arm_overrides(s, arm, 0, Path("r")))
        assert cfg.hooks.filter.name == "dynamic-sampling" and cfg.hooks.filter.params == {"max_rounds": 2}
        assert cfg.hooks.sampler.params == {}


def test_dapo_gate_reads_the_filter_rounds_not_the_shaped_zero_variance():
    """DAPO's dynamic sampling fired when a step drew a second round. The trained groups' zero-variance
    share is measured after the overlong shaper, which can make a kept group constant: on the real model
    (2026-12-06, seed 0) the filter dropped 21 groups in 12 steps (1.92 rounds per step, 468 rollouts)
    while 4 % of the trained groups were constant after shaping, and the old gate (zero_var_frac == 0)
    said NOT FIRED."""
    from posttrain_lab.benchmarks.ablation import arm_gate, mechanism_means

    mech = {"sampling_rounds": 1.92, "zero_var_frac": 0.042, "filter/cap_hit": 0.083}
    g = arm_gate("dapo", {"mech": mech, "rollouts_total": 468})
    assert (
        g["verdict"] == "FIRED" and "468" in g["detail"] and "0.042" in g["detail"] and "0.083" in g["detail"]
    )
    assert (
        arm_gate("dapo", {"mech": {"sampling_rounds": 1.0, "zero_var_frac": 0.0}})["verdict"] == "NOT FIRED"
    )
    assert arm_gate("dapo", {"mech": {}})["verdict"] == "NOT FIRED"
    # the filter's cap hits reach the gate: the mechanism means collect the group filter's metrics
    steps = [{"sampling_rounds": 1, "filter/cap_hit": 0.0}, {"sampling_rounds": 10, "filter/cap_hit": 1.0}]
    assert (
        mechanism_means(steps)["filter/cap_hit"] == 0.5 and mechanism_means(steps)["sampling_rounds"] == 5.5
    )


def test_maspo_gate_reads_its_soft_gate_not_clipfrac():
    """MASPO has no hard clip (its clipfrac is always 0): its gate is the share of tokens its soft gate
    acted on. Mutants: MASPO judged by clipfrac (NOT FIRED on the real model although 11 % of tokens were
    gated), or `gated_frac` left out of the mechanism metrics that summarise_run collects."""
    from posttrain_lab.benchmarks.ablation import arm_gate, summarise_run

    g = arm_gate(
        "maspo", {"mech": {"clipfrac": 0.0, "gated_frac": 0.11, "gate_mean": 0.99, "sigma_mean": 2.4}}
    )
    assert g["verdict"] == "FIRED" and "0.11" in g["detail"]
    assert arm_gate("maspo", {"mech": {"clipfrac": 0.0, "gated_frac": 0.0}})["verdict"] == "NOT FIRED"
    rows = [
        {
            "kind": "step",
            "step": i,
            "entropy": 1.0,
            "entropy_pre_update": 1.0,
            "num_sequences": 8,
            "temperature": 1.0,
            "length_mean": 5.0,
            "zero_var_frac": 0.5,
            "accuracy": 0.2,
            "gated_frac": 0.1 * i,
            "gate_mean": 0.9,
            "sigma_mean": 2.0,
            "clipfrac": 0.0,
        }
        for i in (1, 2)
    ]
    evals = [
        {"step": 0, "accuracy": 0.2, "length_mean": 5.0},
        {"step": 2, "accuracy": 0.3, "length_mean": 4.0},
    ]
    mech = summarise_run(rows, warmup_frac=0.25, evals=evals)["mech"]
    assert mech["gated_frac"] == pytest.approx(0.15) and "sigma_mean" in mech and "gate_mean" in mech


def test_precheck_reports_what_rl_samples_mixed_groups_counted_per_prompt():
    """The pre-check measures the sampled accuracy and the share of mixed groups over G samples per
    training prompt (greedy accuracy alone passed the real model at 0.31 while sampling at T = 1 got
    3-9 %): all-right and all-wrong groups are not mixed."""
    from types import SimpleNamespace as NS

    import torch

    from posttrain_lab.benchmarks.ablation import MIXED_MIN, _precheck_text, sampled_verdicts

    verdicts = {0: [1, 1, 1], 1: [0, 0, 0], 2: [1, 0, 0], 3: [0, 1, 1]}
    seen = {}

    class Runner:
        def run(self, examples, ns, params):
            seen.update(ns=ns, temperature=params.temperature, max_new=params.max_new_tokens)
            gids = [i for i, n in enumerate(ns) for _ in range(n)]
            texts = [str(verdicts[g][k]) for g in range(len(ns)) for k in range(ns[g])]
            return NS(
                texts=texts, examples=[examples[g] for g in gids], batch=NS(group_ids=torch.tensor(gids))
            )

    cfg = NS(
        rollout=NS(group_size=3, temperature=0.7, top_p=1.0, max_new_tokens=5),
        reward=NS(success_threshold=1.0),
    )
    tr = NS(
        cfg=cfg,
        eval_runner=lambda: Runner(),
        collector=NS(reward_source=NS(score=lambda texts, exs: NS(rewards=[float(t) for t in texts]))),
    )
    r = sampled_verdicts(tr, ["a", "b", "c", "d"])
    assert seen == {"ns": [3, 3, 3, 3], "temperature": 0.7, "max_new": 5}
    assert r["sampled_accuracy"] == pytest.approx(6 / 12)
    assert (r["mixed_frac"], r["all_right_frac"], r["all_wrong_frac"]) == (0.5, 0.25, 0.25)
    pre = {"accuracy": 0.3, "n": 4, "length_mean": 9.0, "greedy_in_band": True, "sampled": r}
    pre["mixed_ok"] = r["mixed_frac"] >= MIXED_MIN
    pre["in_band"] = pre["greedy_in_band"] and pre["mixed_ok"]
    assert "mixed groups 0.50" in _precheck_text(pre) and "PRE-CHECK PASSED" in _precheck_text(pre)


def test_quick_ablation_precheck_file_has_the_sampled_check(tmp_path):
    run_ablation(AblationSettings.quick(arms=["grpo"], sft_steps=2), tmp_path)
    pre = json.loads((tmp_path / "runs" / "precheck-s0.json").read_text())
    sm = pre["sampled"]
    assert sm["group_size"] == 4 and sm["n_prompts"] >= 1
    assert sm["mixed_frac"] + sm["all_right_frac"] + sm["all_wrong_frac"] == pytest.approx(1.0)
    assert pre["in_band"] == (pre["greedy_in_band"] and pre["mixed_ok"])
    assert "mixed groups" in (tmp_path / "ablation.md").read_text()


def test_real_model_replay_arms_start_replaying_at_a_calibrated_step(tmp_path):
    """ExGRPO's delayed start (batch Pass@1 > 35 %) never fired on the real model (sampled accuracy
    3-16 %: nothing replayed in 12 steps); on the real model the replay arms start at a fixed step."""
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config
    from posttrain_lab.benchmarks.ablation import REAL_REPLAY_START_STEP

    real = AblationSettings(model="smollm2-135m", task="word_problems")
    for arm in ("nexgrpo", "random-failure", "success"):
        cfg = build_config(RLConfig, None, arm_overrides(real, arm, 0, tmp_path / arm))
        assert cfg.hooks.replay.name == arm
        assert cfg.hooks.replay.params == {"start_accuracy": 0.0, "start_step": REAL_REPLAY_START_STEP}
        tiny = build_config(RLConfig, None, arm_overrides(AblationSettings.quick(), arm, 0, tmp_path / "t"))
        assert tiny.hooks.replay.params == {}  # the tiny preset keeps ExGRPO's rule


def test_micro_batch_size_reaches_the_trainer_and_may_change_between_invocations(tmp_path):
    """Gradient accumulation changes memory, not the update: it reaches the run's config, and
    ``settings.json`` does not count it, so an out-of-memory run can be resumed with it."""
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config
    from posttrain_lab.benchmarks.ablation import check_settings

    s = AblationSettings(model="smollm2-135m", task="word_problems", group_size=8, micro_batch_size=8)
    cfg = build_config(RLConfig, None, arm_overrides(s, "e3", 0, tmp_path / "e3"))
    assert cfg.micro_batch_size == 8 and cfg.minibatches == 2
    plain = build_config(RLConfig, None, arm_overrides(AblationSettings(), "grpo", 0, tmp_path / "g"))
    assert plain.micro_batch_size is None
    real = {"model": "smollm2-135m", "task": "word_problems"}
    check_settings(tmp_path, AblationSettings(**real, group_size=8), write=True)
    check_settings(tmp_path, s, write=False)  # only micro_batch_size differs: accepted
    with pytest.raises(ValueError, match="group_size: 8 there, 4 now"):
        check_settings(tmp_path, AblationSettings(**real, group_size=4, micro_batch_size=8), write=False)
    with pytest.raises(ValueError, match="--micro-batch-size"):
        AblationSettings(micro_batch_size=0)
