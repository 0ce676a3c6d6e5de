"""The `apprentice` command line.

The core owns the entry point but names no command of the gateway or the learner: each side
registers its commands as entry points in the group `apprentice.commands` (pyproject.toml),
and this group loads one only when it is invoked. So `apprentice keys create` never pays for
importing the learner (torch) or litellm, and the core imports neither side.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

COMMAND_GROUP = "apprentice.commands"


def registered_commands() -> dict[str, EntryPoint]:
    """The commands the installed sides declare, by name (nothing imported yet)."""
    return {entry.name: entry for entry in entry_points(group=COMMAND_GROUP)}


class LazyGroup(click.Group):
    """A click group whose registered subcommands are imported only when they are invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(registered_commands()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        builtin = super().get_command(ctx, cmd_name)
        if builtin is not None:
            return builtin
        entry = registered_commands().get(cmd_name)
        if entry is None:
            return None
        try:
            command = entry.load()
        except ImportError as exc:
            raise click.ClickException(
                f"'apprentice {cmd_name}' needs a package that is not installed ({exc.name}); "
                "install the extras: pip install 'apprentice[learner]'"
            ) from exc
        if not isinstance(command, click.Command):
            raise click.ClickException(f"entry point {entry.value!r} is not a click command")
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="apprentice")
def main(**_: Any) -> None:
    """Apprentice: an OpenAI-compatible gateway that learns from production traffic."""


def _add_core_commands() -> None:
    from apprentice.commands.db import db_group
    from apprentice.commands.eval import eval_command
    from apprentice.commands.up import up_command

    main.add_command(db_group)
    main.add_command(up_command)
    main.add_command(eval_command)


_add_core_commands()

if __name__ == "__main__":
    main()
