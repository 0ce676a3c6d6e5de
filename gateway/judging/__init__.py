"""LLM judging of groups: prompt, answer, store, job and worker (docs/judge.md)."""
