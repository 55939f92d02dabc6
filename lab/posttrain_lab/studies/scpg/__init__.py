"""DSMT: syntax-oriented two-stage multi-task pre-training of T5 and syntactically controlled
paraphrase generation (SCPG) — Liu, Wang, Sun, Zeng, Wan, Findings ACL 2024 (2024.findings-acl.845);
authors' code ``ChristLBUPT/DSMT-T5``.

- :mod:`posttrain_lab.studies.scpg.trees` — constituency trees (bracket / slash linearisations, positions, pruning)
- :mod:`posttrain_lab.studies.scpg.tasks` — stage-1 / stage-2 pre-training task formatters, SCPG input formats
- :mod:`posttrain_lab.studies.scpg.vocab` — special tokens and their embedding initialisation
- :mod:`posttrain_lab.studies.scpg.data` — synthetic PCFG corpus, its exact parser, SGCP-layout loaders
- :mod:`posttrain_lab.studies.scpg.metrics` — BLEU-4, tree edit distance (TED-R / TED-E), bracket F1
- :mod:`posttrain_lab.studies.scpg.run` — pre-training, fine-tuning and evaluation on a seq2seq adapter

Only ``trees`` is imported here (no torch).
"""

from __future__ import annotations

from posttrain_lab.studies.scpg.trees import Tree

__all__ = ["Tree"]
