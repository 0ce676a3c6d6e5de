"""The whole loop through `apprentice up`, as a newcomer runs it.

`apprentice up` starts the embedded PostgreSQL, the local inference server with the real
SmolLM2-135M-Instruct, the gateway and the learner. An agent using only the official openai
client and the base URL asks for short descriptions, scores them itself, and posts rewards
through the webhook seconds later and out of order. Nothing else is driven by the test: the
learner trains when enough rewarded groups wait, the promotion job puts the candidate in canary
for half of the new runs, compares rewards and promotes it. The promoted adapter then serves
the policy, and its success on fresh prompts must beat the base model's. Ctrl-C stops
everything, and a second start finds the promoted version again.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from apprentice.commands.up import default_config
from examples.word_limit_agent import HELD_OUT_TOPICS, TOPICS, score, task_prompt
from tests.support.processes import REPO_ROOT, free_port, wait_http

# `apprentice up` learns on the real SmolLM2: minutes (make test-fast skips it).
pytestmark = pytest.mark.learning

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
MAX_WORDS = 8
MAX_TOKENS = 16
GROUP_SIZE = 6
EVAL_SEEDS = (1, 2, 3)
MARGIN = 0.15
BUDGET_S = 1200
GROUP_INTERVAL_S = 2.0  # one group of GROUP_SIZE runs every 2 s: about 3 runs a second
MAX_GROUPS_IN_FLIGHT = 3
EVAL_TOPICS = HELD_OUT_TOPICS[:24]


def write_config(data_dir: Path, port: int, model_port: int) -> None:
    """The config `apprentice up` would write, tuned to decide quickly on a small sample."""
    config = default_config(data_dir, port, model_port)
    policy = config["policies"][0]
    # A lineage with no verdict after 15 minutes is rejected and training restarts from the promoted version.
    policy["promotion"].update(timeout_s=900)
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "apprentice.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


class Up:
    def __init__(self, data_dir: Path, port: int, model_port: int) -> None:
        self.args = [
            sys.executable,
            "-m",
            "apprentice.cli",
            "up",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--model-port",
            str(model_port),
        ]
        self.log = data_dir.parent / "up.log"
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_") and k != "DATABASE_URL"}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 600
        while "Apprentice is up" not in self.log.read_text(errors="replace"):
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "apprentice up did not come up"
            time.sleep(0.5)
        wait_http(self.url + "/healthz")

    def interrupt(self) -> int:
        """Ctrl-C, as a person stops it."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise


async def run_group(
    client: openai.AsyncOpenAI,
    http: httpx.AsyncClient,
    topic: str,
    seed: int,
    rng: random.Random,
    deliveries: list[asyncio.Task],
) -> list[tuple[str, float]]:
    async def one(k: int) -> tuple[str, float]:
        raw = await client.chat.completions.with_raw_response.create(
            model="apprentice", messages=task_prompt(topic, MAX_WORDS), max_tokens=MAX_TOKENS, seed=seed * 100 + k
        )
        completion = raw.parse()
        choice = completion.choices[0]
        reward = score(choice.message.content or "", choice.finish_reason, MAX_WORDS)

        async def deliver() -> None:  # the agent's own system reports the outcome later
            await asyncio.sleep(rng.uniform(0.2, 4.0))
            (
                await http.post(
                    "/rewards",
                    json={
                        "trajectory_id": raw.headers["x-trajectory-id"],
                        "reward": reward,
                        "group_id": f"{topic}-{seed}",
                    },
                )
            ).raise_for_status()

        deliveries.append(asyncio.create_task(deliver()))
        return completion.model, reward

    return await asyncio.gather(*(one(k) for k in range(GROUP_SIZE)))


async def evaluate(server: openai.AsyncOpenAI, model: str) -> float:
    """Success of one model on the held-out prompts, asked at the inference server itself (the
    gateway would split the calls with a canary), at the policy's sampling temperature."""
    semaphore = asyncio.Semaphore(8)

    async def one(topic: str, seed: int) -> float:
        async with semaphore:
            completion = await server.chat.completions.create(
                model=model, messages=task_prompt(topic, MAX_WORDS), max_tokens=MAX_TOKENS, seed=seed, temperature=1.0
            )
        choice = completion.choices[0]
        return score(choice.message.content or "", choice.finish_reason, MAX_WORDS)

    results = await asyncio.gather(*(one(t, s) for t in EVAL_TOPICS for s in EVAL_SEEDS))
    return sum(results) / len(results)


def known_versions(url: str) -> set[str]:
    """The policy's adapter versions that were not rejected (the canary may move on while we ask)."""
    versions = httpx.get(f"{url}/v1/admin/policies/apprentice/versions", timeout=30).json()["data"]
    return {v["name"] for v in versions if v["status"] != "rejected"}


def version_number(name: str) -> int:
    return int(name.rsplit("-v", 1)[1])


def promoted_version(url: str) -> str | None:
    policies = httpx.get(f"{url}/v1/admin/policies", timeout=30).json()["data"]
    promoted = policies[0].get("promoted")
    return promoted["name"] if promoted else None


async def promoted_now(http: httpx.AsyncClient) -> str | None:
    promoted = (await http.get("/admin/policies")).json()["data"][0].get("promoted")
    return promoted["name"] if promoted else None


