"""What every hook may add to the loop (``posttrain.hooks.Hook``): its own step and evaluation
metrics, merged by the loop for every hook slot and refused when they would overwrite a number the
loop (or another hook) logs; a config-time check against the whole run config, run for every
configured hook; and the sampler's view of every filtered round. The loop computes no method's
metric itself."""

from __future__ import annotations

import json
import warnings

import pytest
from _train_helpers import FirstCharDigit

from posttrain.hooks import (
    CONTROLLERS,
    GROUP_FILTERS,
    GROUP_SHAPERS,
    REPLAY_BUFFERS,
    SAMPLERS,
    ConstantTemperature,
    GroupDecision,
    GroupFilter,
    GroupRewardShaper,
    Hook,
    IdentityShaper,
    KeepAll,
    NoReplay,
    UniformSampler,
    hook_metrics,
)
from posttrain.rollout import FunctionRewardSource
from posttrain.train.config import load_rl_config
from posttrain.train.rl import RLTrainer
from posttrain.utils.config import ConfigError
from posttrain.utils.errors import InvalidTypeError, InvalidValueError, PosttrainRuntimeError

TINY = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 16, n_heldout: 4}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",
    "eval.at_start=false",
    "eval.n=4",
    "threads=1",
]


class _Reports(Hook):
    def __init__(self, step: dict[str, float], ev: dict[str, float] | None = None) -> None:
        self.step, self.ev = step, ev or {}

    def step_metrics(self, episodes):
        return {k: v * len(episodes) for k, v in self.step.items()}

    def eval_metrics(self, episodes):
        return dict(self.ev)


class _Eps:
    def __len__(self) -> int:
        return 3


# ------------------------------------------------------------------------------------------- units
def test_hook_metrics_merges_every_hooks_numbers_and_skips_empty_slots():
    hooks = [_Reports({"a": 1.0}, {"e": 5.0}), None, Hook(), _Reports({"b": 2.0})]
    assert hook_metrics(hooks, _Eps(), kind="step") == {"a": 3.0, "b": 6.0}
    assert hook_metrics(hooks, _Eps(), kind="eval") == {"e": 5.0}
    # every slot's default reports nothing and checks nothing
    for hook in (UniformSampler([1]), ConstantTemperature(), NoReplay(), KeepAll(), IdentityShaper()):
        assert hook.step_metrics(_Eps()) == {} and hook.eval_metrics(_Eps()) == {}
        assert type(hook).validate_config({}, None) is None


def test_a_hook_metric_may_not_overwrite_the_loops_or_another_hooks():
    with pytest.raises(PosttrainRuntimeError, match=r"_Reports\.step_metrics: key 'reward_mean' .* the loop"):
        hook_metrics([_Reports({"reward_mean": 1.0})], _Eps(), kind="step", reserved={"reward_mean": 0.5})
    with pytest.raises(PosttrainRuntimeError, match=r"_Reports\.eval_metrics: key 'x' .* another hook"):
        hook_metrics([_Reports({}, {"x": 1.0}), _Reports({}, {"x": 2.0})], _Eps(), kind="eval")


# ------------------------------------------------------------------------------- through the loop
class _CountingShaper(GroupRewardShaper):
    """Leaves rewards as they are; reports the number of completions it saw, per step and per eval."""

    def shape(self, rewards, group_ids, *, correct, lengths, truncated):
        return rewards

    def step_metrics(self, episodes):
        return {"test/rows": float(len(episodes)), "test/texts": float(len(episodes.texts))}

    def eval_metrics(self, episodes):
        return {"test/eval_rows": float(len(episodes))}


class _TemperatureReporter(ConstantTemperature):
    def step_metrics(self, episodes):
        return {"test/controller_saw": float(len(episodes))}


def _trainer(tmp_path, *extra, **objects) -> RLTrainer:
    cfg = load_rl_config(None, [*TINY, f"out_dir={tmp_path / 'run'}", *extra])
    return RLTrainer(cfg, reward_source=FunctionRewardSource(FirstCharDigit(), num_workers=0), **objects)


