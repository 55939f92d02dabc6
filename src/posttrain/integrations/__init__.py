"""Bridges to other training frameworks. Each submodule needs its framework (an extra):

* ``posttrain.integrations.verl`` — on import, registers posttrain's policy losses (``dgpo``,
  ``maspo``, ...) in verl's registries (``[verl]``).
* ``posttrain.integrations.trl`` — any posttrain policy loss inside TRL's ``GRPOTrainer`` (``[trl]``).

Reference and examples: ``docs/integrations.md``.
"""
