"""The `apprentice` command line.

Commands are loaded lazily: `apprentice keys create` must not pay for importing the learner
(torch) or litellm. Each entry of LAZY_COMMANDS names "module:attribute" of a click command.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

LAZY_COMMANDS: dict[str, str] = {
    "gateway": "gateway.commands.serve:gateway_command",
    "db": "gateway.commands.db:db_group",
    "keys": "gateway.commands.keys:keys_group",
    "up": "gateway.commands.up:up_command",
    "serve-model": "learner.serving.cli:serve_model_command",
    "fetch-model": "learner.serving.cli:fetch_model_command",
    "learner": "learner.jobs.cli:learner_command",
    "learn": "learner.jobs.cli:learn_command",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when they are invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS:
            module_name, attribute = LAZY_COMMANDS[cmd_name].split(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                if exc.name and module_name.startswith(exc.name.split(".")[0]):
                    return None  # not built yet in this checkout
                raise click.ClickException(
                    f"'apprentice {cmd_name}' needs a package that is not installed ({exc.name}); "
                    "install the extras: pip install -e '.[learner]'"
                ) from exc
            return getattr(module, attribute, None)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="apprentice")
def main(**_: Any) -> None:
    """Apprentice: an OpenAI-compatible gateway that learns from production traffic."""


if __name__ == "__main__":
    main()
