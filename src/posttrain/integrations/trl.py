"""Any posttrain policy loss inside TRL's ``GRPOTrainer``.

:class:`PosttrainGRPOTrainer` is TRL's ``GRPOTrainer`` (generation, rewards, group advantages,
vLLM, logging, accelerate / DeepSpeed unchanged) whose loss is a posttrain policy loss::

    from posttrain.integrations.trl import PosttrainGRPOTrainer

    trainer = PosttrainGRPOTrainer(
        model=..., reward_funcs=[...], args=GRPOConfig(...), train_dataset=...,
        loss="dgpo",                       # any name of posttrain.algos.list_policy_losses()
        loss_params={"dgpo_n": 1},         # the loss's own parameters (default: the authors')
        loss_agg=None,                     # aggregation mode (default: the loss's own)
    )

It replaces ``GRPOTrainer._compute_loss`` only: TRL's per-token log-probs of the completion
(``_get_per_token_logps_and_entropies``), TRL's ``old_per_token_logps`` (or the detached current
log-probs when TRL skips them), TRL's ``advantages`` and ``completion_mask`` (times ``tool_mask``)
go into ``get_policy_loss(loss)(logp, old_logp, advantages, mask, agg=loss_agg, **loss_params)``.
What TRL adds on top is kept: vLLM importance-sampling correction (``importance_sampling_ratio`` as
the loss's ``is_weights``), the KL term when ``beta != 0`` (TRL's k3 estimator, aggregated like the
loss), and the division by the gradient-accumulation steps. Losses that declare extra inputs get them
from TRL: ``entropy`` (TRL's per-token entropies), ``ref_logp`` (``ref_per_token_logps``, needs
``beta != 0``), ``rollout_logp`` (``sampling_per_token_logps``, needs vLLM). TRL's own ``loss_type``,
``epsilon`` and ``delta`` are not used. Metrics are logged as ``posttrain/<metric>``.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.algos import get_policy_loss, policy_loss_default_agg
from posttrain.algos._common import check_param_names
from posttrain.utils.errors import InvalidValueError

try:
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised by the import-error test
    raise ImportError(
        f'posttrain.integrations.trl needs TRL ({e}); install the trl extra: pip install -e ".[trl]"'
    ) from e


class PosttrainGRPOTrainer(GRPOTrainer):
    """TRL ``GRPOTrainer`` with a posttrain policy loss (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        loss: str = "ppo",
        loss_params: dict[str, Any] | None = None,
        loss_agg: str | None = None,
        **kwargs: Any,
    ) -> None:
        policy_loss = get_policy_loss(loss)  # unknown names: error listing the known ones
        params = dict(loss_params or {})
        check_param_names("policy loss", policy_loss.name, params, policy_loss.defaults)
        policy_loss._validate(policy_loss.name, {**policy_loss.defaults, **params})
        super().__init__(*args, **kwargs)
        if "ref_logp" in policy_loss.inputs and self.beta == 0.0:
            raise InvalidValueError(
                f"policy loss {policy_loss.name!r} needs reference log-probs; TRL computes them only with "
                "beta != 0 (GRPOConfig.beta)"
            )
        if "rollout_logp" in policy_loss.inputs and not self.use_vllm:
            raise InvalidValueError(
                f"policy loss {policy_loss.name!r} needs sampling log-probs; TRL records them only with "
                "vLLM generation (GRPOConfig.use_vllm=True)"
            )
        self.posttrain_loss = policy_loss
        self.posttrain_loss_params = params
        self.posttrain_loss_agg = loss_agg or policy_loss_default_agg(policy_loss.name)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        pl = self.posttrain_loss
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        logp, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old
        available = {
            "entropy": entropies,
            "ref_logp": inputs.get("ref_per_token_logps"),
            "rollout_logp": inputs.get("sampling_per_token_logps"),
        }
        extra = {k: available[k] for k in pl.inputs}
        is_weights = None
        if self.use_vllm and getattr(self, "vllm_importance_sampling_correction", False):
            is_weights = inputs.get("importance_sampling_ratio")
            if is_weights is not None and is_weights.shape != logp.shape:
                is_weights = is_weights.expand_as(logp)
        loss, metrics = pl(
            logp,
            old,
            inputs["advantages"],
            mask,
            agg=self.posttrain_loss_agg,
            is_weights=is_weights,
            inputs=extra or None,
            **self.posttrain_loss_params,
        )
        mode = "train" if self.model.training else "eval"
        if self.beta != 0.0:
            from posttrain.algos import agg_loss

            ref = inputs["ref_per_token_logps"]
            kl = torch.exp(ref - logp) - (ref - logp) - 1  # TRL's k3 estimator
            loss = loss + self.beta * agg_loss(kl, mask, self.posttrain_loss_agg)
            self._metrics[mode]["kl"].append(float((kl.detach() * mask).sum() / mask.sum().clamp(min=1)))
        if mode == "train":
            # set by transformers' training loop; a direct call outside train() counts as one micro-batch
            loss = loss / getattr(self, "current_gradient_accumulation_steps", 1)
        for k, v in metrics.items():
            self._metrics[mode][f"posttrain/{k}"].append(float(v))
        if entropies is not None:
            self._metrics[mode]["entropy"].append(
                float((entropies.detach() * mask).sum() / mask.sum().clamp(min=1))
            )
        return loss


__all__ = ["PosttrainGRPOTrainer"]
