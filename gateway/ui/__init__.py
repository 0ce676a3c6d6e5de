"""The web dashboard, served by the gateway under /ui (docs/dashboard.md)."""