async def drive(up: Up, model_port: int, timeline: list[str]) -> tuple[float, float, str]:
    """Continuous agent traffic, paced and never waiting for the learner, until a version the
    promotion job promoted by itself beats the base model on the held-out prompts."""
    client = openai.AsyncOpenAI(base_url=up.url + "/v1", api_key="apprentice-local", max_retries=2, timeout=120)
    server = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{model_port}/v1", api_key="x", max_retries=2, timeout=120)
    http = httpx.AsyncClient(base_url=up.url + "/v1", timeout=60)
    started = time.monotonic()

    async def evaluate_base() -> float:
        rate = await evaluate(server, BASE_MODEL)
        timeline.append(f"base {rate:.2f} at {time.monotonic() - started:.0f}s")
        return rate

    # The base model is measured beside the first groups, not before them: it is what serves them,
    # and the learner needs minutes of their rewards before any version can be promoted.
    base_evaluation = asyncio.create_task(evaluate_base())
    rng = random.Random(0)
    deliveries: list[asyncio.Task] = []
    served_after: dict[str, set[str]] = {}  # promoted version -> models that served groups started after it
    stop = asyncio.Event()

    async def traffic() -> None:
        in_flight: set[asyncio.Task] = set()
        group = 0
        while not stop.is_set():
            group += 1
            promoted_then = await promoted_now(http)
            task = asyncio.create_task(run_group(client, http, rng.choice(TOPICS), group, rng, deliveries))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            if group == 1:
                assert {m for m, _ in await task} == {BASE_MODEL}, "before any adapter the base model serves"
            elif promoted_then is not None:
                task.add_done_callback(
                    lambda t, p=promoted_then: served_after.setdefault(p, set()).update(m for m, _ in t.result())
                )
            if group % 8 == 0:
                timeline.append(f"{group} groups sent at {time.monotonic() - started:.0f}s")
            await asyncio.sleep(GROUP_INTERVAL_S)  # the agent's own pace, whatever the learner does
            while len(in_flight) >= MAX_GROUPS_IN_FLIGHT:
                await asyncio.sleep(0.2)
        await asyncio.gather(*in_flight)

    async def watch() -> tuple[float, float, str]:
        evaluated: str | None = None
        while True:
            elapsed = time.monotonic() - started
            assert elapsed < BUDGET_S, f"no promoted version beat the base in {BUDGET_S}s: {timeline}"
            await asyncio.sleep(5)
            promoted = await promoted_now(http)
            if promoted is None or promoted == evaluated:
                continue
            evaluated = promoted
            rate = await evaluate(server, promoted)  # traffic goes on meanwhile
            timeline.append(f"{promoted} promoted; held-out success {rate:.2f} at {time.monotonic() - started:.0f}s")
            base_rate = await base_evaluation
            if rate >= base_rate + MARGIN:
                return base_rate, rate, promoted

    sender = asyncio.create_task(traffic())
    try:
        base_rate, rate, promoted = await watch()
    finally:
        stop.set()
        await sender
        base_evaluation.cancel()  # a no-op once it has finished
    await asyncio.gather(*deliveries)
    await http.aclose()
    await client.close()
    await server.close()
    for version, models in served_after.items():
        assert models and BASE_MODEL not in models, f"after {version} was promoted the base model served: {models}"
    return base_rate, rate, promoted


def test_apprentice_up_learns_promotes_and_restarts(smollm2_dir: Path, tmp_path: Path):
    data_dir = tmp_path / "apprentice-data"
    port, model_port = free_port(), free_port()
    write_config(data_dir, port, model_port)
    up = Up(data_dir, port, model_port)
    up.start()
    timeline: list[str] = []
    try:
        base_rate, trained_rate, promoted = asyncio.run(drive(up, model_port, timeline))
    except BaseException:
        print(
            "\n".join(timeline),
            "\n--- the end of apprentice up's log ---\n",
            up.log.read_text(errors="replace")[-12000:],
        )
        raise
    finally:
        code = up.interrupt()
    print("\n".join(timeline))
    assert trained_rate >= base_rate + MARGIN, timeline
    assert code == 0 and "stopped." in up.log.read_text()

    # The second start reuses the data: the promoted slot holds the version the test saw
    # promoted, or a later one (the loop kept learning and promoting until Ctrl-C), never the
    # base model again.
    restarted = Up(data_dir, port, model_port)
    restarted.start()
    try:
        now_promoted = promoted_version(restarted.url)
        assert now_promoted is not None and version_number(now_promoted) >= version_number(promoted), now_promoted
        # The fresh inference server got the serving adapters back before the gateway started:
        # the policy's calls are answered by adapters (an adapter it lacked would fail the call).
        client = openai.OpenAI(base_url=restarted.url + "/v1", api_key="x")
        served = {
            client.chat.completions.create(
                model="apprentice", messages=task_prompt(topic, MAX_WORDS), max_tokens=MAX_TOKENS
            ).model
            for topic in EVAL_TOPICS[:6]
        }
        assert BASE_MODEL not in served and served <= known_versions(restarted.url), served
    finally:
        assert restarted.interrupt() == 0
