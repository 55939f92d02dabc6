"""ASRR's No-Thinking prefix opens the assistant turn (arXiv:2505.15400, Fig. 4): the recipe sets it
as ``task.assistant_prefix``, so with R1-Distill's chat template the assistant turn starts with the
thinking block already closed; the deprecated user-text template leaves the model thinking."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import PromptFormatter
from posttrain.train.config import load_rl_config
from posttrain_lab.recipes.asrr.hooks import NO_THINKING_PREFIX, NO_THINKING_TEMPLATE

ASRR_YAML = Path(__file__).parents[3] / "posttrain_lab" / "recipes" / "asrr" / "asrr.yaml"

# R1-Distill's chat template with ASCII role markers the tiny tokenizer can spell: the generation
# prompt ends with "<think>\n", so the model starts in thinking mode.
R1_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '<|User|>' + message['content'] }}{% elif message['role'] == 'assistant' %}"
    "{{ '<|Assistant|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    _, t = load_model_and_tokenizer("tiny", device="cpu")
    t.chat_template = R1_TEMPLATE
    return t


def test_the_recipe_sets_the_prefix_as_the_assistant_turns_opening():
    cfg = load_rl_config(str(ASRR_YAML), [])
    assert cfg.task.assistant_prefix == NO_THINKING_PREFIX
    assert cfg.task.prompt_template == "{prompt}"  # not in the user text as well


def test_no_thinking_prefix_closes_thinking_with_an_r1_chat_template(tok):
    fmt = PromptFormatter(tok, chat=True, assistant_prefix=NO_THINKING_PREFIX)
    text = fmt.full_text("What is 2+2?")
    assert text.endswith(
        "<|User|>What is 2+2?<|Assistant|><think>\nOkay, I think I have finished thinking.\n</think>\n\n"
    )
    assert text.count("<think>") == 1
    assert tok.decode(fmt.encode("What is 2+2?")).endswith("</think>\n\n")
    old = PromptFormatter(tok, template=NO_THINKING_TEMPLATE, chat=True)  # the prefix in the user text
    assert not tok.decode(old.encode("What is 2+2?")).endswith("</think>\n\n")
