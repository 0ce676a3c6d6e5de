"""An OpenAI Agents SDK agent over the Responses API: two function tools, a multi-turn run, one reward.

A support agent with two tools (`lookup_order`, `delivery_estimate`) answers a customer's
question, then a follow-up in the same conversation (the second turn resends the first's items,
as the SDK's `to_input_list()` gives them). Both turns run inside one `apprentice_client` run,
so the gateway records every call of the conversation, tool calls and tool results, as one
trajectory; the script then scores the conversation (1 when both answers carry the tools'
facts) and posts the reward. The SDK's tracing is off: it would send traces to OpenAI's servers
(with the gateway's key); nothing leaves the machine. Against `make up`:

    .venv/bin/python examples/openai_agents_sdk.py

(`--base-url`, `--api-key`, `--model`: defaults $OPENAI_BASE_URL, $OPENAI_API_KEY, the
`apprentice` policy). It prints the run as a JSON line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from agents import (
    Agent,
    AgentsException,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

import apprentice_client as ac

ORDERS = {"A-1001": {"status": "shipped", "carrier": "DHL", "from": "Lyon"}}
DAYS_LEFT = {"A-1001": 2}
QUESTIONS = ("Where is my order A-1001?", "Can order A-1001 arrive within 3 days?")


@function_tool
def lookup_order(order_id: str) -> str:
    """The status of an order: shipped or not, by which carrier, from where."""
    order = ORDERS.get(order_id.upper())
    if order is None:
        return f"no order {order_id}"
    return f"order {order_id} is {order['status']} with {order['carrier']} from {order['from']}"


@function_tool
def delivery_estimate(order_id: str) -> str:
    """How many working days until an order arrives."""
    days = DAYS_LEFT.get(order_id.upper())
    return f"no estimate for {order_id}" if days is None else f"order {order_id} arrives in {days} working days"


def build_agent(model: str) -> Agent[Any]:
    return Agent(
        name="support",
        instructions="You help customers with their orders. Use the tools; answer in one sentence.",
        model=model,
        tools=[lookup_order, delivery_estimate],
        model_settings=ModelSettings(max_tokens=256),
    )


async def converse(agent: Agent[Any], questions: tuple[str, ...]) -> list[str]:
    """One conversation: each question continues the items of the turns before it.

    A model that breaks the loop (malformed tool arguments, tools called past `max_turns`) ends
    the conversation: the run is still recorded, and rewarded 0 below.
    """
    items: list[Any] = []
    answers = []
    for question in questions:
        try:
            result = await Runner.run(agent, [*items, {"role": "user", "content": question}], max_turns=8)
        except AgentsException as failure:
            answers.append(f"(the agent failed: {failure})")
            break
        answers.append(str(result.final_output))
        items = result.to_input_list()
    return answers


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, http_client=ac.async_http_client(timeout=120))
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")
    set_tracing_disabled(True)
    with ac.run(group_id="order-A-1001") as run:
        answers = await converse(build_agent(args.model), QUESTIONS)

    reward = 1.0 if len(answers) == 2 and "DHL" in answers[0] and "2 working days" in answers[1] else 0.0
    async with ac.AsyncRewardClient(args.base_url, api_key=args.api_key) as rewards:
        stored = await rewards.post(ac.Reward.for_run(run, reward, metrics={"turns": len(answers)}))
    return {
        "trajectory_id": run.trajectory_id,
        "group_id": run.group_id,
        "reward": reward,
        "reward_status": stored.status,
        "answers": answers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "apprentice-local"))
    parser.add_argument("--model", default="apprentice")
    print(json.dumps(asyncio.run(main_async(parser.parse_args()))))


if __name__ == "__main__":
    main()
