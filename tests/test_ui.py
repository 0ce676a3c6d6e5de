"""The web dashboard under /ui against a real gateway process and PostgreSQL, over real HTTP:
login and sessions, CSRF, the actions (the same rows as the admin API writes), a recorded run
shown as its conversation with tool calls, ETags on the live data, and the static files."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from tests.conftest import wait_for

ADMIN_KEY = "sk-admin-ui-test"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
POLICIES = [
    {"name": "agent", "base_model": "base", "endpoints": ["http://127.0.0.1:9/v1"]},
    {"name": "other", "base_model": "base", "endpoints": ["http://127.0.0.1:9/v1"]},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def gateway(start_gateway):
    return start_gateway(auth={"mode": "keys", "admin_key": ADMIN_KEY}, policies=POLICIES)


def hidden(html: str, name: str = "csrf_token") -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found, f"no hidden field {name} in the page"
    return found.group(1)


def login(client: httpx.Client, key: str = ADMIN_KEY) -> httpx.Response:
    form = client.get("/ui/login")
    return client.post("/ui/login", data={"csrf_token": hidden(form.text), "key": key, "next": "/ui/"})


@pytest.fixture
def ui(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        assert login(client).status_code == 303
        yield client


def add_candidate(db, policy: str, number: int, kind: str = "rl") -> uuid.UUID:
    run_id, version_id = uuid.uuid4(), uuid.uuid4()
    db.execute(
        "INSERT INTO training_runs (id, policy, status, kind, loss, kl, clip_fraction, samples, mean_reward, "
        "duration_s, finished_at, produced_version_id) "
        "VALUES (%s, %s, 'succeeded', %s, 0.31, 0.02, 0.1, 64, 0.5, 12.5, now(), %s)",
        (run_id, policy, kind, version_id),
    )
    db.execute(
        "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path, training_run_id) "
        "VALUES (%s, %s, %s, %s, 'candidate', 'base', '/adapters/x', %s)",
        (version_id, policy, number, f"{policy}-v{number}", run_id),
    )
    return version_id


def test_login_refuses_a_wrong_key_and_sets_a_strict_session_cookie_for_the_admin_key(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        first = client.get("/ui/")
        assert first.status_code == 303 and first.headers["location"].startswith("/ui/login?next=")
        page = client.get("/ui/login")
        assert 'id="login-form"' in page.text and 'id="login-key"' in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'self'")

        wrong = client.post("/ui/login", data={"csrf_token": hidden(page.text), "key": "sk-wrong-key-123"})
        assert wrong.status_code == 401
        assert 'data-testid="login-error"' in wrong.text and "Wrong key" in wrong.text
        assert "apprentice_ui=" not in wrong.headers.get("set-cookie", "")
        assert "apprentice_ui" not in client.cookies

        expired = client.post("/ui/login", data={"csrf_token": "forged", "key": ADMIN_KEY})
        assert expired.status_code == 403 and "apprentice_ui" not in client.cookies

        ok = login(client)
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/"
        cookie = next(c for c in ok.headers.get_list("set-cookie") if c.startswith("apprentice_ui="))
        lowered = cookie.lower()
        assert "httponly" in lowered and "samesite=strict" in lowered and "path=/ui" in lowered
        assert ADMIN_KEY not in cookie

        overview = client.get("/ui/")
        assert overview.status_code == 200
        assert 'data-testid="policy-row" data-policy="agent"' in overview.text
        assert 'data-testid="policy-row" data-policy="other"' in overview.text

        logout = client.post("/ui/logout", data={"csrf_token": hidden(overview.text)})
        assert logout.status_code == 303
        assert client.get("/ui/").status_code == 303


def test_a_client_key_is_not_enough_and_a_tampered_cookie_is_refused(gateway, ui):
    keys = ui.get("/ui/keys")
    created = ui.post(
        "/ui/keys", data={"csrf_token": hidden(keys.text), "name": "robot", "tenant": "acme", "confirm": "yes"}
    )
    client_key = re.search(r'id="new-key" data-testid="new-key">([^<]+)<', created.text).group(1)
    with httpx.Client(base_url=gateway.url, timeout=30) as other:
        refused = login(other, client_key)
        assert refused.status_code == 403 and "not an admin key" in refused.text
        other.cookies.set("apprentice_ui", ui.cookies["apprentice_ui"][:-3] + "AAA", path="/ui")
        assert other.get("/ui/").status_code == 303


def test_posts_need_the_csrf_token_and_the_same_origin(gateway, ui, db):
    page = ui.get("/ui/policies/agent")
    assert page.status_code == 200
    token = hidden(page.text)
    form = {"reason": "maintenance", "confirm": "yes"}
    assert ui.post("/ui/policies/agent/pause", data=form).status_code == 403
    assert ui.post("/ui/policies/agent/pause", data={**form, "csrf_token": "nope"}).status_code == 403
    evil = ui.post(
        "/ui/policies/agent/pause", data={**form, "csrf_token": token}, headers={"Origin": "https://evil.example"}
    )
    assert evil.status_code == 403
    assert ui.post("/ui/policies/agent/pause", data={"csrf_token": token, "confirm": "yes"}).status_code == 400
    assert ui.post("/ui/policies/agent/pause", data={"csrf_token": token, "reason": "x"}).status_code == 400
    assert db.execute("SELECT count(*) FROM policy_state").fetchone()[0] == 0

    done = ui.post("/ui/policies/agent/pause", data={**form, "csrf_token": token}, headers={"Origin": gateway.url})
    assert done.status_code == 200 and 'data-testid="learning-state"' in done.text
    # The admin API pauses the other policy: the same row shape.
    assert httpx.post(f"{gateway.base_url}/admin/policies/other/pause", headers=AUTH, timeout=30).status_code == 200
    rows = db.execute("SELECT policy, learning_paused, updated_by FROM policy_state ORDER BY policy").fetchall()
    assert rows == [("agent", True, "admin"), ("other", True, "admin")]
    resumed = ui.post("/ui/policies/agent/resume", data={**form, "csrf_token": token})
    assert resumed.status_code == 200
    assert db.execute("SELECT learning_paused FROM policy_state WHERE policy = 'agent'").fetchone()[0] is False


def test_rejecting_a_candidate_writes_what_the_admin_api_writes(gateway, ui, db):
    mine, theirs = add_candidate(db, "agent", 1), add_candidate(db, "agent", 2)
    page = ui.get("/ui/versions/agent-v1")
    assert page.status_code == 200
    for testid in ("action-approve", "action-reject", "action-promote", "gates", "training-run", "evaluation"):
        assert f'data-testid="{testid}"' in page.text
    token = hidden(page.text)
    unconfirmed = ui.post("/ui/versions/agent-v1/reject", data={"csrf_token": token, "reason": "tone regressed"})
    assert unconfirmed.status_code == 400
    assert db.execute("SELECT status FROM adapter_versions WHERE id = %s", (mine,)).fetchone()[0] == "candidate"

    done = ui.post(
        "/ui/versions/agent-v1/reject", data={"csrf_token": token, "reason": "tone regressed", "confirm": "yes"}
    )
    assert done.status_code == 200 and "candidate → rejected" in done.text
    api = httpx.post(
        f"{gateway.base_url}/admin/versions/agent-v2/reject",
        headers=AUTH,
        json={"reason": "tone regressed"},
        timeout=30,
    )
    assert api.status_code == 200

    def transitions(version_id):
        return db.execute(
            "SELECT from_status, to_status, actor, reason FROM adapter_transitions WHERE adapter_version_id = %s "
            "ORDER BY id",
            (version_id,),
        ).fetchall()

    assert transitions(mine) == transitions(theirs) == [("candidate", "rejected", "admin", "tone regressed")]
    statuses = db.execute("SELECT status FROM adapter_versions WHERE id = ANY(%s)", ([mine, theirs],)).fetchall()
    assert statuses == [("rejected",), ("rejected",)]

    again = ui.post(
        "/ui/versions/agent-v1/approve", data={"csrf_token": token, "reason": "changed my mind", "confirm": "yes"}
    )
    assert again.status_code == 409 and "refused" in again.text
    policy = ui.get("/ui/policies/agent")
    assert policy.status_code == 200
    assert 'data-testid="transition-row"' in policy.text and "tone regressed" in policy.text
    assert 'data-testid="run-row"' in policy.text and 'id="reward-chart"' in policy.text


def test_training_runs_say_their_kind_and_filter_on_it_in_the_admin_api_and_the_dashboard(gateway, ui, db):
    """Migration 0010's promise: a policy's distilled versions (and runs) with one filter."""
    add_candidate(db, "agent", 1, kind="rl")
    add_candidate(db, "agent", 2, kind="sft")

    def names(query: str) -> list[str]:
        answer = httpx.get(f"{gateway.base_url}/admin/policies/agent/versions{query}", headers=AUTH, timeout=30)
        assert answer.status_code == 200, answer.text
        return [v["name"] for v in answer.json()["data"]]

    assert names("") == ["agent-v2", "agent-v1"]
    assert names("?kind=sft") == ["agent-v2"] and names("?kind=rl") == ["agent-v1"]
    wrong = httpx.get(f"{gateway.base_url}/admin/policies/agent/versions?kind=dpo", headers=AUTH, timeout=30)
    assert wrong.status_code in (400, 422) and "error" in wrong.json()
    detail = httpx.get(f"{gateway.base_url}/admin/versions/agent-v2", headers=AUTH, timeout=30).json()
    assert detail["training_run"]["kind"] == "sft"

    everything = ui.get("/ui/policies/agent")
    assert re.findall(r'data-testid="run-kind">(\w+)<', everything.text) == ["sft", "rl"]
    distilled = ui.get("/ui/policies/agent?kind=sft")
    assert re.findall(r'data-testid="run-kind">(\w+)<', distilled.text) == ["sft"]
    assert 'data-poll="/ui/data/policies/agent?kind=sft"' in distilled.text, "the live refresh keeps the filter"
    live = ui.get("/ui/data/policies/agent?kind=rl").json()["fragments"]["runs-live"]
    assert re.findall(r'data-testid="run-kind">(\w+)<', live) == ["rl"]


def test_a_recorded_run_is_shown_as_its_conversation_with_tool_calls_and_rewards(gateway, ui, db):
    messages = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in <Paris>?"},
    ]
    first = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers=AUTH,
        json={"model": "fake-model", "messages": messages, "tools": TOOLS},
        timeout=30,
    )
    assert first.status_code == 200
    trajectory = first.headers["x-apprentice-trajectory-id"]
    call = first.json()["choices"][0]["message"]["tool_calls"][0]
    follow_up = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature": 21}'},
    ]
    second = httpx.post(
        f"{gateway.base_url}/chat/completions",
        headers=AUTH,
        json={"model": "fake-model", "messages": follow_up, "tools": TOOLS, "tool_choice": "none"},
        timeout=30,
    )
    assert second.status_code == 200 and second.headers["x-apprentice-trajectory-id"] == trajectory
    wait_for(
        lambda: db.execute("SELECT count(*) FROM calls WHERE trajectory_id = %s", (trajectory,)).fetchone()[0] == 2,
        message="both calls shipped",
    )
    reward = httpx.post(
        f"{gateway.base_url}/rewards",
        headers=AUTH,
        json={"trajectory_id": trajectory, "reward": 0.75, "comment": "answered with the tool's result"},
        timeout=30,
    )
    assert reward.status_code == 200
    reward_id = reward.json()["id"]

    page = ui.get(f"/ui/trajectories/{trajectory}")
    assert page.status_code == 200
    html = page.text
    roles = re.findall(r'data-testid="message" data-role="(\w+)"', html)
    assert roles == ["system", "user", "assistant", "tool", "assistant"]  # the shared prefix shown once
    assert 'data-testid="tool-call" data-tool-name="get_weather"' in html
    assert html.count('data-testid="tool-call"') == 1
    assert 'data-testid="tool-result"' in html and "{&#34;temperature&#34;: 21}" in html
    assert "Weather in &lt;Paris&gt;?" in html  # escaped
    assert f'id="reward-{reward_id}"' in html and "answered with the tool&#39;s result" in html

    reward_page = ui.get(f"/ui/rewards/{reward_id}")
    assert reward_page.status_code == 200
    assert f'href="/ui/trajectories/{trajectory}#reward-{reward_id}"' in reward_page.text

    listing = ui.get("/ui/trajectories", params={"reward_min": "0.5", "reward_max": "1"})
    assert f'data-trajectory="{trajectory}"' in listing.text
    assert f'data-trajectory="{trajectory}"' not in ui.get("/ui/trajectories", params={"reward_min": "0.9"}).text
    assert ui.get("/ui/trajectories", params={"policy": "agent"}).status_code == 200


def test_a_judge_score_shows_its_explanation(gateway, ui, db):
    trajectory = uuid.uuid4()
    db.execute(
        "INSERT INTO trajectories (id, tenant, model, policy, first_call_at, last_call_at, call_count) "
        "VALUES (%s, 'acme', 'agent', 'agent', now(), now(), 0)",
        (trajectory,),
    )
    judgement = uuid.uuid4()
    db.execute(
        "INSERT INTO judgements (id, policy, tenant, group_key, judge_model, rubric_hash, mode, status, "
        "trajectory_ids, members_key) "
        "VALUES (%s, 'agent', 'acme', 'group:g', 'judge-model', 'abc123', 'missing', 'judged', %s, md5(%s::text))",
        (judgement, [trajectory], judgement),
    )
    db.execute(
        "INSERT INTO rewards (id, tenant, target_kind, target, trajectory_id, status, name, value, comment, "
        "content_hash, source, judgement_id, observed_at, linked_at) VALUES (%s, 'acme', 'trajectory', %s, %s, "
        "'linked', 'judge', 0.4, 'too verbose', '\\x00', 'judge', %s, now(), now())",
        (uuid.uuid4(), str(trajectory), trajectory, judgement),
    )
    html = ui.get(f"/ui/trajectories/{trajectory}").text
    assert 'data-testid="judge-explanation">too verbose' in html and "judge-model" in html


def test_data_endpoints_answer_304_on_an_unchanged_etag(gateway, ui):
    assert httpx.get(f"{gateway.url}/ui/data/overview", timeout=30).status_code == 401
    first = ui.get("/ui/data/overview")
    assert first.status_code == 200 and "policy-rows" in first.json()["fragments"]
    etag = first.headers["etag"]
    again = ui.get("/ui/data/overview", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    for path in ("/ui/data/policies/agent", "/ui/data/rewards"):
        answer = ui.get(path)
        assert answer.status_code == 200
        assert ui.get(path, headers={"If-None-Match": answer.headers["etag"]}).status_code == 304


def test_every_page_renders_and_references_no_other_origin(gateway, ui, db):
    add_candidate(db, "agent", 1)
    for path in ("/ui/", "/ui/policies/agent", "/ui/versions/agent-v1", "/ui/trajectories", "/ui/rewards", "/ui/keys"):
        page = ui.get(path)
        assert page.status_code == 200, path
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
        assert not re.search(r'(src|href)="(https?:)?//', page.text), path
        assert "<script>" not in page.text  # scripts only from static files
    assert ui.get("/ui/versions/nope-v9").status_code == 404


def test_static_files_ship_with_the_chart_library_and_its_licence(gateway):
    licence = httpx.get(f"{gateway.url}/ui/static/vendor/uplot/LICENSE", timeout=30)
    assert licence.status_code == 200 and "MIT License" in licence.text
    version = httpx.get(f"{gateway.url}/ui/static/vendor/uplot/VERSION.md", timeout=30)
    assert version.status_code == 200 and "npm pack uplot" in version.text
    script = httpx.get(f"{gateway.url}/ui/static/vendor/uplot/uPlot.iife.min.js", timeout=30)
    assert script.status_code == 200 and "uPlot" in script.text
    assert "javascript" in script.headers["content-type"]
    cached = httpx.get(f"{gateway.url}/ui/static/ui.js", headers={"If-None-Match": script.headers["etag"]}, timeout=30)
    assert cached.status_code == 200
    ui_js = httpx.get(f"{gateway.url}/ui/static/ui.js", timeout=30)
    assert (
        httpx.get(
            f"{gateway.url}/ui/static/ui.js", headers={"If-None-Match": ui_js.headers["etag"]}, timeout=30
        ).status_code
        == 304
    )
    assert httpx.get(f"{gateway.url}/ui/static/../session.py", timeout=30).status_code == 404
    assert httpx.get(f"{gateway.url}/ui/static/%2e%2e/session.py", timeout=30).status_code == 404


def test_keys_are_created_and_revoked_and_a_revoked_admin_key_ends_its_session(gateway, ui, db):
    page = ui.get("/ui/keys")
    created = ui.post(
        "/ui/keys",
        data={"csrf_token": hidden(page.text), "name": "ops", "tenant": "acme", "role": "admin", "confirm": "yes"},
    )
    assert created.status_code == 200
    key = re.search(r'id="new-key" data-testid="new-key">([^<]+)<', created.text).group(1)
    key_id = db.execute("SELECT id FROM api_keys WHERE name = 'ops' AND role = 'admin'").fetchone()[0]
    with httpx.Client(base_url=gateway.url, timeout=30) as other:
        assert login(other, key).status_code == 303
        assert 'data-testid="actor">ops<' in other.get("/ui/").text
        revoked = ui.post(f"/ui/keys/{key_id}/revoke", data={"csrf_token": hidden(page.text), "confirm": "yes"})
        assert revoked.status_code == 200 and "Key revoked" in revoked.text
        assert db.execute("SELECT revoked_at IS NOT NULL FROM api_keys WHERE id = %s", (key_id,)).fetchone()[0]
        assert other.get("/ui/").status_code == 303


def test_a_canary_comparison_shows_the_tests_wealth_beside_its_interval():
    """The sequential method's verdict is its test by betting: where the interval still holds 0
    the page says what decided (the wealth and the threshold), not only the interval."""
    from gateway.ui.render import environment

    evaluation = {
        "verdict": "better",
        "decision": "promote",
        "method": "sequential",
        "confidence": 0.92,
        "canary": {"n": 340, "mean": 0.09},
        "incumbent": {"n": 330, "mean": 0.02},
        "interval": {
            "difference": 0.04,
            "low": -0.013,
            "high": 0.094,
            "wealth_better": 27.5,
            "wealth_worse": 0.46,
            "threshold_better": 20.0,
            "threshold_worse": 25.0,
        },
    }
    page = environment.get_template("_evaluation.html").render(evaluation=evaluation)
    assert 'data-testid="evidence"' in page and "27.5" in page
    assert "promotes at 20" in page and "rejects at 25" in page
    assert "[-0.013, 0.094]" in page
    newest_only = {**evaluation, "interval": {**evaluation["interval"], "threshold_better": None}}
    assert "never promotes" in environment.get_template("_evaluation.html").render(evaluation=newest_only)
    # An evaluation stored before the thresholds were per direction still reads.
    per_direction = ("threshold_better", "threshold_worse")
    old_interval = {key: value for key, value in evaluation["interval"].items() if key not in per_direction}
    stored = {**evaluation, "interval": {**old_interval, "threshold": 25.0}}
    assert "decides at 25" in environment.get_template("_evaluation.html").render(evaluation=stored)
    fixed = environment.get_template("_evaluation.html").render(
        evaluation={**evaluation, "method": "welch", "interval": {"difference": 0.04, "low": 0.01, "high": 0.07}}
    )
    assert 'data-testid="evidence"' not in fixed, "a fixed-sample interval decides by itself"
