"""A policy with a teacher (docs/distillation.md): the teacher serves its traffic until the policy
takes over; what a distillation run selects; the takeover decision on reward, cost and latency.

Real gateway processes and PostgreSQL; the fake upstream stands in for both the hosted teacher
("teacher-..." answers by a hidden rule) and the policy's inference endpoint.
"""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import psycopg
import pytest

from apprentice.promotion.evaluation import PROMOTE, REJECT, WAIT, compare
from apprentice.promotion.takeover import ArmCalls, Prices, decide_takeover, teacher_prices
from apprentice.settings import Settings, TeacherSettings
from gateway.upstreams.routing import Router
from tests.conftest import wait_for
from tests.support.canary import interleaved_units
from tests.support.fake_teacher import RULE_PREFIX
from tests.test_adapter_routing import add_version, forwarded_models

POLICY = "writer"


def teacher_entry(api_base: str, **model_info: float) -> dict:
    return {
        "model_name": "teacher",
        "litellm_params": {"model": "openai/teacher-rule", "api_base": api_base, "api_key": "sk-teacher"},
        "model_info": model_info,
    }


def policy_config(endpoint: str, **teacher: object) -> dict:
    return {
        "name": POLICY,
        "base_model": "fake-base",
        "temperature": 0.9,
        "endpoints": [endpoint],
        "teacher": {"model": "teacher", **teacher},
    }


def start(start_gateway, fake_upstream, endpoint: str | None = None, **teacher: object):
    models = [
        {
            "model_name": "fake-model",
            "litellm_params": {"model": "openai/fake-model", "api_base": fake_upstream.api_base},
        },
        teacher_entry(fake_upstream.api_base, input_cost_per_token=1e-6, output_cost_per_token=4e-6),
    ]
    gateway = start_gateway(
        model_list=models,
        policies=[policy_config(endpoint or fake_upstream.api_base, **teacher)],
        adapter_poll_interval_s=0.1,
    )
    return gateway, openai.OpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)


def ask(client: openai.OpenAI, thing: str, seed: int = 0) -> str:
    completion = client.chat.completions.create(
        model=POLICY, seed=seed, messages=[{"role": "user", "content": f"Describe {thing} in 8 words or fewer."}]
    )
    return completion.choices[0].message.content or ""


def test_the_teacher_serves_the_policy_until_a_version_is_promoted(start_gateway, fake_upstream, db):
    gateway, client = start(start_gateway, fake_upstream)
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    answers = [ask(client, thing) for thing in ("a cat", "the sea", "a kite")]
    assert all(a.startswith(RULE_PREFIX) for a in answers), answers
    forwarded = httpx.get(f"http://127.0.0.1:{fake_upstream.port}/_requests").json()["requests"]
    assert [b["model"] for b in forwarded] == ["teacher-rule"] * 3
    # the hosted teacher is asked as the client asked: no policy temperature, no vLLM token fields
    assert all("temperature" not in b and "return_token_ids" not in b and "logprobs" not in b for b in forwarded)
    rows = wait_for(
        lambda: (
            (r := db.execute("SELECT policy, upstream, upstream_model, adapter_version_id FROM calls").fetchall())
            and len(r) == 3
            and r
        )
    )
    assert set(rows) == {(POLICY, "teacher", "teacher-rule", None)}, "recorded under the policy, as the teacher's"

    # a canary with the whole share: the policy's endpoint answers with the adapter
    canary = add_version(db, POLICY, 1, "canary", share=1.0)
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    wait_for(lambda: ask(client, "a new thing") and forwarded_models(fake_upstream)[-1] == f"{POLICY}-v1", timeout=10)
    # promoted: the teacher no longer serves
    db.execute("UPDATE adapter_versions SET status = 'promoted', canary_share = NULL WHERE id = %s", (canary,))
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    wait_for(lambda: ask(client, "yet another") and forwarded_models(fake_upstream)[-1] == f"{POLICY}-v1", timeout=10)
    for thing in ("a dog", "a bell", "a map"):
        ask(client, thing)
    assert forwarded_models(fake_upstream)[-3:] == [f"{POLICY}-v1"] * 3


def test_after_takeover_the_teacher_answers_when_the_policy_endpoint_fails(start_gateway, fake_upstream, db):
    gateway, client = start(start_gateway, fake_upstream, endpoint="http://127.0.0.1:9/v1", fallback=True)
    add_version(db, POLICY, 1, "promoted")
    httpx.delete(f"http://127.0.0.1:{fake_upstream.port}/_requests")
    time.sleep(1.0)  # the gateway reads serving versions every 0.1 s
    answer = ask(client, "a cat")
    assert answer.startswith(RULE_PREFIX) or answer.startswith("Well,")
    assert forwarded_models(fake_upstream) == ["teacher-rule"], "the teacher is asked for its own model, not the LoRA"
    row = wait_for(lambda: db.execute("SELECT upstream, adapter_version_id FROM calls").fetchone())
    assert row == ("teacher", None), "a call the teacher answered is not recorded as the adapter's sample"


