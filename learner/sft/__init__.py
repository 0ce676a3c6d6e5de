"""Supervised fine-tuning of a policy's LoRA on a teacher's answers (distillation, docs/distillation.md)."""
