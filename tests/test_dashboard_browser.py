"""The dashboard in a real browser: Debian's Chromium, driven through its ChromeDriver by Selenium.

One module-wide setup, all real processes: the local inference server on SmolLM2-135M-Instruct
is the policy's endpoint behind a gateway with an admin key (`promotion: {mode: reviewed}`);
a few small groups of calls go through the gateway and get rewards; the learner runs in-process
(`run_once`) and the promotion tick makes its version the canary. The tool-using run goes to
a `model_list` deployment on the fake upstream, which always answers with a tool call (the
small local model does not call tools reliably).

The tests then act as a person would, in order: a wrong admin key is refused, the admin key
logs in, the overview and the policy page show the canary, the canary is approved on its page
(and PostgreSQL says 'promoted'), a second learner run's version is promoted and the first one
is rolled back to from its page (PostgreSQL records the rollback), a run's tool calls are shown,
and an API key is created and revoked. Every page is checked for errors in the browser console
(SEVERE entries of Chromium's log), and each one is saved as a screenshot under
$APPRENTICE_SCREENSHOTS, by default tests/artifacts/dashboard/ (ignored by git; the README's
picture of the policy page, docs/dashboard-policy.png, is a copy of policy.png).
"""

from __future__ import annotations

import base64
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import gateway_config, wait_for
from tests.support.processes import REPO_ROOT, GatewayProcess, ModelServerProcess

