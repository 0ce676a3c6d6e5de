"""An Anthropic SDK agent: the tool-use loop over /v1/messages, one run named and rewarded.

A warehouse assistant with two tools (`check_stock`, `reserve_items`) runs Anthropic's
tool-use loop until the model stops asking for tools, then scores its own run (1 when the
requested units were reserved and the answer says so) and posts the reward. The run's calls
carry its id through `apprentice_client`'s run context, so the gateway records the whole loop,
tool calls and tool results, as one trajectory. Against `make up`:

    .venv/bin/python examples/anthropic_tool_use.py

(`--base-url`, `--api-key`, `--model`: defaults $OPENAI_BASE_URL, $OPENAI_API_KEY, the
`apprentice` policy). The tiny local model seldom calls tools; the loop works with any model.
It prints the run as a JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import anthropic

import apprentice_client as ac

STOCK = {"SKU-42": 17, "SKU-7": 0, "SKU-100": 250}
TOOLS: list[dict[str, Any]] = [
    {
        "name": "check_stock",
        "description": "How many units of a SKU are in the warehouse.",
        "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
    },
    {
        "name": "reserve_items",
        "description": "Reserve units of a SKU for a store; fails when fewer are in stock.",
        "input_schema": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
            "required": ["sku", "quantity"],
        },
    },
]
MAX_TURNS = 8


class Warehouse:
    """The tools' side: stock levels and the reservations made during the run."""

    def __init__(self) -> None:
        self.stock = dict(STOCK)
        self.reserved: dict[str, int] = {}

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        sku = str(arguments.get("sku", "")).upper()
        if sku not in self.stock:
            return f"unknown SKU {sku!r}"
        if name == "check_stock":
            return f"{sku}: {self.stock[sku]} units in stock"
        if name == "reserve_items":
            quantity = int(arguments.get("quantity", 0))
            if not 0 < quantity <= self.stock[sku]:
                return f"cannot reserve {quantity} of {sku}: {self.stock[sku]} in stock"
            self.stock[sku] -= quantity
            self.reserved[sku] = self.reserved.get(sku, 0) + quantity
            return f"reserved {quantity} units of {sku}"
        return f"unknown tool {name!r}"


def run_agent(client: anthropic.Anthropic, model: str, task: str, warehouse: Warehouse) -> tuple[str, int]:
    """Anthropic's tool-use loop: answer tool_use blocks with tool_result blocks until the model stops."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for turn in range(1, MAX_TURNS + 1):
        reply = client.messages.create(model=model, max_tokens=256, tools=TOOLS, messages=messages)  # type: ignore[arg-type]
        messages.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if reply.stop_reason != "tool_use" or not uses:
            return "".join(block.text for block in reply.content if block.type == "text"), turn
        results = [
            {"type": "tool_result", "tool_use_id": use.id, "content": warehouse.call(use.name, dict(use.input))}
            for use in uses
        ]
        messages.append({"role": "user", "content": results})
    return "(stopped after the turn limit)", MAX_TURNS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "apprentice-local"))
    parser.add_argument("--model", default="apprentice")
    parser.add_argument("--task", default="Please reserve 3 units of SKU-42 for the Lisbon store.")
    args = parser.parse_args()

    # Anthropic's SDK takes the gateway's root (it adds /v1/messages); the hooked HTTP client
    # puts the current run's X-Trajectory-Id and X-Group-Id on every call.
    root = args.base_url.rstrip("/").removesuffix("/v1")
    client = anthropic.Anthropic(base_url=root, api_key=args.api_key, http_client=ac.http_client(timeout=120))
    warehouse = Warehouse()
    with ac.run(group_id="reserve-sku-42") as run:
        answer, turns = run_agent(client, args.model, args.task, warehouse)

    reward = 1.0 if warehouse.reserved.get("SKU-42") == 3 and "3" in answer else 0.0
    with ac.RewardClient(args.base_url, api_key=args.api_key) as rewards:
        stored = rewards.post(ac.Reward.for_run(run, reward, metrics={"turns": turns}))
    print(
        json.dumps(
            {
                "trajectory_id": run.trajectory_id,
                "group_id": run.group_id,
                "reward": reward,
                "reward_status": stored.status,
                "answer": answer,
            }
        )
    )


if __name__ == "__main__":
    main()
