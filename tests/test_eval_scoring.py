"""How one evaluation answer is scored (apprentice/evalsets/scoring.py): expected answers by
hand, and the judge and a reward function over real HTTP (a local judge that answers as a judge
model would, a reward function that is slow, wrong, or checks the signature)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest
from aiohttp import web
from pydantic import ValidationError

from apprentice.evalsets.scoring import (
    ExpectedAnswer,
    JudgeScoring,
    RewardFunction,
    Scorer,
    ScoringFailed,
    parse_scoring,
)
from apprentice.settings import PolicySettings, Settings, WebhookSecret
from gateway.rewards.signatures import SIGNATURE_HEADER, SignatureVerifier

SECRET = "whsec-scoring"
CONTEXT = {"set": "s", "item_id": "i-1", "version": "agent-v1", "run_id": "r-1"}
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> int:
    """`handler` on every path of a local HTTP server (a daemon thread); its port."""
    started, port = threading.Event(), []

    def run() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        port.append(runner.addresses[0][1])
        started.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True).start()
    started.wait(10)
    return port[0]


@pytest.mark.parametrize(
    ("scoring", "answer", "score"),
    [
        ({"method": "expected", "expected": "Paris"}, "  paris \n", 1.0),
        ({"method": "expected", "expected": "Paris", "case_sensitive": True}, "paris", 0.0),
        ({"method": "expected", "expected": "Paris"}, "It is Paris.", 0.0),
        ({"method": "expected", "expected": "Paris", "match": "contains"}, "It is PARIS.", 1.0),
        ({"method": "expected", "expected": r"\bparis\b", "match": "regex"}, "It is Paris.", 1.0),
        ({"method": "expected", "expected": r"^Paris$", "match": "regex"}, "It is Paris.", 0.0),
    ],
)
async def test_expected_answers(scoring, answer, score):
    async with httpx.AsyncClient() as client:
        scorer = Scorer(Settings(), PolicySettings(name="p", base_model="b"), client)
        result = await scorer.score(parse_scoring(scoring), MESSAGES, answer, context=CONTEXT)
    assert result.value == score


@pytest.mark.parametrize(
    "document",
    [
        {"method": "oracle"},
        {"method": "expected", "expected": "(", "match": "regex"},
        {"method": "expected", "expected": ""},
        {"method": "expected", "expected": "x", "match": "fuzzy"},
        {"method": "reward_function"},
    ],
)
def test_bad_scorings_are_refused(document):
    with pytest.raises(ValidationError):
        parse_scoring(document)


@pytest.fixture
def judge_port() -> Iterator[tuple[int, list[dict]]]:
    seen: list[dict] = []

    async def judge(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"body": body, "headers": dict(request.headers)})
        prompt = body["messages"][-1]["content"]
        score = 0.9 if "Paris" in prompt.split("Assistant's answer:")[1].split("A known good")[0] else 0.1
        content = "```json\n" + json.dumps({"explanation": "checked", "score": score}) + "\n```"
        if "broken" in prompt:
            content = "I think it is fine."
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": content}}]})

    yield serve(judge), seen


async def test_the_judge_scores_one_answer_through_its_gateway_address(judge_port):
    port, seen = judge_port
    settings = Settings(
        model_list=[{"model_name": "judge-m", "litellm_params": {"model": "openai/judge-m"}}],
        policies=[
            {
                "name": "p",
                "base_model": "b",
                "endpoints": ["http://127.0.0.1:1/v1"],
                "judge": {"model": "judge-m", "base_url": f"http://127.0.0.1:{port}/v1", "api_key": "sk-judge"},
            }
        ],
    )
    scoring = parse_scoring({"method": "judge", "reference": "Paris", "rubric": "Is it the capital?"})
    async with httpx.AsyncClient() as client:
        scorer = Scorer(settings, settings.policies[0], client)
        good = await scorer.score(scoring, MESSAGES, "Paris.", context=CONTEXT)
        bad = await scorer.score(scoring, MESSAGES, "Lyon.", context=CONTEXT)
        with pytest.raises(ScoringFailed, match="no JSON object"):
            await scorer.score(scoring, MESSAGES, "broken", context=CONTEXT)
        unjudged = Scorer(settings, PolicySettings(name="q", base_model="b"), client)
        with pytest.raises(ScoringFailed, match="no judge configured"):
            await unjudged.score(scoring, MESSAGES, "Paris.", context=CONTEXT)
    assert (good.value, bad.value) == (0.9, 0.1) and good.detail == "checked"
    call = seen[0]
    assert call["body"]["model"] == "judge-m" and call["headers"]["Authorization"] == "Bearer sk-judge"
    assert call["headers"]["X-Trajectory-Id"] == "apprentice-eval:r-1:i-1"
    assert call["body"]["messages"][0]["content"].startswith("Is it the capital?")
    assert "A known good answer, for reference:\nParis" in call["body"]["messages"][1]["content"]


async def test_a_reward_function_is_signed_timed_out_and_checked():
    verifier = SignatureVerifier([WebhookSecret(name="eval", secret=SECRET, tenant="ops")], 300)
    received: list[dict] = []

    async def grader(request: web.Request) -> web.Response:
        raw = await request.read()
        verifier.verify(request.headers[SIGNATURE_HEADER], raw)  # raises (500) when not signed right
        body = json.loads(raw)
        received.append(body)
        if request.path == "/slow":
            await asyncio.sleep(2)
        if request.path == "/nan":
            return web.Response(text='{"score": "high"}', content_type="application/json")
        return web.json_response({"score": 7.5 if body["answer"] == "Paris" else -1})

    port = serve(grader)
    functions = {
        name: {"url": f"http://127.0.0.1:{port}/{path}", "secret": "eval", "timeout_s": 0.5}
        for name, path in (("grader", "grade"), ("slow", "slow"), ("wrong", "nan"))
    }
    functions["unsigned"] = {"url": f"http://127.0.0.1:{port}/grade", "secret": "nope"}
    settings = Settings(
        rewards={"webhook_secrets": [{"name": "eval", "secret": SECRET, "tenant": "ops"}]},
        policies=[
            {
                "name": "p",
                "base_model": "b",
                "endpoints": ["http://127.0.0.1:1/v1"],
                "evaluation": {"reward_functions": functions},
            }
        ],
    )
    async with httpx.AsyncClient() as client:
        scorer = Scorer(settings, settings.policies[0], client)

        def function(name: str) -> RewardFunction | ExpectedAnswer | JudgeScoring:
            return parse_scoring({"method": "reward_function", "name": name})

        assert (await scorer.score(function("grader"), MESSAGES, "Paris", context=CONTEXT)).value == 7.5
        with pytest.raises(ScoringFailed, match="did not answer within 0.5s"):
            await scorer.score(function("slow"), MESSAGES, "Paris", context=CONTEXT)
        with pytest.raises(ScoringFailed, match="not a number"):
            await scorer.score(function("wrong"), MESSAGES, "Paris", context=CONTEXT)
        with pytest.raises(ScoringFailed, match="no webhook secret named 'nope'"):
            await scorer.score(function("unsigned"), MESSAGES, "Paris", context=CONTEXT)
        with pytest.raises(ScoringFailed, match="no reward function 'other'"):
            await scorer.score(function("other"), MESSAGES, "Paris", context=CONTEXT)
    assert received[0] == {
        "policy": "p",
        "set": "s",
        "item_id": "i-1",
        "version": "agent-v1",
        "messages": MESSAGES,
        "answer": "Paris",
    }
