"""The core's own commands: `apprentice db` and `apprentice up`; the shared CLI options."""
