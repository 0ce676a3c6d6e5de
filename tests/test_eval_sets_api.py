"""Evaluation sets through the admin API of a real gateway, and `apprentice eval` on them.

Items come outright and from recorded trajectories (by id and by a query on their reward); bad
input is refused in the OpenAI error format; the CLI scores a version through the policy's
endpoint (a fake that answers per LoRA name over real HTTP) and stores the run the API lists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.fake_lora_endpoint import FakeLoraEndpoint
from tests.test_eval_gate import add_candidate, write_adapter

ADMIN_KEY = "sk-admin-evalsets"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def endpoint():
    fake = FakeLoraEndpoint("base-model", {"skill": 5}).start()
    yield fake
    fake.stop()


def test_eval_sets_through_the_admin_api_and_the_cli(start_gateway, database_url, db, endpoint, tmp_path):
    policy = {"name": "agent", "base_model": "base-model", "endpoints": [endpoint.api_base]}
    gateway = start_gateway(policies=[policy], auth={"mode": "keys", "admin_key": ADMIN_KEY})
    base = f"{gateway.url}/v1/admin/policies/agent/eval-sets"
    with httpx.Client(headers=AUTH, timeout=30) as client:
        # two recorded runs of the policy through the gateway, one rewarded high
        ids = []
        for i, question in enumerate(["Item 1: what is 1 + 2?", "Item 2: what is 2 + 4?"]):
            reply = client.post(
                f"{gateway.url}/v1/chat/completions",
                json={"model": "agent", "messages": [{"role": "user", "content": question}]},
            )
            assert reply.status_code == 200, reply.text
            ids.append(reply.headers["x-trajectory-id"])
            reward = client.post(f"{gateway.url}/v1/rewards", json={"trajectory_id": ids[-1], "reward": [0.9, 0.1][i]})
            assert reward.status_code in (200, 202), reward.text

        bad = client.post(
            base, json={"name": "s", "scoring": {"method": "expected", "expected": "(", "match": "regex"}}
        )
        assert bad.status_code == 400 and "error" in bad.json(), bad.text
        assert client.post(base, json={"name": "s", "scoring": {"method": "oracle"}}).status_code == 400

        created = client.post(
            base, json={"name": "sums", "scoring": {"method": "expected", "expected": r"\b\d+\.", "match": "regex"}}
        )
        assert created.status_code == 201, created.text
        assert client.post(base, json={"name": "sums", "scoring": {"method": "judge"}}).status_code == 409

        outright = {
            "messages": [{"role": "user", "content": "Item 3: what is 3 + 6?"}],
            "scoring": {"method": "expected", "expected": "The answer is 9.", "match": "exact"},
        }
        unknown = "00000000-0000-0000-0000-000000000001"

        def recorded() -> bool:
            added = client.post(f"{base}/sums/items", json={"trajectory_ids": [ids[0]], "items": []})
            return added.status_code == 201 and len(added.json()["data"]) == 1

        from tests.conftest import count_rows, wait_for

        wait_for(recorded, timeout=30)  # the shipper moved the call into PostgreSQL
        # and the rewards posted before it are linked to their runs (what a query by reward reads)
        wait_for(lambda: count_rows(db, "SELECT count(*) FROM rewards WHERE status = 'linked'") == 2, timeout=30)
        added = client.post(
            f"{base}/sums/items",
            json={"items": [outright], "trajectory_ids": [unknown], "query": {"min_reward": 0.5}},
        ).json()
        assert added["missing_trajectory_ids"] == [unknown]
        assert [item["source_trajectory_id"] for item in added["data"]] == [None, ids[0]]
        assert added["data"][1]["messages"] == [{"role": "user", "content": "Item 1: what is 1 + 2?"}]

        shown = client.get(f"{base}/sums").json()
        assert shown["items"] == 3 and len(shown["item_list"]) == 3 and shown["runs"] == []
        assert [s["name"] for s in client.get(base).json()["data"]] == ["sums"]

    version = add_candidate(db, 1, write_adapter(tmp_path, "v1", {"skill": 10}), None)
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"database_url": database_url, "policies": [policy]}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run(
        [sys.executable, "-m", "apprentice.cli", "eval", "-c", str(config), "--policy", "agent", "--version", "v1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "sums: agent-v1 mean 1.0000 on 3/3 items" in result.stdout, result.stdout
    base_run = subprocess.run(
        [sys.executable, "-m", "apprentice.cli", "eval", "-c", str(config), "--policy", "agent", "--version", "base"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert base_run.returncode == 0 and "sums: base-model mean" in base_run.stdout, base_run.stderr
    with httpx.Client(headers=AUTH, timeout=30) as client:
        runs = client.get(f"{base}/sums").json()["runs"]
        assert {(r["target"], r["trigger"], r["scored"]) for r in runs} == {
            ("agent-v1", "cli", 3),
            ("base-model", "cli", 3),
        }
        assert next(r for r in runs if r["target"] == "agent-v1")["adapter_version_id"] == str(version)
        item = client.get(f"{base}/sums").json()["item_list"][0]["id"]
        assert client.delete(f"{base}/sums/items/{item}").status_code == 204
        assert client.delete(f"{base}/sums/items/{item}").status_code == 404
        assert client.delete(f"{base}/sums").status_code == 204
        missing = client.get(f"{base}/sums")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "eval_set_not_found"
    assert json.loads(json.dumps(runs))  # answers are plain JSON