def test_the_loop_merges_every_hooks_step_and_eval_metrics(tmp_path):
    """A shaper and a controller report their own numbers: they reach the step's metrics and the
    evaluation (the RL loop itself computes neither)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = _trainer(tmp_path, shapers=[_CountingShaper()], controllers=[_TemperatureReporter()])
        try:
            m = tr.step()
            ev = tr.evaluate()
        finally:
            tr.close()
    assert m["test/rows"] == m["test/texts"] == m["num_sequences"] == 4
    assert m["test/controller_saw"] == 4
    assert ev["test/eval_rows"] == 4 and "test/rows" not in ev


def test_a_hook_that_reports_a_loop_metric_stops_the_step(tmp_path):
    class Clobbers(_CountingShaper):
        def step_metrics(self, episodes):
            return {"accuracy": 1.0}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = _trainer(tmp_path, shapers=[Clobbers()])
        try:
            with pytest.raises(PosttrainRuntimeError, match="'accuracy' is already logged by the loop"):
                tr.step()
        finally:
            tr.close()


def test_the_loop_reports_no_method_metric_of_its_own(tmp_path):
    """With an assistant prefix and no hook that measures it, no Continue-Thinking number appears:
    before, the loop computed ASRR's ratio itself whenever ``task.assistant_prefix`` was set."""
    prefix = json.dumps("<think>\nDone.\n</think>\n\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = _trainer(tmp_path, f"task.assistant_prefix={prefix}", "steps=1", "logging.progress=false")
        tr.train(progress=False)
        tr.close()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["step", "eval"]
    assert not [k for r in rows for k in r if "thinking" in k]


# ---------------------------------------------------------------------------- config-time checks
class _NeedsLimit:
    """``limit`` must equal rollout.max_new_tokens (the shape of DAPO's overlong rule)."""

    @classmethod
    def validate_config(cls, params, config):
        if params.get("limit") != config.rollout.max_new_tokens:
            raise InvalidValueError(f"limit: must equal rollout.max_new_tokens, got {params.get('limit')!r}")


class _LimitShaper(_NeedsLimit, IdentityShaper):
    def __init__(self, *, limit=None):
        pass


class _LimitController(_NeedsLimit, ConstantTemperature):
    def __init__(self, *, limit=None):
        super().__init__()


class _LimitSampler(_NeedsLimit, UniformSampler):
    def __init__(self, examples, *, seed=0, limit=None):
        super().__init__(examples, seed=seed)


class _LimitReplay(_NeedsLimit, NoReplay):
    def __init__(self, *, limit=None):
        pass


class _LimitFilter(_NeedsLimit, KeepAll):
    def __init__(self, *, limit=None):
        pass


@pytest.fixture
def limit_hooks():
    regs = (SAMPLERS, CONTROLLERS, REPLAY_BUFFERS, GROUP_FILTERS, GROUP_SHAPERS)
    saved = [(r, r.snapshot()) for r in regs]
    classes = (_LimitSampler, _LimitController, _LimitReplay, _LimitFilter, _LimitShaper)
    for reg, cls in zip(regs, classes, strict=True):
        reg.register("test-limit")(cls)
    yield
    for reg, state in saved:
        reg.restore(state)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hooks.sampler={name: test-limit, params: {limit: 5}}", "hooks.sampler"),
        ("hooks.filter={name: test-limit, params: {limit: 5}}", "hooks.filter"),
        ("hooks.replay={name: test-limit, params: {limit: 5}}", "hooks.replay"),
        (
            "hooks.controllers=[{name: test-limit, params: {limit: 3}}, {name: test-limit, params: {limit: 5}}]",
            "hooks.controllers[1]",
        ),
        ("hooks.shapers=[{name: none}, {name: test-limit, params: {limit: 5}}]", "hooks.shapers[1]"),
    ],
)
def test_every_configured_hook_checks_its_params_against_the_run_config(limit_hooks, override, key):
    """``Hook.validate_config`` runs for each slot and each list entry, and the error names the
    entry's key (the library knows no hook's rule)."""
    with pytest.raises(ConfigError) as err:
        load_rl_config(None, [*TINY, "rollout.max_new_tokens=3", override])
    assert f"{key}.params.limit: must equal rollout.max_new_tokens, got 5" in str(err.value)
    load_rl_config(None, [*TINY, "rollout.max_new_tokens=5", override.replace("limit: 3", "limit: 5")])