CHROMIUM = Path(os.environ.get("APPRENTICE_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("APPRENTICE_CHROMEDRIVER", "/usr/bin/chromedriver"))
SCREENSHOTS = Path(os.environ.get("APPRENTICE_SCREENSHOTS", REPO_ROOT / "tests" / "artifacts" / "dashboard"))


ADMIN_KEY = "sk-admin-dashboard-browser"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
pytestmark = pytest.mark.browser

POLICY = "writer"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
TASKS = tuple(f"Name {thing}." for thing in ("a colour", "a fruit", "an animal", "a city", "a tree", "a planet"))
TASKS += tuple(f"Name {thing}." for thing in ("a river", "a metal", "an instrument", "a sport", "a bird", "a tool"))
SAMPLES = 4  # per task: one group each
MAX_TOKENS = 8
LEARNING = {
    "lr": 1e-3,
    "epochs": 1,
    "micro_batch_size": 8,
    "grad_accumulation": 1,
    "min_group_size": 2,
    # A run trains on the newest two groups only: the rollback test's run stays as small as the first.
    "max_trajectories": 2 * SAMPLES,
    "reward_wait_s": 0,
    "lora_rank": 8,
    "lora_alpha": 16,
    "seed": 0,
    "threads": 2,
}
POLICY_CONFIG = {
    "name": POLICY,
    "base_model": BASE,
    "temperature": 1.0,
    "learning": LEARNING,
    # Reviewed: the canary waits for a person. No KL bound: the run's only job is to make a version.
    "promotion": {"mode": "reviewed", "canary_share": 0.5, "kl_bound": None, "min_samples": 4},
}
# What Chromium logs for the refused login's 401: the one console error the tests expect.
REFUSED_LOGIN = "/ui/login - Failed to load resource: the server responded with a status of 401"
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


@dataclass
class Setup:
    gateway: GatewayProcess
    database_url: str
    settings: Any
    trainer: Any
    tool_trajectory: str
    trajectories: list[str] = field(default_factory=list)

    def db(self) -> psycopg.Connection:
        return psycopg.connect(self.database_url, autocommit=True)

    def status(self, name: str) -> str:
        with self.db() as connection:
            row = connection.execute("SELECT status FROM adapter_versions WHERE name = %s", (name,)).fetchone()
        assert row is not None, f"no version {name}"
        return str(row[0])


def call_policy(gateway: GatewayProcess, content: str, index: int) -> tuple[str, str]:
    """One call of the policy: (its trajectory id, the model that served it: a version's name or the base)."""
    body = {
        "model": POLICY,
        "max_tokens": MAX_TOKENS,
        "seed": index,
        "messages": [{"role": "user", "content": content}],
    }
    answer = httpx.post(f"{gateway.base_url}/chat/completions", json=body, headers=AUTH, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-apprentice-trajectory-id"], answer.json()["model"]


def send_group(gateway: GatewayProcess, task: str) -> tuple[list[str], set[str]]:
    """SAMPLES calls of one task (a group: same prompt), rewarded 0, 1, 0, 1: (trajectory ids, served by).
    Sent at once, as an agent's group is: the server batches them (each call is seeded)."""
    with ThreadPoolExecutor(SAMPLES) as pool:
        calls = list(pool.map(lambda i: call_policy(gateway, task, i), range(SAMPLES)))
    rewards = [{"trajectory_id": t, "reward": float(i % 2)} for i, (t, _) in enumerate(calls)]
    answer = httpx.post(f"{gateway.base_url}/rewards", json={"rewards": rewards}, headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text
    return [t for t, _ in calls], {model for _, model in calls}


def send_groups(gateway: GatewayProcess, round_number: int, *, until_served_by: str | None = None) -> list[str]:
    """Two groups; with `until_served_by`, more until one of them went to that version (the canary
    split hashes each run's first messages, half of them land on the canary)."""
    ids: list[str] = []
    served: set[str] = set()
    for number, task in enumerate(TASKS):
        if number >= 2 and (until_served_by is None or until_served_by in served):
            break
        group, models = send_group(gateway, f"{task} (round {round_number})")
        ids += group
        served |= models
    assert until_served_by is None or until_served_by in served, f"no group went to {until_served_by}: {served}"
    return ids


def wait_linked(setup_db_url: str, ids: list[str]) -> None:
    with psycopg.connect(setup_db_url, autocommit=True) as connection:
        wait_for(
            lambda: (
                connection.execute(
                    "SELECT count(*) FROM rewards WHERE status = 'linked' AND trajectory_id = ANY(%s::uuid[])",
                    ([uuid.UUID(t) for t in ids],),
                ).fetchone()[0]
                == len(ids)
            ),
            timeout=60,
            message="rewards linked",
        )


def learn_and_tick(setup: Setup, trigger: str) -> str:
    """One learner run in-process, then the promotion tick: the new version's name."""
    from apprentice.promotion.tick import run_promotion_tick
    from learner.jobs.run import run_once

    outcome = run_once(setup.settings, POLICY, trigger=trigger, trainer=setup.trainer)
    assert outcome.status == "succeeded", (outcome.status, outcome.error, outcome.metrics)
    assert outcome.version_name
    run_promotion_tick(setup.settings, setup.database_url)
    return outcome.version_name


def tool_run(gateway: GatewayProcess) -> str:
    """A two-call agent run on the fake upstream: a tool call, then the answer after its result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "fake-model", "messages": messages, "tools": TOOLS},
        headers=AUTH,
        timeout=60,
    )
    assert first.status_code == 200, first.text
    message = first.json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    messages += [
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": '{"sky": "clear", "c": 21}'},
    ]
    second = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": "fake-model", "messages": messages, "tools": TOOLS, "tool_choice": "none"},
        headers=AUTH,
        timeout=60,
    )
    assert second.status_code == 200, second.text
    trajectory = first.headers["x-apprentice-trajectory-id"]
    assert second.headers["x-apprentice-trajectory-id"] == trajectory, "the second call continues the run"
    return trajectory


@pytest.fixture(scope="module")
def setup(
    module_database: str,
    fake_upstream: Any,
    smollm2_server: ModelServerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Setup]:
    """The local model behind a gateway, rewarded traffic, one learner run and its canary."""
    import torch

    from apprentice.promotion.tick import run_promotion_tick
    from apprentice.settings import Settings
    from learner.jobs.policy_trainer import PolicyTrainer

    torch.set_num_threads(2)
    workdir = tmp_path_factory.mktemp("dashboard")
    server = smollm2_server  # the session's (tests/conftest.py); it used to start its own, --max-batch-size 8
    gateway: GatewayProcess | None = None
    try:
        policy = {**POLICY_CONFIG, "endpoints": [server.api_base]}
        config = gateway_config(
            module_database,
            workdir / "gateway-data",
            fake_upstream.api_base,
            auth={"mode": "keys", "admin_key": ADMIN_KEY},
            policies=[policy],
            adapter_poll_interval_s=0.2,
        )
        gateway = GatewayProcess(workdir, config)
        gateway.start()
        settings = Settings(database_url=module_database, data_dir=workdir / "learner", policies=[policy])
        setup = Setup(
            gateway=gateway,
            database_url=module_database,
            settings=settings,
            trainer=PolicyTrainer(settings.policy(POLICY)),
            tool_trajectory=tool_run(gateway),
        )
        ids = send_groups(gateway, 0)
        wait_linked(module_database, ids)
        first = learn_and_tick(setup, "dashboard-test-1")
        assert first == f"{POLICY}-v1"
        assert setup.status(first) == "canary", "reviewed mode still starts the canary by itself"
        # A little traffic after the canary started, rewarded, so the chart has a line per version.
        time.sleep(0.6)  # the gateway polls the serving versions every 0.2 s
        more = send_groups(gateway, 1, until_served_by=first)
        wait_linked(module_database, more)
        run_promotion_tick(settings, module_database)  # the canary comparison, as the job stores it
        setup.trajectories = ids + more
        yield setup
    finally:
        if gateway is not None:
            gateway.stop()


# ---------------------------------------------------------------- the browser


class Browser:
    """A Chromium session with console checks and full-page screenshots."""

    def __init__(self, base_url: str) -> None:
        # No skip: these tests must run, and .ci/run installs both from Debian's packages.
        missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
        assert not missing, f"{missing} missing: apt-get install chromium chromium-driver (.ci/run does)"
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        self.driver.implicitly_wait(0)
        self.base_url = base_url
        self.console: list[dict[str, Any]] = []

    def get(self, path: str) -> None:
        self.driver.get(self.base_url + path)
        self.ready()

    def ready(self) -> None:
        WebDriverWait(self.driver, 20).until(lambda d: d.execute_script("return document.readyState") == "complete")

    def find(self, css: str) -> Any:
        return WebDriverWait(self.driver, 20).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
        )

    def all(self, css: str) -> list[Any]:
        return list(self.driver.find_elements(By.CSS_SELECTOR, css))

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def submit_action(self, form_id: str, reason: str) -> None:
        """Fill an action form (reason, confirmation), press its button and accept the browser dialog."""
        action = form_id.removeprefix("action-")
        form = self.find(f"#{form_id}")
        self.find(f"#reason-{action}").send_keys(reason)
        self.find(f"#confirm-{action}").click()
        self.find(f"#button-{action}").click()
        self.accept_dialog()
        self.gone(form)

    def gone(self, element: Any) -> None:
        """Wait until the page that held `element` was replaced (a form's answer arrived).

        Selenium's `staleness_of` knows only the stale-element error; while the new page replaces
        the old one ChromeDriver may answer "Node with given id does not belong to the document"
        instead (an unknown error), which says the same thing and must not fail the wait."""

        def replaced(_driver: Any) -> bool:
            try:
                element.is_enabled()
            except StaleElementReferenceException:
                return True
            except WebDriverException as error:
                if "does not belong to the document" in str(error):
                    return True
                raise
            return False

        WebDriverWait(self.driver, 60).until(replaced)
        self.ready()

    def accept_dialog(self) -> str:
        dialog = WebDriverWait(self.driver, 10).until(expected_conditions.alert_is_present())
        message = str(dialog.text)
        dialog.accept()
        return message

    def console_errors(self, allowed: tuple[str, ...] = ()) -> list[str]:
        """SEVERE entries of the browser's log since the last look, less those naming an allowed text."""
        entries = self.driver.get_log("browser")
        self.console.extend(entries)
        return [e["message"] for e in entries if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]

    def check(self, name: str, allowed: tuple[str, ...] = ()) -> Path:
        """No console errors on this page; then its screenshot, NAME.png."""
        errors = self.console_errors(allowed)
        assert not errors, f"browser console errors on {self.driver.current_url}: {errors}"
        return self.screenshot(name)

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        metrics = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
            },
        )
        path = SCREENSHOTS / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def cookie(self, name: str) -> dict[str, Any] | None:
        found = self.driver.get_cookie(name)
        return dict(found) if found else None

    def quit(self) -> None:
        self.driver.quit()


@pytest.fixture(scope="module")
def browser(setup: Setup) -> Iterator[Browser]:
    if os.environ.get("APPRENTICE_SCREENSHOTS") is None and SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)
    session = Browser(setup.gateway.url)
    yield session
    try:
        errors = session.console_errors()
        assert not errors, f"browser console errors at the end: {errors}"
    finally:
        session.quit()


def logged_in(browser: Browser) -> None:
    if browser.cookie("apprentice_ui") is None:
        browser.get("/ui/login")
        browser.find("#login-key").send_keys(ADMIN_KEY)
        browser.find("#login-submit").click()
        browser.find("header [data-testid=actor]")


# ---------------------------------------------------------------- the tests, in order


def test_a_wrong_admin_key_is_refused(browser: Browser) -> None:
    browser.get("/ui/")
    assert "/ui/login" in browser.driver.current_url, "no session: the dashboard sends you to log in"
    browser.find("#login-key").send_keys("sk-admin-not-this-one")
    browser.find("#login-submit").click()
    message = browser.text("[data-testid=login-error]")
    assert "Wrong key" in message
    assert browser.cookie("apprentice_ui") is None, "no session for a wrong key"
    assert not browser.all("header [data-testid=actor]")
    # The refused login answers 401: Chromium logs that response (and nothing else may be logged).
    browser.check(
        "login-refused", allowed=("/ui/login - Failed to load resource: the server responded with a status of 401",)
    )


def test_the_admin_key_logs_in(browser: Browser) -> None:
    browser.get("/ui/login")
    browser.check("login")
    browser.find("#login-key").send_keys(ADMIN_KEY)
    browser.find("#login-submit").click()
    assert browser.text("header [data-testid=actor]") == "admin"
    assert browser.driver.current_url.rstrip("/").endswith("/ui")
    session = browser.cookie("apprentice_ui")
    assert session is not None and session["httpOnly"] and session["sameSite"] == "Strict"
    assert ADMIN_KEY not in session["value"], "the cookie holds no key"


def test_the_overview_lists_the_policy_with_its_canary(browser: Browser, setup: Setup) -> None:
    logged_in(browser)
    browser.get("/ui/")
    row = browser.find(f"[data-testid=policy-row][data-policy={POLICY}]")
    assert row.find_element("css selector", "[data-testid=canary]").text.startswith(f"{POLICY}-v1")
    assert "50%" in row.find_element("css selector", "[data-testid=canary]").text
    assert row.find_element("css selector", "[data-testid=promoted]").text == "base model"
    assert "reviewed" in row.text
    assert browser.all(f"#policy-row-{POLICY} svg.spark"), "the reward trend is drawn"
    browser.check("overview")


def test_the_policy_page_shows_the_canary_the_reward_chart_and_the_lineage(browser: Browser, setup: Setup) -> None:
    logged_in(browser)
    browser.get(f"/ui/policies/{POLICY}")
    assert browser.text("[data-testid=policy-name]") == POLICY
    assert browser.text("#policy-live [data-testid=canary]").startswith(f"{POLICY}-v1")
    assert browser.find("[data-testid=canary-comparison]").is_displayed()
    canvas = browser.find("#reward-chart canvas")
    assert canvas.size["width"] >= 300 and canvas.size["height"] > 100, "uPlot drew the chart"
    legend = browser.text("#reward-chart")
    assert "base model" in legend and f"{POLICY}-v1" in legend, f"a line per version: {legend}"
    lineage = browser.all("[data-testid=lineage] li")
    assert [item.text.split()[0] for item in lineage] == [f"{POLICY}-v1"]
    assert "canary" in lineage[0].text
    assert browser.all(f"[data-testid=version-row][data-version={POLICY}-v1]")
    runs = browser.all("#runs-live [data-testid=run-row]")
    assert len(runs) == 1 and f"{POLICY}-v1" in runs[0].text and "succeeded" in runs[0].text
    browser.check("policy")


def test_approving_the_canary_promotes_it_in_postgresql(browser: Browser, setup: Setup) -> None:
    logged_in(browser)
    name = f"{POLICY}-v1"
    browser.get(f"/ui/versions/{name}")
    assert "canary" in browser.text("[data-testid=version-status]")
    browser.check("version-canary")
    browser.submit_action("action-approve", "reviewed in the browser test")
    flash = browser.text("[data-testid=flash]")
    assert f"approve: {name} canary → promoted" in flash, flash
    assert "promoted" in browser.text("[data-testid=version-status]")
    assert not browser.all("#action-approve"), "a promoted version has no approve action"
    assert setup.status(name) == "promoted"
    with setup.db() as connection:
        last = connection.execute(
            "SELECT t.from_status, t.to_status, t.actor, t.reason FROM adapter_transitions t "
            "JOIN adapter_versions v ON v.id = t.adapter_version_id WHERE v.name = %s ORDER BY t.id DESC LIMIT 1",
            (name,),
        ).fetchone()
    assert last == ("canary", "promoted", "admin", "reviewed in the browser test")
    browser.check("version-approved")


def test_rolling_back_to_the_retired_version(browser: Browser, setup: Setup) -> None:
    # A second learner run continues v1; its version is approved through the admin API, which retires v1.
    ids = send_groups(setup.gateway, 2)
    wait_linked(setup.database_url, ids)
    second = learn_and_tick(setup, "dashboard-test-2")
    assert second == f"{POLICY}-v2" and setup.status(second) == "canary"
    approved = httpx.post(
        f"{setup.gateway.base_url}/admin/versions/{second}/approve",
        json={"reason": "approved by the admin API"},
        headers=AUTH,
        timeout=120,
    )
    assert approved.status_code == 200, approved.text
    first = f"{POLICY}-v1"
    assert setup.status(first) == "retired" and setup.status(second) == "promoted"

    logged_in(browser)
    browser.get(f"/ui/versions/{first}")
    assert "retired" in browser.text("[data-testid=version-status]")
    browser.check("version-retired")
    browser.submit_action("action-rollback", "v2 answers worse")
    flash = browser.text("[data-testid=flash]")
    assert f"rollback: {first} retired → promoted; also {second} → retired" in flash, flash
    assert "promoted" in browser.text("[data-testid=version-status]")
    assert setup.status(first) == "promoted" and setup.status(second) == "retired"
    with setup.db() as connection:
        rows = connection.execute(
            "SELECT v.name, t.from_status, t.to_status, t.actor, t.reason FROM adapter_transitions t "
            "JOIN adapter_versions v ON v.id = t.adapter_version_id WHERE t.policy = %s ORDER BY t.id",
            (POLICY,),
        ).fetchall()
    assert (first, "retired", "promoted", "admin", "v2 answers worse") in rows, rows
    browser.check("version-rolled-back")

    browser.get(f"/ui/policies/{POLICY}")
    assert browser.text("#policy-live [data-testid=promoted]") == first
    transitions = browser.text("#transitions-live")
    assert "v2 answers worse" in transitions
    browser.check("policy-after-rollback")


def test_a_trajectory_shows_its_tool_calls(browser: Browser, setup: Setup) -> None:
    logged_in(browser)
    browser.get("/ui/trajectories")
    browser.find(f"[data-testid=trajectory-row][data-trajectory='{setup.tool_trajectory}']")
    browser.check("trajectories")
    browser.find(
        f"[data-testid=trajectory-row][data-trajectory='{setup.tool_trajectory}'] [data-testid=trajectory-link]"
    ).click()
    browser.ready()
    assert browser.text("[data-testid=trajectory-id]") == setup.tool_trajectory
    calls = browser.all("[data-testid=tool-call]")
    assert calls, "the run's tool call is shown"
    assert {c.get_attribute("data-tool-name") for c in calls} == {"get_weather"}
    assert calls[0].find_element("css selector", "[data-testid=tool-name]").text == "get_weather"
    assert "weather" in calls[0].find_element("css selector", "[data-testid=tool-arguments]").text
    assert "clear" in browser.text("[data-testid=tool-result]")
    roles = [m.get_attribute("data-role") for m in browser.all("[data-testid=message]")]
    assert roles[:3] == ["user", "assistant", "tool"] and roles[-1] == "assistant", roles
    browser.check("trajectory-tool-calls")

    browser.get(f"/ui/trajectories/{setup.trajectories[0]}")
    assert browser.all("[data-testid=message][data-role=assistant]")
    browser.check("trajectory-rewarded")


def test_the_keys_page_creates_and_revokes_a_key(browser: Browser, setup: Setup) -> None:
    logged_in(browser)
    browser.get("/ui/keys")
    browser.check("keys")
    browser.find("#key-name").send_keys("browser-made")
    browser.find("#key-tenant").send_keys("acme")
    browser.find("#key-confirm").click()
    browser.find("#key-create-submit").click()
    assert browser.accept_dialog() == "Create this key?"
    new_key = browser.text("[data-testid=new-key]")
    assert new_key.startswith("apk-")
    row = browser.find("[data-testid=key-row][data-key-name=browser-made]")
    key_id = row.get_attribute("data-key")
    assert (
        httpx.get(
            f"{setup.gateway.base_url}/models", headers={"Authorization": f"Bearer {new_key}"}, timeout=30
        ).status_code
        == 200
    )
    browser.check("key-created")

    row.find_element("css selector", "[data-testid=key-revoke] [data-testid=confirm]").click()
    row.find_element("css selector", "[data-testid=button-revoke]").click()
    assert browser.accept_dialog().startswith("Revoke key browser-made?")
    browser.gone(row)
    assert browser.text("[data-testid=flash]") == "Key revoked."
    with setup.db() as connection:
        revoked = connection.execute("SELECT revoked_at FROM api_keys WHERE id = %s", (key_id,)).fetchone()
    assert revoked is not None and revoked[0] is not None
    assert not browser.all(f"[data-key='{key_id}'] [data-testid=key-revoke]")
    browser.check("key-revoked")


def test_the_other_pages_render_without_console_errors(browser: Browser, setup: Setup) -> None:
    logged_in(browser)
    browser.get("/ui/rewards")
    browser.check("rewards")
    with setup.db() as connection:
        reward_id = connection.execute(
            "SELECT id FROM rewards WHERE trajectory_id = %s", (uuid.UUID(setup.trajectories[0]),)
        ).fetchone()[0]
    browser.get(f"/ui/rewards/{reward_id}")
    browser.check("reward")
    browser.get(f"/ui/versions/{POLICY}-v2")
    browser.check("version-after-rollback")
    # Stay a poll interval on a live page: its updates must not log errors either.
    browser.get(f"/ui/policies/{POLICY}")
    time.sleep(5.5)
    browser.check("policy-polled")
    logout = browser.find("#logout")
    logout.click()
    browser.gone(logout)
    assert "/ui/login" in browser.driver.current_url
    assert browser.cookie("apprentice_ui") is None
    browser.get("/ui/")
    assert "/ui/login" in browser.driver.current_url, "logged out: the dashboard asks for the key again"
    browser.check("logged-out")
