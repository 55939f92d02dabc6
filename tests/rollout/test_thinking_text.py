"""Text that closes or continues a thinking block (posttrain.rollout.episodes): ``assistant_prefix``
goes after the chat template's generation prompt, with one ``<think>`` tag whether or not the
template opened it; rollout, SFT and ``posttrain eval`` build their formatters from the same
``task.assistant_prefix`` (the continue-thinking ratio is ASRR's metric, tested with its recipe)."""

from __future__ import annotations

import json

import pytest

from posttrain.rollout import PromptFormatter
from posttrain.train.config import load_rl_config

TINY = ["model.name=tiny", "model.device=cpu", "reward.num_workers=0"]
# a prefix that closes the thinking block at once (ASRR's No-Thinking prefix has this shape)
CLOSED = "<think>\nDone.\n</think>\n\n"

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
def test_assistant_prefix_opens_the_assistant_turn_after_the_generation_prompt(tok, template):
    """The prefix comes AFTER the generation prompt, with one <think> tag whether or not the template
    already opened it. Putting it in the user text (task.prompt_template) leaves it before
    `<|Assistant|><think>`: the model then thinks."""
    tok.chat_template = template
    fmt = PromptFormatter(tok, chat=True, assistant_prefix=CLOSED)
    text = fmt.full_text("What is 2+2?")
    assert text.endswith("<|User|>What is 2+2?<|Assistant|><think>\nDone.\n</think>\n\n")
    assert text.count("<think>") == 1
    assert tok.decode(fmt.encode("What is 2+2?")).endswith("</think>\n\n")
    in_user_text = PromptFormatter(tok, template="{prompt}" + CLOSED, chat=True)
    assert not tok.decode(in_user_text.encode("What is 2+2?")).endswith("</think>\n\n")


def test_trainer_sft_and_eval_share_the_assistant_prefix(tmp_path):
    """Rollout, SFT and `posttrain eval` build their formatters from task.assistant_prefix."""
    from posttrain.train.rl import RLTrainer
    from posttrain.train.sft import SFTConfig, SFTTrainer
    from posttrain.utils.config import build_config

    prefix = json.dumps(CLOSED)
    cfg = load_rl_config(None, [*TINY, f"task.assistant_prefix={prefix}", f"out_dir={tmp_path / 'rl'}"])
    with RLTrainer(cfg) as tr:
        assert tr.formatter.assistant_prefix == CLOSED
        assert tr.tokenizer.decode(tr.formatter.encode("1+1=?")).endswith(CLOSED)
    sft = [
        "model.name=tiny",
        "model.device=cpu",
        f"task.assistant_prefix={prefix}",
        f"out_dir={tmp_path / 'sft'}",
    ]
    st = SFTTrainer(build_config(SFTConfig, None, sft))
    assert st.formatter.assistant_prefix == CLOSED