def test_a_teacher_must_be_a_model_list_entry():
    with pytest.raises(ValueError, match="teacher.model 'nowhere' is not a model_list entry"):
        Settings(
            policies=[{"name": "p", "base_model": "b", "endpoints": ["http://x/v1"], "teacher": {"model": "nowhere"}}]
        )
    with pytest.raises(ValueError, match="set min_reward, top_share or both"):
        TeacherSettings(model="t", distill={"top_share": None})


def test_calls_the_teacher_serves_alternate_between_its_deployments():
    # Building a teacher-served call's plan (plan, then teacher_plan) must advance the teacher's
    # rotation once: advanced twice, every first attempt went to the same one of two deployments.
    teacher = {"model_name": "teacher", "litellm_params": {"model": "openai/t"}}
    settings = Settings(
        model_list=[
            {**teacher, "litellm_params": {"model": "openai/t", "api_base": "http://a/v1"}},
            {**teacher, "litellm_params": {"model": "openai/t", "api_base": "http://b/v1"}},
        ],
        policies=[{"name": "p", "base_model": "b", "endpoints": ["http://x/v1"], "teacher": {"model": "teacher"}}],
    )
    router = Router(settings)
    first = [router.teacher_plan(router.plan("p")).targets[0].api_base for _ in range(4)]
    assert first == ["http://a/v1", "http://b/v1", "http://a/v1", "http://b/v1"]
    fallback = router.plan("p").targets[-2:]
    assert [t.api_base for t in fallback] == ["http://a/v1", "http://b/v1"] and all(t.teacher for t in fallback)


def _comparison(policy: list[float], teacher: list[float]):
    return compare(
        interleaved_units(policy, teacher), method="sequential", confidence=0.9, min_samples=8, reward_range=(0.0, 1.0)
    )


def _decide(policy: list[float], teacher: list[float], *, policy_price=None, latency=(50.0, 400.0), **settings):
    lineage = _comparison(policy, teacher)
    calls = (
        ArmCalls(len(policy), 30.0, 10.0, latency[0], latency[0]),
        ArmCalls(len(teacher), 30.0, 10.0, latency[1], latency[1]),
    )
    return decide_takeover(
        lineage,
        lineage,
        *calls,
        teacher=TeacherSettings(model="teacher", **settings),
        teacher_price=Prices(1e-6, 4e-6, "test"),
        policy_price=policy_price,
        mode="automatic",
        elapsed_s=10.0,
        timeout_s=3600.0,
    )


def test_takeover_is_non_inferiority_within_the_margin_and_says_what_it_saves():
    good = [1.0] * 42 + [0.0] * 6  # 0.875
    teacher = [1.0] * 36 + [0.0] * 12  # 0.75
    bad = [1.0] * 10 + [0.0] * 38
    taken = _decide(good, teacher, takeover_margin=0.2, policy_price=Prices(1e-7, 1e-7, "test"))
    assert taken.decision == PROMOTE and "takes over from the teacher" in taken.reason
    cost = taken.document["cost"]
    assert cost["teacher_per_call"] == pytest.approx(30 * 1e-6 + 10 * 4e-6)
    assert cost["saving_per_call"] == pytest.approx(7e-5 - 4e-6) and "saves" in taken.reason
    assert taken.document["latency"]["ratio"] == pytest.approx(0.125)
    # a margin too tight for this much evidence: wait; far worse: the policy stays behind
    assert _decide(good, teacher, takeover_margin=0.0).decision == WAIT
    behind = _decide(bad, teacher, takeover_margin=0.1)
    assert behind.decision == REJECT and "stays behind the teacher" in behind.reason
    # as good, but dearer than allowed, or slower than allowed: no takeover
    dear = _decide(good, teacher, takeover_margin=0.2, policy_price=Prices(1e-5, 1e-5, "test"))
    assert dear.decision == WAIT and "costs" in dear.reason
    slow = _decide(good, teacher, takeover_margin=0.2, latency=(900.0, 300.0), max_latency_ratio=2.0)
    assert slow.decision == WAIT and "median latency 3x" in slow.reason
    # the policy's price unknown: cost does not decide, and the teacher's cost is reported
    unknown = _decide(good, teacher, takeover_margin=0.2)
    assert unknown.decision == PROMOTE and unknown.document["cost"]["policy_per_call"] is None


