"""What each process of a torchrun-launched run does (`torchrun --nproc-per-node N -m learner.jobs.one_run`).

Rank 0 runs the ordinary one-run code (learner/jobs/run.py, distill.py): the policy's advisory
lock, the `training_runs` row, selection, tokenization, and at the end the adapter files and the
transaction that records the candidate. The other ranks never touch PostgreSQL or the adapter
directory: they wait for rank 0's messages,

- `TrainingJob`: what to train (the samples, the version to start from, the saved versions that
  sampled the data); each rank loads that version from the shared adapter directory, trains its
  share with the distributed trainer, and waits for the next message;
- `Done`: the run is over, with the exit status every rank ends with.

A run that ends before training (lock busy, paused, nothing to learn) sends `Done` at once.
If rank 0's run fails while the ranks are inside the training's collectives (anything but a
NaN, which every rank raises at the same step), no message can reach them: rank 0 exits with an
error and torchrun stops the group; its run row says `failed`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from apprentice.settings import PolicySettings
from learner.distributed.context import DistributedContext
from learner.jobs.policy_trainer import PolicyTrainer, training_threads

if TYPE_CHECKING:
    from apprentice.promotion.rows import AdapterVersion
    from learner.grpo.tokens import Segment
    from learner.grpo.trainer import TrainSample

log = logging.getLogger(__name__)


@dataclass
class TrainingJob:
    """Rank 0 -> the other ranks: train this, from this version."""

    kind: Literal["rl", "sft"]
    head: AdapterVersion | None  # the version to start from (None: a fresh LoRA)
    samples: list[TrainSample] = field(default_factory=list)  # rl
    version_paths: dict[str, str] = field(default_factory=dict)  # rl: saved versions that sampled the data
    segments: list[Segment] = field(default_factory=list)  # sft
    sft_config: Any = None  # sft: learner.sft.trainer.SFTConfig


@dataclass
class Done:
    """Rank 0 -> the other ranks: the run is over; exit with this status."""

    exit_code: int


def send_training(context: DistributedContext, job: TrainingJob) -> None:
    """Rank 0: hand the other ranks their training job; they take part from here."""
    context.send(job)
    context.training = True


def training_returned(context: DistributedContext) -> None:
    """Rank 0: the distributed training returned (or raised on every rank): the ranks wait for a message again."""
    context.training = False


def release(context: DistributedContext, exit_code: int) -> bool:
    """Rank 0: tell the other ranks the run is over. False when they cannot hear it (rank 0 failed
    inside the training's collectives): the caller must exit with an error so torchrun stops them."""
    if context.released:
        return True
    if context.training:
        return False
    context.send(Done(exit_code))
    context.released = True
    return True


def follow(policy: PolicySettings, context: DistributedContext) -> int:
    """A rank other than 0: train what rank 0 sends until it says the run is over; its exit status."""
    import torch

    from learner.grpo.trainer import NonFiniteLoss

    trainer = PolicyTrainer(policy, context)
    learning = policy.learning
    while True:
        message = context.receive()
        if isinstance(message, Done):
            return message.exit_code
        job: TrainingJob = message
        torch.set_num_threads(training_threads(learning))
        trainer.load_base()
        trainer.start_from(job.head)
        with trainer.attempt():
            torch.manual_seed(learning.seed)
            try:
                train_share(trainer, job, context)
            except NonFiniteLoss as exc:  # raised on every rank at the same step; rank 0 records it
                log.warning("rank %d: %s", context.rank, exc)


def train_share(trainer: PolicyTrainer, job: TrainingJob, context: DistributedContext) -> Any:
    """This rank's part of the job, with the same trainer rank 0 uses."""
    learning = trainer.policy.learning
    pad = trainer.tokenizer.pad_token_id or 0
    if job.kind == "sft":
        from learner.distributed.sft import train_sft_distributed

        return train_sft_distributed(trainer.model, trainer.optimizer, job.segments, job.sft_config, pad, context)
    from learner.distributed.grpo import DistributedGRPOTrainer
    from learner.grpo.trainer import TrainerConfig

    head = job.head
    return DistributedGRPOTrainer(
        trainer.model,
        TrainerConfig.from_settings(learning),
        distributed=context,
        start_version=str(head.id) if head else None,
        version_paths=job.version_paths,
        fresh=head is None,
        pad_token_id=pad,
        progress=False,
        optimizer=trainer.optimizer,
    ).train(job.samples)
