"""A LangGraph agent: a tool-calling graph on langchain-openai's ChatOpenAI pointed at the gateway.

The graph is the classic agent loop, written out: an `agent` node (the model, tools bound) and
a `tools` node (LangGraph's ToolNode), with an edge back to the agent after every tool run and
to the end when the model answers without a tool call. A trip assistant with two tools
(`get_weather`, `local_time`) answers one question; the run is named with `apprentice_client`'s
run context, so every model call the graph makes lands in one trajectory, and the script
rewards it (1 when the answer uses both tools' results). Against `make up`:

    .venv/bin/python examples/langgraph_agent.py

(`--base-url`, `--api-key`, `--model`: defaults $OPENAI_BASE_URL, $OPENAI_API_KEY, the
`apprentice` policy). It prints the run as a JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

import apprentice_client as ac

WEATHER = {"Lisbon": "sunny, 24 C", "Oslo": "snow, -3 C", "Lima": "cloudy, 18 C"}
UTC_OFFSET = {"Lisbon": 0, "Oslo": 1, "Lima": -5}


@tool
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: {WEATHER[city]}" if city in WEATHER else f"no weather known for {city}"


@tool
def local_time(city: str) -> str:
    """A city's offset from UTC."""
    return f"{city} is at UTC{UTC_OFFSET[city]:+d}" if city in UTC_OFFSET else f"no time zone known for {city}"


TOOLS = [get_weather, local_time]


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(model: ChatOpenAI) -> Any:
    """agent -> (tools -> agent)* -> end."""
    bound = model.bind_tools(TOOLS)

    def agent(state: State) -> dict[str, list[AnyMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "apprentice-local"))
    parser.add_argument("--model", default="apprentice")
    parser.add_argument("--question", default="I land in Lisbon tonight: what is the weather and the time zone there?")
    args = parser.parse_args()

    # ChatOpenAI hands http_client to the openai SDK it wraps: the hook tags every call the
    # graph makes with the run that is current when the graph runs.
    model = ChatOpenAI(
        model=args.model,
        base_url=args.base_url,
        api_key=args.api_key,
        http_client=ac.http_client(),
        timeout=120,
        max_tokens=256,
    )
    graph = build_graph(model)
    with ac.run(group_id="trip-lisbon") as run:
        final = graph.invoke({"messages": [HumanMessage(args.question)]}, {"recursion_limit": 12})
    messages = final["messages"]
    answer = str(messages[-1].content)
    tool_calls = sum(len(getattr(m, "tool_calls", []) or []) for m in messages)

    reward = 1.0 if "sunny" in answer and "UTC" in answer else 0.0
    with ac.RewardClient(args.base_url, api_key=args.api_key) as rewards:
        stored = rewards.post(ac.Reward.for_run(run, reward, metrics={"tool_calls": tool_calls}))
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
