"""Inference replicas that find their adapters in the shared adapter store (issue 17).

Real processes: PostgreSQL, local inference servers on the tiny model with real PEFT adapters,
a gateway. The test process plays the learner and runs the promotion job. The policy's
configured endpoint (server A) is loaded over HTTP as always; server B is started after the
promotion with vLLM's resolver environment pointing at the store and is never called by the
promotion job: it serves the promoted and canary versions on their first request, loading
each once however many first requests arrive together.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from apprentice.promotion import actions, clock, loading
from apprentice.promotion.adapter_store import MANIFEST
from apprentice.settings import Settings
from apprentice.store.engine import make_async_engine
from tests.support.promotion import (
    LocalServerProcess,
    Models,
    add_candidate,
    policy_config,
    promote_now,
    run_task,
    start_gateways,
    status_of,
    tick,
)

POLICY = "replicas"
RESOLVER_ENV = {
    "VLLM_PLUGINS": "lora_filesystem_resolver",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
}


def with_service(database_url: str, policy: dict[str, Any], action: Callable[..., Any]) -> Any:
    """Run `action(engine, settings)` (a service call) on its own event loop."""

    async def once() -> Any:
        engine = make_async_engine(database_url)
        try:
            return await action(engine, Settings(database_url=database_url, policies=[policy]))
        finally:
            await engine.dispose()

    return asyncio.run(once())


def later(database_url: str, seconds: float) -> datetime:
    """A time on the database's clock `seconds` from now (past a grace period)."""

    async def once() -> datetime:
        engine = make_async_engine(database_url)
        try:
            return await clock.database_now(engine) + timedelta(seconds=seconds)
        finally:
            await engine.dispose()

    return asyncio.run(once())


