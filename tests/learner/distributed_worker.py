"""One rank of the two-process training test (tests/learner/test_distributed.py), started by torchrun:

    torchrun --standalone --nproc-per-node 2 -m tests.learner.distributed_worker MODEL ADAPTER OUT CASE...

Each case trains the same samples from the same starting adapter with the distributed trainer
and saves, per rank, the trained LoRA weights and the run's figures to OUT/<case>-rank<r>.pt.
The test trains the same cases in one process and compares. The samples and configs live here
so that both sides use exactly the same ones.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from apprentice.settings import LearningSettings

# case -> (kind, strategy, learning settings)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "ddp-token": ("grpo", "ddp", {"aggregation": "token"}),
    "ddp-sequence": ("grpo", "ddp", {"aggregation": "sequence", "kl_beta": 0.05}),
    "fsdp-token": ("grpo", "fsdp", {"aggregation": "token"}),
    "ddp-sft": ("sft", "ddp", {}),
}
# Two optimizer steps of three micro-batches of two, lr high enough to move the weights visibly.
BASE_LEARNING = {"lr": 5e-3, "micro_batch_size": 2, "grad_accumulation": 3, "seed": 7, "max_grad_norm": 100.0}


# Every prompt starts with it, as with a chat template's system prompt: the trainer runs a prefix
# that all rows of a micro-batch share once (trainer.shared_prefix_hidden), under each wrapper too.
SYSTEM_PROMPT = [1, *range(50, 60)]


def learning(case: str) -> LearningSettings:
    return LearningSettings(**{**BASE_LEARNING, **CASES[case][2]})


def samples() -> list[Any]:
    """Ten trajectories of different lengths and advantages (one with two segments), at two temperatures,
    their prompts sharing SYSTEM_PROMPT."""
    from learner.grpo.tokens import Segment
    from learner.grpo.trainer import TrainSample

    def segment(prompt: list[int], completion: list[int], temperature: float) -> Segment:
        mask = [False] * len(prompt) + [True] * len(completion)
        return Segment(prompt + completion, mask, None, temperature, None)

    out = []
    for i in range(10):
        prompt = SYSTEM_PROMPT + [20 + i, 30, 40 + 2 * i][: 1 + i % 3]
        completion = [100 + 7 * i + j for j in range(2 + (i * 5) % 6)] + [2]
        advantage = (1.0 if i % 2 else -1.0) * (0.5 + 0.1 * i)
        segments = [segment(prompt, completion, 1.0 if i % 3 else 0.7)]
        if i == 4:
            segments.append(segment(prompt + completion + [5, 6], [300, 301, 2], 1.0))
        out.append(TrainSample(f"t{i}", float(i % 2), advantage, segments))
    return out


def segments() -> list[Any]:
    return [segment for sample in samples() for segment in sample.segments]


def load_model(model_dir: str, adapter_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    from learner.grpo.adapters import continue_lora

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return continue_lora(base, adapter_dir)


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


def sft_config(learn: LearningSettings) -> Any:
    from learner.sft.trainer import SFTConfig

    return SFTConfig(
        lr=learn.lr,
        epochs=2,
        max_steps=None,
        micro_batch_size=learn.micro_batch_size,
        grad_accumulation=learn.grad_accumulation,
        max_grad_norm=learn.max_grad_norm,
        max_seq_len=learn.max_seq_len,
        seed=learn.seed,
    )


def figures(result: Any) -> dict[str, Any]:
    """The run's figures that a wrong reduction would change (the loss, the gradient norm before clipping)."""
    if hasattr(result, "losses"):
        return {"losses": list(result.losses), "loss_tokens": result.loss_tokens}
    return {
        "loss": result.loss,
        "grad_norm": result.grad_norm,
        "kl": result.kl,
        "loss_tokens": result.loss_tokens,
        "tokens": result.tokens,
        "samples": result.samples,
        "optimizer_steps": result.optimizer_steps,
        "history_loss": [h["loss"] for h in result.history],
    }


def main(model_dir: str, adapter_dir: str, out_dir: str, cases: list[str]) -> None:
    from learner.distributed.context import from_environment
    from learner.distributed.grpo import DistributedGRPOTrainer
    from learner.distributed.sft import train_sft_distributed
    from learner.grpo.trainer import TrainerConfig

    torch.set_num_threads(1)
    context = from_environment()
    assert context is not None, "run me under torchrun with more than one process"
    for case in cases:
        kind, strategy, _ = CASES[case]
        context.strategy = strategy  # type: ignore[assignment]
        learn = learning(case)
        model = load_model(model_dir, adapter_dir)
        torch.manual_seed(learn.seed)
        if kind == "sft":
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learn.lr)
            result, state = train_sft_distributed(model, optimizer, segments(), sft_config(learn), 0, context)
        else:
            trainer = DistributedGRPOTrainer(
                model, TrainerConfig.from_settings(learn), distributed=context, fresh=False, pad_token_id=0
            )
            result = trainer.train(samples())
            state = trainer.adapter_state
        torch.save(
            {"state": state if state is not None else trainable_state(model), "figures": figures(result)},
            Path(out_dir) / f"{case}-rank{context.rank}.pt",
        )
    context.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
