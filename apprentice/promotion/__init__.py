"""Promotion of trained adapters: candidate -> canary -> promoted (or rejected), rollback.

- `lifecycle`: the state machine in PostgreSQL (row locks, one transaction per transition).
- `gates`: checks on the training run before a candidate may serve a canary.
- `loading`: vLLM's LoRA HTTP API at every endpoint of a policy, retried and verified.
- `evaluation`: canary vs promoted rewards (Welch t interval or bootstrap).
- `retention`: which versions' files to delete.
- `service`: what the admin API and the periodic job call; `promotion_tick(engine, settings)`.

Nothing here imports torch: the gateway's admin API uses these modules.
"""