def chat(server: LocalServerProcess, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "max_tokens": 3, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{server.api_base}/chat/completions", json=body, timeout=120)


def published(store: Path) -> set[str]:
    return {p.name for p in store.iterdir() if (p / MANIFEST).is_file()} if store.exists() else set()


def leftovers(store: Path) -> list[Path]:
    return [*store.glob(".apprentice-tmp-*"), *store.glob(".apprentice-trash-*")]


def resolved_loads(server: LocalServerProcess, name: str) -> int:
    return server.log_text().count(f"Resolved and loaded LoRA adapter '{name}'")


@pytest.fixture
def replica(tiny: Models, tmp_path: Path) -> Iterator[Callable[..., LocalServerProcess]]:
    """start(*args, env=...) -> a local server on the tiny model, logging at info (its loads)."""
    started: list[LocalServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> LocalServerProcess:
        workdir = tmp_path / f"replica-{len(started)}"
        workdir.mkdir()
        server = LocalServerProcess(workdir, tiny.base)
        server.args += ["--log-level", "info", *args]
        server.env.update(env or {})
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_a_replica_started_after_a_promotion_serves_from_the_store(
    local_server: LocalServerProcess,
    tiny: Models,
    replica,
    start_gateway,
    db,
    database_url: str,
    tmp_path: Path,
) -> None:
    store = tmp_path / "adapter-store"
    # vLLM compares an adapter's base_model_name_or_path with its --model: the tiny model's directory.
    policy = policy_config(POLICY, local_server, adapter_store={"path": str(store), "base_model": str(tiny.base)})
    grace = policy["promotion"]["unload_grace_s"]

    # A promotion and a canary, through the promotion code as an admin and the tick do them.
    v1 = add_candidate(db, POLICY, 1, tiny.adapters[1])
    assert promote_now(database_url, policy, f"{POLICY}-v1").transition.changed
    v2 = add_candidate(db, POLICY, 2, tiny.adapters[2])
    tick(database_url, policy)
    assert status_of(db, v1) == "promoted" and status_of(db, v2) == "canary"
    assert published(store) == {f"{POLICY}-v1", f"{POLICY}-v2"}
    config = json.loads((store / f"{POLICY}-v1" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny.base) and config["peft_type"] == "LORA"
    assert (store / f"{POLICY}-v1" / "adapter_model.safetensors").read_bytes() == (
        tiny.adapters[1] / "adapter_model.safetensors"
    ).read_bytes()

    # A replica started now, with vLLM's resolver environment; the promotion job never calls it.
    b = replica(env={**RESOLVER_ENV, "VLLM_LORA_RESOLVER_CACHE_DIR": str(store)})
    assert set(b.models()) == {"tiny"}

    # Eight first requests for the promoted version at once: all served, the adapter loaded once.
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: answers.append(chat(b, f"{POLICY}-v1"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a.status_code for a in answers] == [200] * 8, [a.text[:300] for a in answers]
    assert {a.json()["model"] for a in answers} == {f"{POLICY}-v1"}
    assert resolved_loads(b, f"{POLICY}-v1") == 1, b.log_text()[-3000:]
    assert b.models()[f"{POLICY}-v1"] == str((store / f"{POLICY}-v1").resolve())
    # The canary, streamed, on its first request too; the base still answers; unknown names are 404.
    streamed = chat(b, f"{POLICY}-v2", stream=True)
    assert streamed.status_code == 200 and f'"model":"{POLICY}-v2"' in streamed.text.replace(" ", "")
    assert chat(b, "tiny").status_code == 200
    missing = chat(b, f"{POLICY}-v99")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == f"The model `{POLICY}-v99` does not exist."

    # A gateway whose only endpoint is the replica: the policy's calls are answered from the store.
    gateway = start_gateways(start_gateway, tmp_path, {**policy, "endpoints": [b.api_base]}, 1)[0]
    served = {model for _ in range(4) for model in run_task([gateway], POLICY, f"task {uuid.uuid4().hex[:8]}").served}
    assert served <= {f"{POLICY}-v1", f"{POLICY}-v2"} and served

    # The canary is rejected: its copy stays for the grace (calls in flight), then goes.
    with_service(database_url, policy, lambda e, s: actions.reject(e, s, f"{POLICY}-v2", actor="admin"))
    tick(database_url, policy)
    assert f"{POLICY}-v2" in published(store)
    report = tick(database_url, policy, now=later(database_url, grace + 1))
    assert {(a["version"], a["action"]) for a in report.actions} >= {(f"{POLICY}-v2", "unpublished")}
    assert published(store) == {f"{POLICY}-v1"}
    assert f"{POLICY}-v2" not in local_server.models()  # unloaded from the endpoint after the same grace

    # Corrupt files are never published: refused by the gates, and by the store when forced.
    cut = tmp_path / "cut"
    shutil.copytree(tiny.adapters[3], cut)
    weights = cut / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    v3 = add_candidate(db, POLICY, 3, cut)
    tick(database_url, policy)
    assert status_of(db, v3) == "rejected"
    bad_config = tmp_path / "bad-config"
    shutil.copytree(tiny.adapters[3], bad_config)
    (bad_config / "adapter_config.json").write_text('{"r": 8, "peft_type": ')
    v4 = add_candidate(db, POLICY, 4, bad_config)
    with pytest.raises(loading.LoadError) as refused:
        with_service(
            database_url, policy, lambda e, s: actions.promote_now(e, s, f"{POLICY}-v4", actor="admin", force=True)
        )
    assert "adapter_config.json is not readable JSON" in str(refused.value) and refused.value.permanent
    assert status_of(db, v4) == "candidate"
    assert published(store) == {f"{POLICY}-v1"} and leftovers(store) == []

    # A new promotion retires v1, whose copy goes after the grace; a rollback publishes it again.
    v5 = add_candidate(db, POLICY, 5, tiny.adapters[3])
    promote_now(database_url, policy, f"{POLICY}-v5")
    assert status_of(db, v1) == "retired" and published(store) == {f"{POLICY}-v1", f"{POLICY}-v5"}
    tick(database_url, policy, now=later(database_url, grace + 1))
    assert published(store) == {f"{POLICY}-v5"}
    assert chat(b, f"{POLICY}-v5").status_code == 200 and resolved_loads(b, f"{POLICY}-v5") == 1
    with_service(database_url, policy, lambda e, s: actions.rollback(e, s, POLICY, f"{POLICY}-v1", actor="admin"))
    assert status_of(db, v1) == "promoted" and status_of(db, v5) == "retired"
    assert published(store) == {f"{POLICY}-v1", f"{POLICY}-v5"}
    manifest = json.loads((store / f"{POLICY}-v1" / MANIFEST).read_text())
    assert manifest["version_id"] == str(v1)

    # A copy deleted from the volume by hand is published again by the next tick.
    shutil.rmtree(store / f"{POLICY}-v1")
    report = tick(database_url, policy)
    assert (f"{POLICY}-v1", "published") in {(a["version"], a["action"]) for a in report.actions}
    assert f"{POLICY}-v1" in published(store)


def test_the_resolver_refuses_as_vllm_does(tiny: Models, replica, tmp_path: Path) -> None:
    """`--lora-resolver-dir` (no environment): what is found but does not load is a 400 naming
    the adapter; what does not match this server's base model, or lies outside the directory,
    is the usual 404; the server keeps serving throughout."""
    from tests.learner.conftest import make_adapter

    store = tmp_path / "resolver-dir"
    store.mkdir()

    def place(name: str, source: Path, base: str) -> None:
        shutil.copytree(source, store / name)
        config_file = store / name / "adapter_config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": base}))

    place("good", tiny.adapters[1], str(tiny.base))
    place("foreign", tiny.adapters[1], "HuggingFaceTB/SmolLM2-135M-Instruct")  # trained for another base
    place("too-big", make_adapter(tiny.base, tmp_path / "rank16", rank=16), str(tiny.base))  # over --max-lora-rank 8
    place("outside", tiny.adapters[2], str(tiny.base))
    shutil.move(store / "outside", tmp_path / "outside")
    c = replica("--lora-resolver-dir", str(store))

    for name in ("foreign", "../outside", str(tmp_path / "outside"), "nothing"):
        answer = chat(c, name)
        assert answer.status_code == 404, (name, answer.text)
        assert answer.json()["error"] == {
            "message": f"The model `{name}` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    too_big = chat(c, "too-big")
    assert too_big.status_code == 400
    assert too_big.json()["error"]["message"] == "LoRA adapter 'too-big' was found but could not be loaded."
    assert too_big.json()["error"]["type"] == "BadRequestError"
    assert set(c.models()) == {"tiny"}
    good = chat(c, "good")
    assert good.status_code == 200 and good.json()["model"] == "good"
    assert set(c.models()) == {"tiny", "good"}
    # Unloaded by name, it is resolved again on the next request (as vLLM does).
    assert httpx.post(f"{c.api_base}/unload_lora_adapter", json={"lora_name": "good"}).status_code == 200
    assert chat(c, "good").status_code == 200 and resolved_loads(c, "good") == 2
