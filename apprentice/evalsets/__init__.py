"""Evaluation sets: held-out items a policy's versions are scored on (docs/evaluation-sets.md).

`scoring` (how one answer is scored), `store` (the one writer of the eval_* tables), `runner`
(a version answers every item through the policy's inference endpoints), `paired` (the paired
non-inferiority test) and `gate` (the promotion's evaluation gate before a canary serves).
"""
