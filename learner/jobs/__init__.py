"""The learner as a job: select what to train on, run GRPO, record a candidate; the scheduler and CLI."""
