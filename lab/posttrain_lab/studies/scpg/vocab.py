"""DSMT vocabulary set-up (``curriculum_pre_training/tree_task_data_utils.py`` of ``ChristLBUPT/DSMT-T5``).

Step A (``get_tokenizer_and_model_with_node_tokens``), before stage 1: add ``<node_0..99>``,
``</node_0..99>``, ``<H_1..40>``, ``<S_1..40>``, ``<none>``, ``<sep>``; the input embedding of
``<node_k>``, ``</node_k>``, ``<H_k>``, ``<S_k>`` is a copy of the embedding of the (last) token of the
digit string ``"k"``, and ``<none>`` / ``<sep>`` copy ``<unk>``. ``<tgt>`` (used by the
``triplet_sentencetree`` format) is added too when the tokenizer lacks it, initialised from ``<unk>``.

Step B (``add_NT_tokens_to_model``), after stage 1: add the corpus' non-terminal labels (the authors'
``NT.pkl``; here :func:`nonterminal_inventory` of the parses), each initialised with a draw from
N(mean, std) of the ``<node_*>`` embeddings, per dimension (``init="node"``), or as a copy of ``<unk>``
(``init="unk"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.scpg.trees import Tree

N_NODES = 100
N_HS = 40


def node_tokens() -> list[str]:
    return [
        *(f"<node_{i}>" for i in range(N_NODES)),
        *(f"</node_{i}>" for i in range(N_NODES)),
        *(f"<H_{i}>" for i in range(1, N_HS + 1)),
        *(f"<S_{i}>" for i in range(1, N_HS + 1)),
        "<none>",
        "<sep>",
    ]


def _source_token(tok: str) -> str | None:
    """The digit string whose embedding ``tok`` copies (None: copy ``<unk>``)."""
    for head in ("<node_", "</node_", "<H_", "<S_"):
        if tok.startswith(head):
            return tok[len(head) : -1]
    return None


def _token_id(tokenizer: Any, tok: str) -> int:
    ids = tokenizer.encode(tok, add_special_tokens=False)
    if len(ids) != 1:
        raise InvalidValueError(
            f"token {tok!r} encodes to {len(ids)} ids {ids}; it was not added as one token"
        )
    return int(ids[0])


def _add(tokenizer: Any, tokens: list[str], *, single_word: bool) -> list[str]:
    from tokenizers import AddedToken

    have = tokenizer.get_vocab()
    new = [t for t in tokens if t not in have]
    tokenizer.add_tokens([AddedToken(t, single_word=single_word, normalized=False) for t in new])
    return new


def add_node_tokens(model: Any, tokenizer: Any) -> list[str]:
    """Step A on ``model`` / ``tokenizer`` in place; returns the tokens that were new."""
    import torch

    toks = node_tokens()
    if "<tgt>" not in tokenizer.get_vocab():
        toks.append("<tgt>")
    new = _add(tokenizer, toks, single_word=False)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    emb = model.get_input_embeddings().weight
    unk = tokenizer.unk_token_id
    if unk is None:
        raise InvalidValueError(
            "add_node_tokens: the tokenizer has no unk token to initialise <none>/<sep> from"
        )
    with torch.no_grad():
        for tok in new:
            src = _source_token(tok)
            src_id = tokenizer.encode(src, add_special_tokens=False)[-1] if src is not None else unk
            emb[_token_id(tokenizer, tok)] = emb[src_id]
    return new


def nonterminal_inventory(trees: Iterable[Tree]) -> list[str]:
    """Sorted non-terminal labels (pre-terminals included) of ``trees`` — the authors' ``NT.pkl``."""
    labels: set[str] = set()
    for t in trees:
        labels.update(t.nonterminals())
    return sorted(labels)


def add_nonterminal_tokens(
    model: Any, tokenizer: Any, labels: list[str], *, init: Literal["node", "unk"] = "node", seed: int = 0
) -> list[str]:
    """Step B in place (after :func:`add_node_tokens`); returns the labels that were new."""
    import torch

    if init not in ("node", "unk"):
        raise InvalidValueError(f"add_nonterminal_tokens: init must be 'node' or 'unk', got {init!r}")
    new = _add(tokenizer, list(labels), single_word=True)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        if init == "node":
            node = emb[[_token_id(tokenizer, f"<node_{i}>") for i in range(N_NODES)]]
            mean, std = node.mean(dim=0), node.std(dim=0)
            g = torch.Generator(device="cpu").manual_seed(seed)
            for tok in new:
                z = torch.randn(mean.shape, generator=g).to(emb.device, emb.dtype)
                emb[_token_id(tokenizer, tok)] = z * std + mean
        else:
            unk = emb[tokenizer.unk_token_id].clone()
            for tok in new:
                emb[_token_id(tokenizer, tok)] = unk
    return new
