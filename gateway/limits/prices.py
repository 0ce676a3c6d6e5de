"""What a call cost, in US dollars, from the upstream's prices per token.

Prices come from the deployment's `model_info` (`input_cost_per_token`,
`output_cost_per_token`, as in a LiteLLM proxy config), else from litellm's own cost map. The
cost map is read from the JSON file litellm ships (the file LITELLM_LOCAL_MODEL_COST_MAP=True
makes litellm read), located without importing litellm: importing it costs seconds and it is
never fetched from the network here. A model with no known price (a policy's own endpoints,
an unknown name) costs nothing, so budgets count only what the upstreams bill.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import orjson

from apprentice.settings import ModelEntry

log = logging.getLogger(__name__)

COST_MAP_FILE = "model_prices_and_context_window_backup.json"

Price = tuple[float, float]  # dollars per input token, per output token


def _price(info: dict[str, Any]) -> Price | None:
    given_in, given_out = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if given_in is None and given_out is None:
        return None
    try:
        return float(given_in or 0.0), float(given_out or 0.0)
    except (TypeError, ValueError):
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


class Prices:
    """Per-token prices by deployment; the cost map is loaded once (`load`, off the event loop)."""

    def __init__(self, model_list: list[ModelEntry]) -> None:
        self._configured: dict[tuple[str, str], Price] = {}
        for entry in model_list:
            price = _price(entry.model_info)
            if price is not None:
                self._configured.setdefault((entry.model_name, entry.litellm_params.model), price)
        self._cost_map: dict[str, Price] = {}

    def load(self) -> None:
        """Read litellm's cost map (tens of milliseconds; call it in a thread)."""
        path = litellm_cost_map_path()
        if path is None:
            log.info("litellm's cost map is not installed: only model_info prices count towards budgets")
            return
        table = orjson.loads(path.read_bytes())
        prices = {}
        for name, info in table.items():
            price = _price(info) if isinstance(info, dict) else None
            if price is not None:
                prices[name] = price
        self._cost_map = prices

    def per_token(self, target: Any) -> Price | None:
        """The price of a target (gateway.upstreams.routing.UpstreamTarget), or None if unknown."""
        if target is None:
            return None
        litellm_model = getattr(target, "litellm_model", None)
        if litellm_model is None:  # a policy's own endpoint
            return None
        configured = self._configured.get((target.name, litellm_model))
        if configured is not None:
            return configured
        return self._cost_map.get(litellm_model) or self._cost_map.get(target.upstream_model)

    def cost(self, target: Any, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        price = self.per_token(target)
        if price is None:
            return 0.0
        return (prompt_tokens or 0) * price[0] + (completion_tokens or 0) * price[1]
