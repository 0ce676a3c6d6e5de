"""Options and set-up shared by the CLI commands."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from apprentice.settings import ConfigError, Settings, load_settings
from apprentice.store.engine import ensure_database_url, redact


def config_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--config",
        "-c",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        envvar="APPRENTICE_CONFIG",
        help="YAML config file (default: $APPRENTICE_CONFIG).",
    )(function)


def load(config_path: str | None, **overrides: Any) -> Settings:
    try:
        settings = load_settings(config_path, **overrides)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(f"configuration: {exc}") from exc
    if config_path:
        os.environ["APPRENTICE_CONFIG"] = str(Path(config_path).resolve())
    return settings


def database_url(settings: Settings) -> str:
    url = ensure_database_url(settings.database_url, settings.data_dir)
    logging.getLogger("apprentice").info("database: %s", redact(url))
    return url


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("LiteLLM", "litellm", "httpx", "aiohttp.access", "pgserver"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
