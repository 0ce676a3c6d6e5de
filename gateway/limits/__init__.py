"""Per-key and per-tenant rate limits and spend budgets, decided without the database.

`limiter.py` decides on the request path from this process's view of each window (its own
counts plus the other processes' counts as last exchanged); `sync.py` exchanges the counts
through PostgreSQL in the background; `windows.py` is the sliding-window arithmetic;
`prices.py` turns a call's usage into dollars. docs/limits.md states the design and the bound.
"""
