"""GRPO on LoRA: grouping, advantages, tokens and masks, the loss, the trainer, adapter files.

`grouping` and `advantages` are pure Python (no torch), so the scheduler and the selection
code can use them without loading the training stack.
"""
