"""Method recipes: one folder per method, with its code (hooks, losses wiring, demos), its shipped
YAML configs and a README (what it is, source, how to run, what was measured).

A recipe imports the core (``posttrain.hooks``, ``rollout``, ``train`` ...) and never another recipe
(an import-linter ``independence`` contract in ``make test``). The core lists each recipe's hooks by
name without importing it (lazy registration, :mod:`posttrain.utils.registry`).
"""
