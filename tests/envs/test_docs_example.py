"""docs/multi-turn.md is runnable: its minimal environment plays through the multi-turn runner."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import PromptFormatter, RolloutBatch, RolloutEngine, SamplingParams
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain.tasks.base import Example

DOC = Path(__file__).resolve().parents[2] / "docs" / "multi-turn.md"


class SayEngine(RolloutEngine):
    """Every turn "says" the next of ``lines`` (+ EOS)."""

    def __init__(self, tok, lines):
        self.tok, self.lines, self.turn = tok, lines, 0

    @property
    def pad_token_id(self):
        return int(self.tok.pad_token_id)

    def generate(self, prompt_ids, n_per_prompt, params):
        text = self.lines[min(self.turn, len(self.lines) - 1)]
        self.turn += 1
        ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
        n = len(prompt_ids)
        return RolloutBatch.from_token_lists(
            prompt_ids,
            [ids] * n,
            pad_token_id=self.pad_token_id,
            group_ids=list(range(n)),
            finish_reasons=["stop"] * n,
            logprobs=[[-1.0] * len(ids)] * n,
        )


@pytest.fixture
def doc_module(monkeypatch):
    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    mod = types.ModuleType("multi_turn_doc")
    exec(compile(code, str(DOC), "exec"), mod.__dict__)
    monkeypatch.setitem(sys.modules, "multi_turn_doc", mod)
    return mod


@pytest.mark.parametrize(
    ("lines", "turns", "session", "polite"),
    [
        (["Is it pear, please?", "Is it apple, please?"], 2, 1.0, [0.0, 0.0]),
        (["pear", "plum", "fig"], 3, 0.0, [-1.0, -1.0, -1.0]),
    ],
)
def test_doc_environment_through_the_runner(doc_module, lines, turns, session, polite):
    tok = load_model_and_tokenizer("tiny", device="cpu", seed=0)[1]
    runner = MultiTurnRunner(
        SayEngine(tok, lines),
        PromptFormatter(tok),
        env="multi_turn_doc:SecretWord",
        env_params={"max_turns": 3},
    )
    eps = runner.run(
        [Example(id="w", prompt="Play.", answer="apple")], [2], SamplingParams(max_new_tokens=32)
    )
    assert eps.advantage_inputs["num_turns"].tolist() == [turns, turns]
    assert eps.rewards.tolist() == [session, session]
    assert eps.advantage_inputs["turn_rewards"][0, :turns, 0].tolist() == polite
    assert "It starts with a." in eps.texts[0]
