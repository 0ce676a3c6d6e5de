"""The local inference server: transformers + peft behind vLLM's OpenAI-compatible HTTP API.

Layout follows vLLM's `entrypoints/openai/`: `protocol` holds the wire types, `adapters` the
LoRA registry, `engine` the batching generation loop, `app` the HTTP routes and `cli` the
`apprentice serve-model` / `apprentice fetch-model` commands. Only `cli` is imported by the
command line, and it imports torch lazily.
"""
