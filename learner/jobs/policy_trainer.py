"""A policy's long-lived trainer: the base model, the lineage's LoRA and its AdamW, kept between runs.

Why: a run that loads the model and starts a fresh optimizer pays the load every time and
throws away the optimizer's moments, so consecutive runs do not compose like the steps of one
training. A `PolicyTrainer` loads the base model and tokenizer once; between runs it keeps the
peft model holding the version it produced last, and the optimizer that produced it. A run
then costs selection, tokenization, the optimizer steps on its new data and saving the adapter.

Which weights a run starts from is the lineage head's (apprentice.promotion.lineage):
- the trainer holds the head (it produced it, in this process): continue in memory, optimizer
  state carried over (AdamW's step count keeps growing);
- any other head (after a restart, or after the promotion job rejected the lineage and the
  head fell back to the promoted version): unload the LoRA from the base model, load the head's
  adapter from its files (a fresh LoRA for the base model) and start a fresh optimizer.

The optimizer state is not persisted beside the adapter files: an adapter directory stays what
vLLM loads and what retention deletes, nothing more. A restart costs one optimizer warm-up
(Adam's bias correction makes the first steps about lr-sized, as in any new training), which is
rare next to the runs; after a rejection a fresh optimizer is right anyway (the rejected
lineage's moments point where the canary lost).

A run that does not end with its candidate committed (a NaN, a crash, a failed commit) must not
leave the in-memory state ahead of the database: `attempt` snapshots the LoRA weights and the
optimizer state before training and restores them unless the run commits its version.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from apprentice.promotion.rows import AdapterVersion
from apprentice.settings import LearningSettings, PolicySettings

if TYPE_CHECKING:
    from learner.distributed.context import DistributedContext

log = logging.getLogger(__name__)


def training_threads(learning: LearningSettings) -> int:
    """torch intra-op threads for training: the setting, else half the cores (the local inference
    server takes the other half by default), at least 1."""
    return learning.threads or max(1, (os.cpu_count() or 2) // 2)


class PolicyTrainer:
    """The in-memory training state of one policy; see the module docstring.

    Not thread-safe: one run at a time (run_once holds the policy's advisory lock, and the
    scheduler runs one training at a time on a machine).
    """

    def __init__(self, policy: PolicySettings, distributed: DistributedContext | None = None) -> None:
        self.policy = policy
        # This process's rank in a torchrun group (learner/jobs/ranks.py); None: one process.
        self.distributed = distributed
        self.base: Any = None  # the base model, loaded once (the peft model wraps it in place)
        self.tokenizer: Any = None
        self.model: Any = None  # the PeftModel whose `default` adapter is the lineage's LoRA
        self.optimizer: Any = None  # AdamW over that adapter's parameters
        self.version: str | None = None  # the version id the LoRA holds now (None: a fresh LoRA, the base model)
        self.base_loads = 0
        self.adapter_loads = 0  # LoRAs loaded from files or created fresh (each with a fresh optimizer)
        self._committed = False

    @property
    def ready(self) -> bool:
        return self.model is not None

    def load_base(self) -> Any:
        """The tokenizer, loading the base model the first time (tokenization needs it before training)."""
        if self.base is None:
            from learner.models import load_base_model

            learning = self.policy.learning
            device: Any = None if learning.device == "auto" else learning.device
            dtype: Any = None if learning.dtype == "auto" else learning.dtype
            if self.distributed is not None:  # each rank on its own GPU (or the CPU under gloo)
                device = self.distributed.device(learning.device)
                if self.distributed.strategy == "fsdp":
                    # The whole model may not fit one GPU: it is loaded into host memory (in the
                    # GPU's dtype) and fully_shard moves each rank's shards to its GPU.
                    from learner.models import pick_dtype

                    dtype = pick_dtype(device, dtype)
                    device = "cpu"
            self.base, self.tokenizer = load_base_model(self.policy.base_model, device=device, dtype=dtype)
            self.base_loads += 1
        return self.tokenizer

    def start_from(self, head: AdapterVersion | None) -> str:
        """Hold the head's weights: "continued" (already held, optimizer kept), "loaded" (from its
        files) or "fresh" (a new LoRA: the head is the base model)."""
        import torch

        head_id = str(head.id) if head is not None else None
        if self.ready and self.version == head_id:
            return "continued"
        self.load_base()
        base = self.base if self.model is None else self.model.unload()  # the base model without LoRA layers
        self.model = self.optimizer = None
        try:
            model = self._lora(base, head)
        except BaseException:
            self.base = self.tokenizer = None  # it may hold half-injected LoRA layers: load it again next time
            raise
        self.adapter_loads += 1
        learning = self.policy.learning
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=learning.lr, weight_decay=learning.weight_decay)
        self.model, self.version = model, head_id
        log.info(
            "policy %s: training from %s (%s), fresh optimizer",
            self.policy.name,
            head.name if head is not None else "the base model",
            "its files" if head else "a new LoRA",
        )
        return "fresh" if head is None else "loaded"

    def _lora(self, base: Any, head: AdapterVersion | None) -> Any:
        """The head's adapter loaded trainable onto `base`, or a fresh LoRA for the base model."""
        import torch

        learning = self.policy.learning
        if head is None:
            from learner.grpo.adapters import new_lora

            torch.manual_seed(learning.seed)  # a fresh LoRA's A matrices
            return new_lora(
                base, learning.lora_rank, learning.lora_alpha, learning.lora_target_modules, learning.lora_dropout
            )
        from learner.grpo.adapters import continue_lora

        return continue_lora(base, head.path)

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        """Restores the LoRA weights and optimizer state of before the block unless `commit` was
        called in it: the in-memory state always equals the version it names."""
        held = self.version
        params = [p for p in self.model.parameters() if p.requires_grad]
        weights = [p.detach().clone() for p in params]
        optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        self._committed = False
        try:
            yield
        finally:
            if not self._committed:
                import torch

                with torch.no_grad():
                    for param, saved in zip(params, weights, strict=True):
                        param.copy_(saved)
                self.optimizer.load_state_dict(optimizer_state)
                self.version = held

    def commit(self, version_id: str) -> None:
        """The run's candidate is in the database: the LoRA now holds that version."""
        self.version = version_id
        self._committed = True

    def optimizer_steps(self) -> int:
        """AdamW's step count (the same for every parameter): how far this optimizer has come."""
        steps = [int(state["step"]) for state in self.optimizer.state.values() if "step" in state]
        return max(steps, default=0)
