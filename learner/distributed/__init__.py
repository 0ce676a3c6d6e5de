"""Training on several processes (torchrun): the process group, the share of each rank, the wrapped
model (DDP or FSDP2) and the distributed GRPO and SFT trainers.

Nothing here is imported by a one-process run: `learner/jobs` reaches it only when the
environment says torchrun started the process (WORLD_SIZE > 1). See docs/learner.md, "Several GPUs".
"""
