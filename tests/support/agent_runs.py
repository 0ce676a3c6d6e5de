"""What the example agents' tests share: run an example as its README says, read its run back,
check the recorded tool loop, and parse the run as the learner does.

An example (examples/*.py) runs as its own process, with the client helper on its path as
`make install` puts it there, and prints its run as a JSON line at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx

from tests.conftest import wait_for
from tests.support.processes import REPO_ROOT

CLIENT_PATH = REPO_ROOT / "clients" / "python"
AGENT_BASE_MODEL = "agent-scripted"  # the fake upstream's scripted tool-using model (tests/support/fake_agent.py)


def agent_policy(name: str, endpoint: str) -> dict[str, Any]:
    """A policy served by the scripted tool-using model at `endpoint` (the fake upstream), rewards read at once."""
    return {"name": name, "base_model": AGENT_BASE_MODEL, "endpoints": [endpoint], "learning": {"reward_wait_s": 0}}


def run_example(script: str, gateway: Any, *args: str, timeout: float = 180.0) -> dict[str, Any]:
    """`python examples/<script> --base-url ... <args>`: its last output line, parsed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CLIENT_PATH), str(REPO_ROOT)])}
    env.pop("OPENAI_BASE_URL", None)
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / script), "--base-url", gateway.base_url, "--api-key", "k", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_trajectory(gateway: Any, trajectory_id: str, calls: int) -> dict[str, Any]:
    """GET /v1/trajectories/{id} once its `calls` calls and its reward are stored."""

    def ready() -> dict[str, Any] | None:
        answer = httpx.get(f"{gateway.base_url}/trajectories/{trajectory_id}", timeout=30)
        if answer.status_code != 200:
            return None
        body = answer.json()
        return body if body["call_count"] >= calls and body["rewards"] else None

    return wait_for(ready, timeout=30, message=f"trajectory {trajectory_id} with {calls} calls and a reward")


def _answer(call: dict[str, Any]) -> dict[str, Any]:
    return call["response"]["choices"][0]["message"]


def _tool_name(message: dict[str, Any]) -> str | None:
    calls = message.get("tool_calls") or []
    return calls[0]["function"]["name"] if calls else None


def assert_tool_loop(trajectory: dict[str, Any], tools_per_call: list[str | None]) -> None:
    """The run's calls in order: each answers with the expected tool call (None: text), and each
    next call's conversation is the previous one, its answer, and that tool's result (or a user turn)."""
    calls = trajectory["calls"]
    assert trajectory["call_count"] == len(calls) == len(tools_per_call), [_tool_name(_answer(c)) for c in calls]
    assert all(call["status_code"] == 200 for call in calls)
    assert [_tool_name(_answer(call)) for call in calls] == tools_per_call
    for before, after in zip(calls, calls[1:], strict=False):
        previous, following = before["request"]["messages"], after["request"]["messages"]
        assert following[: len(previous)] == previous, "a later call resends the conversation so far"
        echoed, *added = following[len(previous) :]
        answer = _answer(before)
        assert echoed["role"] == "assistant" and _tool_name(echoed) == _tool_name(answer)
        if answer.get("tool_calls"):
            call_id = answer["tool_calls"][0]["id"]
            sent, asked = echoed["tool_calls"][0], answer["tool_calls"][0]
            assert sent["id"] == call_id
            assert json.loads(sent["function"]["arguments"]) == json.loads(asked["function"]["arguments"])
            assert [m["role"] for m in added] == ["tool"] and added[0]["tool_call_id"] == call_id
        else:
            assert (echoed.get("content") or "") == (answer.get("content") or "")
            assert [m["role"] for m in added] == ["user"], "a text answer is followed by the user's next turn"


def assert_reward(trajectory: dict[str, Any], value: float) -> None:
    [reward] = [r for r in trajectory["rewards"] if r["name"] == "reward"]
    assert reward["status"] == "linked" and reward["current"] and reward["reward"] == value
    assert reward["trajectory_id"] == trajectory["id"]


def learner_segments(db: Any, policy: dict[str, Any], trajectory_id: str, tokenizer: Any) -> tuple[Any, list[Any]]:
    """The run as a learner run reads it (selection), and the token segments it trains on."""
    from apprentice.settings import PolicySettings
    from learner.grpo.tokens import trajectory_segments
    from learner.jobs.selection import select

    selection = select(db, PolicySettings.model_validate(policy))
    assert selection.skipped == {} and selection.stale == {}, (selection.skipped, selection.stale)
    candidate = selection.candidates[trajectory_id]
    return candidate, trajectory_segments(tokenizer, candidate.calls)


def rendered_answer(message: dict[str, Any]) -> str:
    """An assistant turn as the tool template (tests/support/chat_templates.py) renders it, end token included."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"])
        text += f"<tool_call>{call['function']['name']}({json.dumps(arguments)})</tool_call>"
    return text + "<|im_end|>"


def assert_masks_on_assistant_turns(trajectory: dict[str, Any], segments: list[Any], tokenizer: Any) -> None:
    """One sequence whose loss mask covers every assistant turn, in order, and nothing else."""
    assert len(segments) == 1, "the run's calls extend each other: one training sequence"
    [segment] = segments
    masked = tokenizer.decode([t for t, on in zip(segment.input_ids, segment.loss_mask, strict=True) if on])
    assert masked == "".join(rendered_answer(_answer(call)) for call in trajectory["calls"])
    unmasked = tokenizer.decode([t for t, on in zip(segment.input_ids, segment.loss_mask, strict=True) if not on])
    assert "<tool_call>" not in unmasked
    for message in trajectory["calls"][-1]["request"]["messages"]:
        if message["role"] in ("user", "tool", "system") and isinstance(message.get("content"), str):
            assert message["content"] in unmasked, f"{message['role']} text is context, not trained on"
