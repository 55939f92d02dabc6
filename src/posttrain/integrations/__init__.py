"""Bridges to other training frameworks. Each submodule needs its framework (an extra):

* ``posttrain.integrations.verl`` — on import, registers posttrain's policy losses (``dgpo``,
  ``maspo``, ...) in verl's registries (``[verl]``).
* ``posttrain.integrations.trl`` — any posttrain policy loss inside TRL's ``GRPOTrainer`` (``[trl]``).
* ``posttrain.integrations.lm_eval`` — on import, registers ``posttrain`` as an lm-evaluation-harness
  model; ``run_harness`` scores any posttrain model on lm-eval tasks, offline (``[lm-eval]``,
  ``docs/lm-eval.md``).

Reference and examples: ``docs/integrations.md``.
"""
