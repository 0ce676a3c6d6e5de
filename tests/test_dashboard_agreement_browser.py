"""The judge agreement page and the evaluation sets card in a real browser (Chromium through
Selenium, as tests/test_dashboard_browser.py drives it), on a real gateway and PostgreSQL.

The judged groups are those of tests/test_judge_agreement.py (two days, known figures); the page
must show the same figures as the admin API's agreement endpoint, draw the uPlot chart of the
figures and their intervals per day, switch to hours, and log no console error. The policy page
shows the policy's evaluation sets with each version's latest run and the gate's settings.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import wait_for
from tests.test_dashboard_browser import Browser
from tests.test_judge_agreement import _insert_groups, _policies

ADMIN_KEY = "sk-admin-agreement-browser"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def browser_session() -> Iterator[list[Browser]]:
    sessions: list[Browser] = []
    yield sessions
    for session in sessions:
        session.quit()


def _eval_set(db) -> None:
    """A set for `graded` with one finished run of the base model (what `apprentice eval` stores)."""
    set_id, item, run = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    db.execute(
        "INSERT INTO eval_sets (id, policy, name, scoring) VALUES (%s, 'graded', 'held-out', %s)",
        (set_id, '{"method": "expected", "expected": "4"}'),
    )
    db.execute(
        "INSERT INTO eval_items (id, set_id, messages) VALUES (%s, %s, %s)",
        (item, set_id, '[{"role": "user", "content": "2+2?"}]'),
    )
    db.execute(
        "INSERT INTO eval_runs (id, set_id, policy, target, trigger, status, items, scored, mean, finished_at) "
        "VALUES (%s, %s, 'graded', 'fake-base', 'cli', 'finished', 1, 1, 0.75, now())",
        (run, set_id),
    )
    db.execute("INSERT INTO eval_results (run_id, item_id, score) VALUES (%s, %s, 0.75)", (run, item))


def test_the_agreement_page_charts_the_figures_with_their_intervals(start_gateway, fake_upstream, db, browser_session):
    _insert_groups(db)
    _eval_set(db)
    policies = _policies(fake_upstream.api_base)
    policies[0]["promotion"] = {"eval_gate": {"set": "held-out", "margin": 0.1}}
    gateway = start_gateway(policies=policies, auth={"mode": "keys", "admin_key": ADMIN_KEY})
    api = httpx.get(f"{gateway.base_url}/admin/policies/graded/judge/agreement", headers=AUTH, timeout=30).json()

    browser = Browser(gateway.url)
    browser_session.append(browser)
    browser.get("/ui/login")
    browser.find("#login-key").send_keys(ADMIN_KEY)
    browser.find("#login-submit").click()
    browser.find("header [data-testid=actor]")

    browser.get("/ui/policies/graded")
    rows = browser.all("[data-testid=eval-run-row]")
    assert [(r.get_attribute("data-set"), r.get_attribute("data-target")) for r in rows] == [("held-out", "fake-base")]
    assert browser.text("[data-testid=eval-mean]") == "0.75"
    assert "gate: margin 0.1" in browser.text("[data-testid=eval-gate]")
    browser.check("policy-eval-sets")

    browser.find("#agreement-link").click()
    browser.ready()
    assert browser.driver.current_url.endswith("/ui/policies/graded/agreement")
    overall = api["overall"]
    assert browser.text("[data-testid=overall-groups]") == f"{overall['groups']} / {overall['trajectories']}"
    spearman = browser.text("[data-testid=overall-spearman]")
    assert spearman.startswith(f"{overall['spearman']['mean']:.4g}"[:4]), spearman
    interval = overall["spearman"]["interval"]
    assert f"[{interval['low']:.4g}"[:4] in spearman
    buckets = browser.all("[data-testid=agreement-bucket]")
    assert len(buckets) == len(api["buckets"]) == 2
    assert "0.75" in buckets[0].text and "[0.5, 1]" in buckets[0].text  # day 1: rho 0.75 [0.5, 1.0]
    # uPlot drew the chart: its canvas and a legend entry per series (two figures, four bounds)
    browser.find("#agreement-chart .uplot canvas")
    labels = [e.text for e in browser.all("#agreement-chart .u-legend .u-label")]
    assert {"Spearman rho", "rho low", "rho high", "pairwise accuracy", "accuracy low", "accuracy high"} <= set(labels)
    browser.check("judge-agreement")

    browser.find("#bucket-hour").click()
    browser.ready()
    hourly = httpx.get(
        f"{gateway.base_url}/admin/policies/graded/judge/agreement", params={"bucket": "hour"}, headers=AUTH, timeout=30
    ).json()
    assert len(browser.all("[data-testid=agreement-bucket]")) == len(hourly["buckets"])
    browser.find("#agreement-chart .uplot canvas")
    browser.check("judge-agreement-hourly")

    # a recorded run of the policy is picked into the set from its page
    reply = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "graded", "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
        headers=AUTH,
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    trajectory = reply.headers["x-trajectory-id"]
    wait_for(lambda: db.execute("SELECT count(*) FROM calls WHERE trajectory_id = %s", (trajectory,)).fetchone()[0])
    browser.get(f"/ui/trajectories/{trajectory}")
    assert browser.text("#eval-set-name") == "held-out (1 items)"
    button = browser.find("#button-eval-set")
    button.click()
    browser.gone(button)
    assert browser.text("[data-testid=flash]") == "Added to the evaluation set held-out."
    picked = db.execute("SELECT messages FROM eval_items WHERE source_trajectory_id = %s", (trajectory,)).fetchall()
    assert picked == [([{"role": "user", "content": "What is 2 + 3?"}],)]
    browser.check("trajectory-eval-pick")

    # a policy without a judge configured: its scores under the default name `judge`, no error
    browser.get("/ui/policies/plain/agreement")
    browser.find("#agreement-chart")
    browser.check("judge-agreement-plain")
