"""Research studies built on the library: continual instruction tuning (``cit``), instruction-tuning
knowledge analyses (``analysis``) and syntax-oriented seq2seq pre-training (``scpg``). Each study
imports the core and never another study or a recipe."""
