"""Fixtures of the CIT tests: the presets' character tokenizer and a BPE tokenizer trained and saved
locally with `tokenizers` (no hub), reloaded with `AutoTokenizer.from_pretrained`."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def char_tok():
    from posttrain.models import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def bpe_tok(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from posttrain.models import CHAT_TEMPLATE
    from posttrain_lab.studies.cit.world import GENERATORS, make_task, make_world

    world = make_world(0, 20)
    corpus = []
    for t in GENERATORS:
        for ex in make_task(t, 50, world=world, seed=0, split="train"):
            corpus += [ex.instruction, ex.input, ex.output]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = CHAT_TEMPLATE
    path = tmp_path_factory.mktemp("bpe")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)
