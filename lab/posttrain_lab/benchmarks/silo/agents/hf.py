"""Local Hugging Face model as a SILO-BENCH agent.

Loads a local model directory or a tiny preset through `posttrain.models.load_model_and_tokenizer`,
renders the chat history with the tokenizer's chat template (``add_generation_prompt=True``) and
generates at most ``max_new_tokens`` tokens (greedy when ``temperature == 0``, else sampling with a
seeded generator). Usage is reported from the actual token counts (prompt, completion).

Context limit: if the rendered prompt is longer than ``max_context - max_new_tokens`` tokens, the
oldest tokens are dropped (left truncation) and this is counted in `truncations` — small local models
have short windows; the paper's runs used 128K-context endpoints.

Generation runs in a worker thread (``asyncio.to_thread``) behind a lock: one model, one generate call
at a time (N seats share it).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.benchmarks.silo.agents.base import Agent, AgentReply


class HFAgent(Agent):
    def __init__(
        self,
        model: str,
        *,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        max_context: int | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
    ) -> None:
        from posttrain.models import load_model_and_tokenizer

        if max_new_tokens < 1:
            raise InvalidValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model, self.tokenizer = load_model_and_tokenizer(model, dtype=dtype, device=device, seed=seed)
        self.name = f"hf:{model}"
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        limit = getattr(self.model.config, "max_position_embeddings", None) or 4096
        self.max_context = min(max_context or limit, limit)
        if self.max_context <= max_new_tokens:
            raise InvalidValueError(
                f"max_context {self.max_context} must exceed max_new_tokens {max_new_tokens}"
            )
        self.device = device
        self.seed = seed
        self.calls = 0
        self.truncations = 0
        self._lock = threading.Lock()

    async def reply(self, messages: list[dict[str, str]]) -> AgentReply:
        return await asyncio.to_thread(self._generate, messages)

    def _generate(self, messages: list[dict[str, str]]) -> AgentReply:
        import torch

        with self._lock:
            ids: Any = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys") and "input_ids" in ids:
                ids = ids["input_ids"]
            ids = list(ids)
            budget = self.max_context - self.max_new_tokens
            if len(ids) > budget:
                ids = ids[-budget:]
                self.truncations += 1
            input_ids = torch.tensor([ids], device=self.device)
            gen_kwargs: dict[str, Any] = {
                "max_new_tokens": self.max_new_tokens,
                "pad_token_id": self.tokenizer.pad_token_id,
                "attention_mask": torch.ones_like(input_ids),
            }
            if self.temperature > 0:
                torch.manual_seed(self.seed + self.calls)
                gen_kwargs.update(do_sample=True, temperature=self.temperature)
            else:
                gen_kwargs.update(do_sample=False)
            self.calls += 1
            with torch.no_grad():
                out = self.model.generate(input_ids, **gen_kwargs)
            new = out[0, input_ids.shape[1] :].tolist()
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            return AgentReply(text, {"prompt_tokens": len(ids), "completion_tokens": len(new)})
