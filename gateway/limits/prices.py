"""What a call cost, in US dollars, from the prices of the deployment that answered it.

The prices are apprentice/prices.py's (model_info first, else litellm's cost map). A model with
no known price (a policy's own endpoints, an unknown name) costs nothing, so budgets count only
what the upstreams bill.
"""

from __future__ import annotations

from typing import Any

from apprentice.prices import Price, litellm_cost_map, price_of
from apprentice.settings import ModelEntry


class Prices:
    """Per-token prices by deployment; the cost map is loaded once (`load`, off the event loop)."""

    def __init__(self, model_list: list[ModelEntry]) -> None:
        self._info: dict[tuple[str, str], dict[str, Any]] = {}
        for entry in model_list:
            self._info.setdefault((entry.model_name, entry.litellm_params.model), entry.model_info)
        self._cost_map: dict[str, Price] = {}

    def load(self) -> None:
        """Read litellm's cost map (tens of milliseconds; call it in a thread)."""
        self._cost_map = litellm_cost_map()

    def per_token(self, target: Any) -> Price | None:
        """The price of a target (gateway.upstreams.routing.UpstreamTarget), or None if unknown."""
        if target is None:
            return None
        litellm_model = getattr(target, "litellm_model", None)
        if litellm_model is None:  # a policy's own endpoint
            return None
        info = self._info.get((target.name, litellm_model), {})
        found = price_of(info, (litellm_model, target.upstream_model), self._cost_map)
        return None if found is None else found[0]

    def cost(self, target: Any, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        price = self.per_token(target)
        if price is None:
            return 0.0
        return (prompt_tokens or 0) * price[0] + (completion_tokens or 0) * price[1]
