"""Apprentice's core: what the gateway and the learner both need, importing neither.

Settings, the store's engine and tables, the adapter lifecycle and promotion (SQL and HTTP
only), the `apprentice` command line and the `up` supervisor. Nothing here imports torch,
`gateway` or `learner`: the import-linter contracts in pyproject.toml enforce it.
"""

__version__ = "0.1.0"
