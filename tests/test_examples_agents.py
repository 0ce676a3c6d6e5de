"""The example agents (examples/) against a real gateway: each run is one trajectory, rewarded, trainable.

Each example runs as the README says (its own process, the client helper installed beside it)
against a gateway whose policy is served by the fake upstream's scripted tool-using model
(tests/support/fake_agent.py: the tiny local model cannot follow tools). For each, the run read
back through GET /v1/trajectories/{id} holds every call in order, each tool call answered by
its result in the next call; the reward the example posted is linked to it; and the learner's
selection reads it and tokenizes it (SmolLM2's tokenizer with a template that renders tools)
into one sequence whose loss mask covers exactly the assistant turns.
"""

from __future__ import annotations

import copy

import pytest

from tests.support.agent_runs import (
    agent_policy,
    assert_masks_on_assistant_turns,
    assert_reward,
    assert_tool_loop,
    learner_segments,
    read_trajectory,
    run_example,
)
from tests.support.chat_templates import TOOL_TEMPLATE

POLICY = "shop-agent"


@pytest.fixture(scope="module")
def tokenizer():
    from learner.models import fetch_default_model, load_tokenizer

    tokenizer = copy.deepcopy(load_tokenizer(fetch_default_model()))
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


@pytest.fixture
def policy(fake_upstream):
    return agent_policy(POLICY, fake_upstream.api_base)


@pytest.fixture
def gateway(start_gateway, policy):
    return start_gateway(policies=[policy])


def test_the_anthropic_tool_use_loop_is_one_rewarded_trainable_trajectory(gateway, policy, db, tokenizer):
    printed = run_example("anthropic_tool_use.py", gateway, "--model", POLICY)
    assert printed["reward"] == 1.0 and printed["reward_status"] in ("linked", "pending")
    assert "reserved 3 units of SKU-42" in printed["answer"]

    trajectory = read_trajectory(gateway, printed["trajectory_id"], calls=3)
    assert trajectory["client_trajectory_id"] == printed["trajectory_id"]
    assert trajectory["group_id"] == printed["group_id"] == "reserve-sku-42"
    assert_tool_loop(trajectory, ["check_stock", "reserve_items", None])
    assert_reward(trajectory, 1.0)

    candidate, segments = learner_segments(db, policy, trajectory["id"], tokenizer)
    assert candidate.webhook == 1.0 and len(candidate.calls) == 3
    assert_masks_on_assistant_turns(trajectory, segments, tokenizer)


def test_the_langgraph_tool_calling_graph_is_one_rewarded_trainable_trajectory(gateway, policy, db, tokenizer):
    printed = run_example("langgraph_agent.py", gateway, "--model", POLICY)
    assert printed["reward"] == 1.0, printed
    assert "Lisbon: sunny, 24 C" in printed["answer"] and "Lisbon is at UTC+0" in printed["answer"]

    trajectory = read_trajectory(gateway, printed["trajectory_id"], calls=3)
    assert trajectory["group_id"] == "trip-lisbon"
    assert_tool_loop(trajectory, ["get_weather", "local_time", None])
    assert_reward(trajectory, 1.0)

    _, segments = learner_segments(db, policy, trajectory["id"], tokenizer)
    assert_masks_on_assistant_turns(trajectory, segments, tokenizer)


def test_the_agents_sdk_multi_turn_run_over_responses_is_one_rewarded_trainable_trajectory(
    gateway, policy, db, tokenizer
):
    printed = run_example("openai_agents_sdk.py", gateway, "--model", POLICY)
    assert printed["reward"] == 1.0, printed
    first, second = printed["answers"]
    assert "DHL" in first and "2 working days" in second

    trajectory = read_trajectory(gateway, printed["trajectory_id"], calls=6)
    assert trajectory["group_id"] == "order-A-1001"
    tools = ["lookup_order", "delivery_estimate", None]
    assert_tool_loop(trajectory, tools + tools)
    assert all(call["request"]["messages"][0]["role"] == "system" for call in trajectory["calls"])
    assert_reward(trajectory, 1.0)

    _, segments = learner_segments(db, policy, trajectory["id"], tokenizer)
    assert_masks_on_assistant_turns(trajectory, segments, tokenizer)
