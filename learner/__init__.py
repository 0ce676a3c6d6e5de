"""The learner: GRPO on LoRA from rewarded trajectories, adapter promotion, local inference."""