# ------------------------------------------------------------------------------ filtered rounds
class _DropAll(GroupFilter):
    max_rounds = 3

    def __init__(self, log):
        self.log = log

    def decide(self, outcomes, need):
        self.log.append(("decide", len(outcomes)))
        return [GroupDecision(False, "test") for _ in outcomes]


class _RoundWatcher(UniformSampler):
    def __init__(self, examples, log):
        super().__init__(examples)
        self.log = log

    def observe_round(self, outcomes, step):
        self.log.append(("round", step, len(outcomes)))


def test_the_sampler_sees_every_filtered_round_before_the_filter_decides(tmp_path):
    """Also the groups the filter drops (a curriculum counts them); one call per round, with the step."""
    from posttrain.tasks import get_task

    log: list[tuple] = []
    task = get_task("arithmetic", digits=1, ops="+", n_train=16, n_heldout=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = _trainer(
            tmp_path, task=task, sampler=_RoundWatcher(task.split("train"), log), group_filter=_DropAll(log)
        )
        try:
            m = tr.step()
        finally:
            tr.close()
    assert m["sampling_rounds"] == 3
    assert log == [("round", 0, 2), ("decide", 2)] * 3


def test_a_sampler_with_the_removed_filter_interface_is_refused(tmp_path):
    """A pre-0.2 sampler that filtered groups itself would now silently keep every group."""

    class OldStyle(UniformSampler):
        filters_groups = True

        def keep_groups(self, outcomes):
            return [not o.zero_variance for o in outcomes]

    from posttrain.tasks import get_task

    task = get_task("arithmetic", digits=1, ops="+", n_train=16, n_heldout=4)
    with pytest.raises(InvalidTypeError, match=r"filters_groups, keep_groups.*hooks\.filter"):
        _trainer(tmp_path, task=task, sampler=OldStyle(task.split("train")))


# ----------------------------------------------------------------------------------- posttrain eval
@pytest.fixture
def eval_shapers(limit_hooks):
    saved = GROUP_SHAPERS.snapshot()
    GROUP_SHAPERS.register("test-counting")(_CountingShaper)
    yield
    GROUP_SHAPERS.restore(saved)


def test_posttrain_eval_reports_the_metrics_of_the_runs_shapers(eval_shapers, tmp_path):
    """``posttrain eval RUN`` builds the run's shapers that report evaluation metrics (ASRR's
    ``continue_thinking`` before 0.2.0 came from the loop) and only those: a shaper whose config check
    ties it to the training length (DAPO's overlong penalty) does not refuse ``--max-new-tokens``."""
    from typer.testing import CliRunner

    from posttrain.cli import app

    run = tmp_path / "run"
    shapers = "hooks.shapers=[{name: test-counting}, {name: test-limit, params: {limit: 3}}]"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = _trainer(tmp_path, shapers, "steps=1", "eval.at_end=false")
        tr.train(progress=False)
        tr.close()
        res = CliRunner().invoke(
            app, ["eval", "--model", str(run), "--n", "2", "--max-new-tokens", "4"], catch_exceptions=False
        )
    assert res.exit_code == 0, res.output
    ev = json.loads(res.stdout.strip().splitlines()[-1])
    assert ev["test/eval_rows"] == 2 and ev["max_new_tokens"] == 4


def test_saved_settings_keep_only_shapers_with_eval_metrics_and_drop_removed_task_keys(eval_shapers):
    from posttrain.train.evaluate import _eval_base

    saved = {
        "task": {"name": "arithmetic", "continue_thinking_markers": ["wait"]},  # as 0.1 runs saved it
        "hooks": {
            "shaper": {"name": "none", "params": {}},
            "shapers": [
                {"name": "test-limit", "params": {"limit": 3}},
                {"name": "test-counting", "params": {}},
                {"name": "no_such_module:Gone", "params": {}},
            ],
        },
    }
    base = _eval_base(saved)
    assert base["task"] == {"name": "arithmetic"}
    assert base["hooks"] == {"shapers": [{"name": "test-counting", "params": {}}]}
    assert "hooks" not in _eval_base({"task": {"name": "arithmetic"}})
