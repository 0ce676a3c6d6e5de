"""Promotion of trained adapters: candidate -> canary -> promoted (or rejected), rollback.

- `lifecycle`: the state machine in PostgreSQL (row locks, one transaction per transition).
- `gates`: checks on the training run before a candidate may serve a canary.
- `loading`: vLLM's LoRA HTTP API at every endpoint of a policy, retried and verified.
- `evaluation`: canary vs promoted rewards (Welch t interval or bootstrap).
- `retention`: which versions' files to delete.
- `actions`: what an admin does (approve, reject, promote now, roll back, pause).
- `tick`: the periodic job, `promotion_tick(engine, settings)`.
- `listing`: the read models of the admin API and the dashboard.
- `serving`, `canary`, `reconcile`, `gate_checks`: what those three share (making a version
  serve, the canary's evaluation, endpoints and adapter store made to hold what serves, a
  version's gates); none of the three imports another (pyproject.toml, import-linter).

Nothing here imports torch: the gateway's admin API uses these modules.
"""