def test_teacher_prices_from_model_info_else_litellms_cost_map():
    models = [
        {
            "model_name": "priced",
            "litellm_params": {"model": "openai/x"},
            "model_info": {"input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6},
        },
        {"model_name": "mini", "litellm_params": {"model": "openai/gpt-4o-mini"}},
        {"model_name": "unknown", "litellm_params": {"model": "openai/no-such-model-anywhere"}},
    ]
    settings = Settings(model_list=models)
    priced = teacher_prices(settings, TeacherSettings(model="priced"))
    assert priced is not None and (priced.input, priced.output) == (2e-6, 8e-6)
    mini = teacher_prices(settings, TeacherSettings(model="mini"))
    assert mini is not None and mini.input > 0 and "litellm cost map" in mini.source
    assert teacher_prices(settings, TeacherSettings(model="unknown")) is None


def test_distillation_keeps_a_threshold_or_the_best_share_of_each_group():
    from learner.grpo.grouping import Member
    from learner.jobs.distill import choose
    from learner.jobs.selection import Candidate

    def candidate(group: str, reward: float) -> Candidate:
        member = Member(str(uuid.uuid4()), "t", reward, group, "task", last_call_at=0.0)
        return Candidate(member, [])

    groups = {"a": [1.0, 0.5, 0.0, 0.0], "b": [0.2, 0.2, 0.2], "c": [0.9, 0.9, 0.1]}
    candidates = [candidate(g, r) for g, rewards in groups.items() for r in rewards]
    settings = TeacherSettings(model="t")
    rewards = lambda chosen: sorted((c.member.group_id, c.member.reward) for c in chosen)  # noqa: E731
    share = choose(candidates, settings.distill.model_copy(update={"top_share": 0.5, "min_reward": None}))
    # a: the best two; b: all equal, nothing to prefer; c: the two tied at the top
    assert rewards(share) == [("a", 0.5), ("a", 1.0), ("c", 0.9), ("c", 0.9)]
    threshold = choose(candidates, settings.distill.model_copy(update={"top_share": None, "min_reward": 0.9}))
    assert rewards(threshold) == [("a", 1.0), ("c", 0.9), ("c", 0.9)]
    both = choose(candidates, settings.distill.model_copy(update={"top_share": 0.25, "min_reward": 0.6}))
    assert rewards(both) == [("a", 1.0), ("c", 0.9), ("c", 0.9)]


def test_the_admin_api_shows_the_teacher_and_the_distilled_versions(start_gateway, fake_upstream, db):
    gateway, client = start(start_gateway, fake_upstream)
    shown = httpx.get(f"{gateway.base_url}/admin/policies/{POLICY}/teacher")
    assert shown.status_code == 200, shown.text
    body = shown.json()
    assert body["status"] == "teacher_serves" and body["distilled_versions"] == [] and body["comparison"] is None
    assert body["teacher"]["model"] == "teacher" and body["teacher"]["prices"]["input"] == 1e-6
    assert body["teacher"]["policy_prices"] is None, "the policy states no price of its own"

    run_id = uuid.uuid4()
    db.execute(
        "INSERT INTO training_runs (id, policy, status, kind, trajectories, tokens, loss, metrics) "
        "VALUES (%s, %s, 'succeeded', 'sft', 40, 900, 0.42, %s)",
        (run_id, POLICY, '{"distill": {"teacher": "teacher", "chosen": 40, "left_out": 12}}'),
    )
    version = add_version(db, POLICY, 1, "candidate")
    db.execute("UPDATE adapter_versions SET training_run_id = %s WHERE id = %s", (run_id, version))
    body = httpx.get(f"{gateway.base_url}/admin/policies/{POLICY}/teacher").json()
    [distilled] = body["distilled_versions"]
    assert distilled["name"] == f"{POLICY}-v1" and distilled["trajectories"] == 40
    assert distilled["selection"] == {"teacher": "teacher", "chosen": 40, "left_out": 12}

    missing = httpx.get(f"{gateway.base_url}/admin/policies/nobody/teacher")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "policy_not_found"
    with pytest.raises(psycopg.errors.CheckViolation):  # the kind column accepts only the two kinds (migration 0010)
        db.execute("INSERT INTO training_runs (id, policy, kind) VALUES (%s, 'p', 'dpo')", (uuid.uuid4(),))


def test_a_policy_without_a_teacher_has_no_teacher_page(start_gateway, fake_upstream):
    gateway = start_gateway(policies=[{"name": "plain", "base_model": "b", "endpoints": [fake_upstream.api_base]}])
    answer = httpx.get(f"{gateway.base_url}/admin/policies/plain/teacher")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "no_teacher"


def test_the_dashboard_policy_page_shows_the_teacher_card(start_gateway, fake_upstream, db):
    from tests.test_ui import ADMIN_KEY, login

    models = [teacher_entry(fake_upstream.api_base, input_cost_per_token=1e-6, output_cost_per_token=4e-6)]
    gateway = start_gateway(
        auth={"mode": "keys", "admin_key": ADMIN_KEY},
        model_list=models,
        policies=[policy_config(fake_upstream.api_base)],
    )
    run_id = uuid.uuid4()
    db.execute(
        "INSERT INTO training_runs (id, policy, status, kind, trajectories, tokens, loss) "
        "VALUES (%s, %s, 'succeeded', 'sft', 72, 1500, 0.31)",
        (run_id, POLICY),
    )
    version = add_version(db, POLICY, 1, "canary", share=0.5)
    db.execute("UPDATE adapter_versions SET training_run_id = %s WHERE id = %s", (run_id, version))
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        assert login(client).status_code == 303
        page = client.get(f"/ui/policies/{POLICY}")
    assert page.status_code == 200, page.text
    assert 'data-testid="teacher"' in page.text and 'data-testid="teacher-status">canary<' in page.text
    assert f"{POLICY}-v1</a>" in page.text and "<td>72</td>" in page.text
    assert 'data-testid="teacher-comparison"' in page.text and "behind the teacher: insufficient" in page.text
