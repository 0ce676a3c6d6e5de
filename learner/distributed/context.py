"""The process group of a run started by torchrun, and the few collectives the learner uses.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in every worker's
environment; `from_environment` reads them and joins the group: gloo on CPU, nccl on CUDA
(each rank on the GPU of its LOCAL_RANK). A process without WORLD_SIZE, or with WORLD_SIZE 1,
is an ordinary one-process run and gets None: the one-process code path stays untouched.

Rank 0 is the leader: it alone talks to PostgreSQL and writes adapter files; it tells the
other ranks what to train with `send` (a pickled object broadcast from rank 0), and they
`receive` it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Strategy = Literal["ddp", "fsdp"]


@dataclass
class DistributedContext:
    """This process's place in the group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "gloo" or "nccl"
    strategy: Strategy
    # Rank 0 only: it sent a training job whose collectives have not all completed. If its run
    # fails meanwhile, the other ranks are inside a collective and cannot take a message: the
    # group is stopped instead (learner/jobs/ranks.py).
    training: bool = False
    # Rank 0 only: the other ranks were told the run is over (they have left or are leaving).
    released: bool = False

    @property
    def leader(self) -> bool:
        """Rank 0: the one process that reads and writes the database and the adapter files."""
        return self.rank == 0

    def device(self, requested: str = "auto") -> torch.device:
        """This rank's device: its own GPU under nccl (cuda:LOCAL_RANK), else the CPU."""
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", self.local_rank)
        if requested not in ("auto", "cpu"):
            raise ValueError(f"learning.device {requested!r} under the gloo backend: only the CPU is used")
        return torch.device("cpu")

    def send(self, message: Any) -> None:
        """Rank 0: broadcast `message` (any picklable object) to every other rank."""
        if not self.leader:
            raise RuntimeError("only rank 0 sends")
        _broadcast(message)

    def receive(self) -> Any:
        """Any rank but 0: the next object rank 0 sends."""
        if self.leader:
            raise RuntimeError("rank 0 does not receive")
        return _broadcast(None)

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over ranks, in float64 (statistics: losses, token counts)."""
        import torch
        import torch.distributed as dist

        device = self.device() if self.backend == "nccl" else torch.device("cpu")
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return [float(v) for v in tensor.cpu()]

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.backend == "nccl":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _broadcast(message: Any) -> Any:
    import torch.distributed as dist

    holder = [message]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def launched_by_torchrun() -> bool:
    """The environment of a torchrun worker in a group of more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def from_environment(strategy: Strategy = "ddp", timeout_s: float = 1800.0) -> DistributedContext | None:
    """Join the process group torchrun set up; None for a one-process run.

    `timeout_s` bounds every collective: a rank that dies mid-run makes the others fail after it
    instead of hanging (torchrun also stops the whole group when one worker exits with an error).
    """
    if not launched_by_torchrun():
        return None
    import torch
    import torch.distributed as dist

    rank, world, local = (int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
        if backend == "nccl":
            kwargs["device_id"] = torch.device("cuda", local)
        dist.init_process_group(**kwargs)
    return DistributedContext(rank, world, local, backend, strategy)
