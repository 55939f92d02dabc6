"""How the trainer's weights reach whatever generates: one :class:`WeightSync` strategy per transport.

The trainer calls :meth:`WeightSync.publish` once per step, before the step's rollout, with the policy
version it publishes (the step counter: the number of optimizer steps behind the weights). The builder
picks the strategy (:func:`choose_weight_sync`):

* :class:`SharedWeights`: the engine samples from the trainer's own module (HF, the fast CPU engine):
  nothing moves;
* :class:`EngineReload`: an engine that holds its own copy (vLLM in the trainer's process) reloads it
  from the module: every weight, or with LoRA only the adapter (``VLLMEngine.sync_weights``);
* :class:`ObjectStoreWeights`: generation workers (asynchronous rollout) read the weights of a version
  from Ray's object store, put there once per version; with ``trainable_only`` (LoRA) only the
  parameters that train are sent (the frozen base never changes).

The anchors: slime's ``update_weight_from_tensor`` / ``_from_distributed`` (a class per transport),
TRL's async worker (pause, send weights, resume).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from posttrain.rollout import RolloutEngine
from posttrain.utils.errors import PosttrainRuntimeError


class WeightSync(ABC):
    """Publishes the policy's weights to the generators; ``version`` is the last version published."""

    version: int | None = None

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Make ``model``'s weights, as policy ``version``, what generation uses from now on. Publishing
        the version already published does nothing."""
        if version == self.version:
            return
        self._send(model, version)
        self.version = version

    @abstractmethod
    def _send(self, model: torch.nn.Module, version: int) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the transport holds."""


class SharedWeights(WeightSync):
    """The engine generates with the trainer's module itself: nothing to send."""

    def _send(self, model: torch.nn.Module, version: int) -> None:
        return None


class EngineReload(WeightSync):
    """An in-process engine with its own copy of the weights reloads them (``engine.sync_weights``)."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine

    def _send(self, model: torch.nn.Module, version: int) -> None:
        self.engine.sync_weights(model)


class ObjectStoreWeights(WeightSync):
    """Weights put in Ray's object store once per version; :meth:`latest` is what workers load
    (a version and an object reference of ``{name: tensor}`` on the CPU)."""

    def __init__(self, put: Any, *, trainable_only: bool = False) -> None:
        self.put, self.trainable_only = put, trainable_only
        self.ref: Any = None
        self.sends = 0

    def _send(self, model: torch.nn.Module, version: int) -> None:
        self.ref = self.put(weights_of(model, trainable_only=self.trainable_only))
        self.sends += 1

    def latest(self) -> tuple[int, Any]:
        if self.version is None:
            raise PosttrainRuntimeError("ObjectStoreWeights: no version published yet")
        return self.version, self.ref

    def close(self) -> None:
        self.ref = None


def weights_of(model: torch.nn.Module, *, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The model's state on the CPU (detached copies); ``trainable_only``: the parameters that train."""
    if trainable_only:
        return {k: p.detach().to("cpu", copy=True) for k, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def choose_weight_sync(engine: RolloutEngine | None, *, put: Any = None, trainable_only: bool = False) -> WeightSync:
    """The strategy for a run: the object store when ``put`` (Ray's) is given (generation workers),
    else an engine reload when the engine keeps its own weights (``engine.shares_model`` False), else
    shared weights."""
    if put is not None:
        return ObjectStoreWeights(put, trainable_only=trainable_only)
    if engine is not None and not engine.shares_model:
        return EngineReload(engine)
    return SharedWeights()
