"""`apprentice up`: everything on embedded defaults, for a laptop or a first look.

With nothing configured: PostgreSQL embedded under .apprentice/, the schema brought to the
code's revision, and the gateway on 127.0.0.1:8000 in open mode (no keys, loopback only).
Models come from the config file (APPRENTICE_CONFIG or --config); without one, every model
name is passed through to OpenAI with $OPENAI_API_KEY.
"""

from __future__ import annotations

import os

import click

from gateway.commands.common import config_option, database_url, load, setup_logging
from gateway.commands.serve import serve
from gateway.store import schema


def default_model_list() -> list[dict[str, object]]:
    params: dict[str, object] = {"model": "openai/*"}
    if os.environ.get("OPENAI_API_KEY"):
        params["api_key"] = "os.environ/OPENAI_API_KEY"
    return [{"model_name": "*", "litellm_params": params}]


@click.command("up")
@config_option
@click.option("--port", type=int, default=None, help="Gateway port (default 8000).")
def up_command(config_path: str | None, port: int | None) -> None:
    """Start Apprentice with embedded defaults (Ctrl-C stops it)."""
    settings = load(config_path)
    setup_logging(settings.log_level)
    overrides: dict[str, object] = {}
    if not settings.model_list and not settings.policies:
        overrides["model_list"] = default_model_list()
    if "auth" not in settings.model_fields_set:
        overrides["auth"] = {"mode": "open"}
    if overrides:
        settings = load(config_path, **overrides)
    schema.upgrade(database_url(settings))
    key_hint = ("any value (open mode: no keys, loopback only)" if settings.auth.mode == "open"
                else "a key from `apprentice keys create`")
    click.echo(f"\n  export OPENAI_BASE_URL=http://{settings.host}:{port or settings.port}/v1"
               f"\n  OPENAI_API_KEY: {key_hint}\n", err=True)
    serve(settings, port=port, workers=1)
