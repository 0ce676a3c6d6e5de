"""Reward functions: the operator's scorers for trajectories no client rewarded (docs/reward-functions.md)."""
