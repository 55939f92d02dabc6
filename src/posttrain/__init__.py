"""posttrain: LLM post-training that researchers can trust and actually run.

The flat Python API (loaded on first attribute access, so ``import posttrain`` stays light)::

    from posttrain import RLTrainer, RLConfig, SFTTrainer, Task, Example
"""

from posttrain import _compat

__version__ = "0.1.0"

_compat.install()  # old module paths (posttrain.sampling, posttrain.rm, ...) for one release
