"""The official Node SDKs (openai, @anthropic-ai/sdk) against a real gateway, as Node users call it.

The Python suite drives the gateway with the official Python clients; users of other languages
meet the same endpoints through their own SDKs, which send other headers, parse answers by their
own rules and raise their own error classes. tests/clients/node/clients.mjs makes the calls a Node
agent makes, with only the base URL changed: chat completions whole and streamed, the Responses
API whole, chained by previous_response_id and streamed, the model list, bad requests, and
Anthropic's Messages whole and streamed. This checks what the SDKs returned and that each call
was recorded.

The SDKs are pinned in tests/clients/node/package-lock.json; `make test` installs them (npm ci).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

from tests.conftest import count_rows, wait_for
from tests.support.processes import REPO_ROOT

NODE_DIR = REPO_ROOT / "tests" / "clients" / "node"


def run_node_clients(gateway_url: str, openai_model: str, anthropic_model: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node, "Node.js is needed (apt-get install nodejs npm; .ci/run installs it)"
    assert (NODE_DIR / "node_modules" / "openai").is_dir(), "run `make install` (npm ci in tests/clients/node)"
    done = subprocess.run(
        [node, "clients.mjs", gateway_url, openai_model, anthropic_model],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def gateway(start_gateway, fake_upstream):
    """A gateway with one policy, `agent`, served by the fake upstream (its calls are recorded as trajectories)."""
    policy = {"name": "agent", "base_model": "fake-model", "endpoints": [fake_upstream.api_base]}
    return start_gateway(policies=[policy])


def recorded(db, response_id: str) -> tuple[str, bool, str | None]:
    """The call the gateway stored under the id the SDK was answered with (it ships asynchronously)."""

    def found() -> tuple[str, bool, str | None] | None:
        return db.execute(
            "SELECT protocol, stream, trajectory_id::text AS trajectory_id FROM calls WHERE response_id = %s",
            (response_id,),
        ).fetchone()

    row = wait_for(found, timeout=15)
    assert row is not None, f"no call recorded under {response_id}"
    return row


def test_the_node_sdks_call_every_protocol_and_each_call_is_recorded(gateway, db) -> None:
    out = run_node_clients(gateway.url, "agent", "agent")

    # Chat completions, whole and streamed: the SDK's objects, usage included.
    assert out["chat"]["content"].startswith("Say hello from Node.")
    assert out["chat"]["usage"]["completion_tokens"] > 0
    assert out["chatStream"]["content"].startswith("Stream hello from Node.")
    assert out["chatStream"]["usage"]["total_tokens"] > 0
    # The gateway's own header reaches a Node user through the SDK's raw response.
    assert len(out["trajectoryHeader"]) == 36 and out["trajectoryHeader"].count("-") == 4

    # The Responses API, whole and streamed.
    assert out["responses"]["status"] == "completed"
    assert out["responses"]["text"].startswith("Hello through the Responses API.")
    # A turn chained by previous_response_id continues the conversation the gateway stored.
    assert out["chained"]["previous"] == out["responses"]["id"]
    assert out["chained"]["text"].startswith("And after that?")
    assert (out["responsesStream"]["first"], out["responsesStream"]["last"]) == (
        "response.created",
        "response.completed",
    )

    # The model list pages through the SDK's iterator and names the policy.
    assert "agent" in out["models"]

    # Errors reach Node users as the SDKs' own error classes, with the status and type they check.
    assert out["unknownModel"]["name"] == "NotFoundError" and out["unknownModel"]["status"] == 404
    assert "no-such-model" in out["unknownModel"]["message"]
    assert out["badRequest"] == {
        "thrown": True,
        "name": "BadRequestError",
        "status": 400,
        "type": "invalid_request_error",
    }

    # Anthropic's Messages, whole and streamed through the SDK's stream helper, and its error shape.
    assert out["messages"]["type"] == "message" and out["messages"]["stop"] == "end_turn"
    assert out["messages"]["text"].startswith("Hello through the Messages API.")
    assert out["messagesStream"]["text"].startswith("Stream it through Messages.")
    assert out["anthropicBadRequest"] == {
        "thrown": True,
        "name": "BadRequestError",
        "status": 400,
        "type": "invalid_request_error",
    }

    # Every answered call is stored once, under its protocol, in a trajectory.
    expected = {
        out["chat"]["id"]: ("chat.completions", False),
        out["chatStream"]["id"]: ("chat.completions", True),
        out["responses"]["id"]: ("responses", False),
        out["messages"]["id"]: ("messages", False),
        out["messagesStream"]["id"]: ("messages", True),
    }
    for response_id, (protocol, stream) in expected.items():
        stored_protocol, stored_stream, trajectory_id = recorded(db, response_id)
        assert (stored_protocol, stored_stream) == (protocol, stream), response_id
        assert trajectory_id
    assert recorded(db, out["chained"]["id"])[2] == recorded(db, out["responses"]["id"])[2]
    assert wait_for(
        lambda: count_rows(db, "SELECT count(*) FROM calls WHERE trajectory_id = %s", out["trajectoryHeader"]) == 1,
        timeout=15,
    )
