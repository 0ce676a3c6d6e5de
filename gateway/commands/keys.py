"""`apprentice keys create | list | revoke | limits`: gateway API keys, stored hashed, and each
key's own rate limits and budget (docs/limits.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from apprentice.commands.common import config_option, database_url, load
from apprentice.store.engine import make_async_engine
from gateway.auth import keys
from gateway.auth.training_opt_out import set_training_opt_out

T = TypeVar("T")


def _run(config_path: str | None, operation: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Run one store operation against the configured database."""
    url = database_url(load(config_path))

    async def main() -> T:
        engine = make_async_engine(url)
        try:
            return await operation(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _limit_value(kind: type[int] | type[float]) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """A limit option: a number, or `none` (no limit of that kind for this key)."""

    def convert(_: click.Context, parameter: click.Parameter, value: str | None) -> Any:
        if value is None:
            return _UNSET
        if value.strip().lower() in ("none", "null", "unlimited"):
            return None
        try:
            return kind(value)
        except ValueError:
            raise click.BadParameter(f"{value!r} is neither a number nor 'none'", param=parameter) from None

    return convert


_UNSET = object()


def limit_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """--rpm, --tpm, --budget-usd: the key's own limits (absent: the configured default)."""
    for flag, kind, text in (
        ("--budget-usd", float, "Dollars per budget window (limits.budget_window_s), at the upstreams' prices."),
        ("--tpm", int, "Tokens per minute (prompt + completion)."),
        ("--rpm", int, "Requests per minute."),
    ):
        function = click.option(flag, callback=_limit_value(kind), help=text + " 'none': no such limit.")(function)
    return function


def _given_limits(rpm: Any, tpm: Any, budget_usd: Any) -> dict[str, Any]:
    """The limits the command line names, checked as the store will check them (a usage error if not)."""
    given = {"requests_per_minute": rpm, "tokens_per_minute": tpm, "budget_usd": budget_usd}
    limits = {name: value for name, value in given.items() if value is not _UNSET}
    try:
        keys.parse_limits(limits)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return limits


def _describe(limits: object) -> str:
    return json.dumps(limits, sort_keys=True) if limits else "defaults"


@click.group("keys")
def keys_group() -> None:
    """Gateway API keys."""


@keys_group.command("create")
@config_option
@click.option("--name", required=True, help="Who or what uses the key.")
@click.option("--tenant", default="default", show_default=True, help="Trajectories and rewards are scoped to it.")
@click.option("--admin", is_flag=True, help="Also allow the admin API.")
@limit_options
def create_command(
    config_path: str | None, name: str, tenant: str, admin: bool, rpm: Any, tpm: Any, budget_usd: Any
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    limits = _given_limits(rpm, tpm, budget_usd)
    info, key = _run(
        config_path,
        lambda engine: keys.create_key(
            engine, name=name, tenant=tenant, role="admin" if admin else "client", limits=limits
        ),
    )
    click.echo(key)
    click.echo(
        f"created {info.role} key {info.id} for tenant {info.tenant!r}; store it now, it is not shown again", err=True
    )


@keys_group.command("list")
@config_option
def list_command(config_path: str | None) -> None:
    """List keys (prefixes only)."""
    for row in _run(config_path, keys.list_keys):
        state = f"revoked {row['revoked_at']:%Y-%m-%d}" if row["revoked_at"] else "active"
        click.echo(
            f"{row['id']}  {row['key_prefix']}...  {row['role']:6}  tenant={row['tenant']}  name={row['name']}  {state}"
            f"  limits={_describe(row['limits'])}{'  training=opted-out' if row['training_opt_out'] else ''}"
        )


@keys_group.command("revoke")
@config_option
@click.argument("key_id_or_prefix")
def revoke_command(config_path: str | None, key_id_or_prefix: str) -> None:
    """Revoke a key by id or by the prefix `keys list` shows."""
    count = _run(config_path, lambda engine: keys.revoke_key(engine, key_id_or_prefix))
    if not count:
        raise click.ClickException(f"no active key matches {key_id_or_prefix}")
    click.echo(f"revoked {count} key(s); gateways drop it within their key refresh interval")


@keys_group.command("training")
@config_option
@click.argument("key_id_or_prefix")
@click.option(
    "--opt-out/--opt-in",
    "opt_out",
    required=True,
    help="--opt-out: the key's calls are recorded but never trained on or judged (and its trajectories "
    "not yet trained on are withdrawn); --opt-in: its new calls may be trained on again.",
)
def training_command(config_path: str | None, key_id_or_prefix: str, opt_out: bool) -> None:
    """Opt a key's calls out of training (docs/privacy.md), or back in."""
    count, withdrawn = _run(config_path, lambda engine: set_training_opt_out(engine, key_id_or_prefix, opt_out))
    if not count:
        raise click.ClickException(f"no active key matches {key_id_or_prefix}")
    if opt_out:
        click.echo(f"key opted out of training; {withdrawn} trajectories not yet trained on were withdrawn")
    else:
        click.echo("key opted in to training: its new calls may be trained on")


@keys_group.command("limits")
@config_option
@click.argument("key_id_or_prefix")
@limit_options
@click.option("--clear", is_flag=True, help="Drop the key's own limits first (back to the configured defaults).")
def limits_command(
    config_path: str | None, key_id_or_prefix: str, rpm: Any, tpm: Any, budget_usd: Any, clear: bool
) -> None:
    """Set a key's own limits (only those given change) and print them."""
    limits = _given_limits(rpm, tpm, budget_usd)
    updated = _run(config_path, lambda engine: keys.set_key_limits(engine, key_id_or_prefix, limits, replace=clear))
    if updated is None:
        raise click.ClickException(f"no active key matches {key_id_or_prefix}")
    click.echo(_describe(updated))
    click.echo("gateways apply it within their key refresh interval (auth.key_cache_ttl_s)", err=True)
