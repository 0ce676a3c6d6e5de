"""The gateway: an OpenAI-compatible proxy that records every call as trajectories."""

__version__ = "0.1.0"
