"""Prices per token of the models the gateway forwards to, in US dollars (LiteLLM's unit).

One reading of prices for the two places that need them: the gateway's spend budgets
(gateway/limits/) and the takeover comparison of a policy with its teacher
(apprentice/promotion/takeover.py). A model_list entry's `model_info` (`input_cost_per_token`,
`output_cost_per_token`, as in a LiteLLM proxy config) comes first, else litellm's own cost
map: the JSON file litellm ships (the one LITELLM_LOCAL_MODEL_COST_MAP=True makes it read),
located without importing litellm, since importing it costs seconds and it is never fetched
from the network here. A price that gives one of the two figures counts the other as 0.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

COST_MAP_FILE = "model_prices_and_context_window_backup.json"

Price = tuple[float, float]  # dollars per input token, per output token


def price_from_info(info: dict[str, Any]) -> Price | None:
    """The price a model_info (or a cost map entry) gives, or None when it gives none."""
    given_in, given_out = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if given_in is None and given_out is None:
        return None
    try:
        return float(given_in or 0.0), float(given_out or 0.0)
    except (TypeError, ValueError):
        return None


def price_of(
    model_info: Mapping[str, Any], names: Iterable[str | None], cost_map: Mapping[str, Price]
) -> tuple[Price, str] | None:
    """THE lookup, for budgets and the takeover alike: a deployment's price and where it was found.

    Its `model_info` first ("model_info"), else the first of `names` (the deployment's litellm
    model, then the upstream's model name) that litellm's cost map prices ("litellm cost map:
    NAME"); None when neither knows the model."""
    price = price_from_info(dict(model_info))
    if price is not None:
        return price, "model_info"
    for name in names:
        if name and name in cost_map:
            return cost_map[name], f"litellm cost map: {name}"
    return None


def litellm_cost_map_path() -> Path | None:
    """The cost map litellm ships, found without importing the package."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / COST_MAP_FILE
        if path.exists():
            return path
    return None


@cache
def litellm_cost_map() -> dict[str, Price]:
    """Prices by model name from litellm's cost map (tens of milliseconds, read once; call it off
    an event loop); empty when litellm is not installed or its file cannot be read."""
    path = litellm_cost_map_path()
    if path is None:
        log.info("litellm's cost map is not installed: only model_info prices are known")
        return {}
    try:
        table = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("litellm's cost map %s cannot be read (%s): only model_info prices are known", path, exc)
        return {}
    prices = {}
    for name, info in table.items() if isinstance(table, dict) else ():
        price = price_from_info(info) if isinstance(info, dict) else None
        if price is not None:
            prices[name] = price
    return prices
