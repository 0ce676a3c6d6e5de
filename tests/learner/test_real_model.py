"""The real default model (SmolLM2-135M-Instruct) and the command line, end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
from click.testing import CliRunner

from apprentice.processes import free_port
from tests.learner.conftest import run_server


def test_fetch_model_is_idempotent(smollm2_dir):
    from learner.models import COMPLETE_MARKER
    from learner.serving.cli import fetch_model_command

    started = time.monotonic()
    result = CliRunner().invoke(fetch_model_command, [])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == str(smollm2_dir)
    assert time.monotonic() - started < 5  # reused, not converted again
    assert (smollm2_dir / COMPLETE_MARKER).exists() and (smollm2_dir / "model.safetensors").exists()
    assert not list(smollm2_dir.parent.glob("apprentice-fetch-*"))


def test_smollm2_answers_and_refuses_a_foreign_adapter(smollm2_dir, tiny_model_dir, adapter_factory):
    with run_server(smollm2_dir, served_model_name="HuggingFaceTB/SmolLM2-135M-Instruct") as server:
        client = server.client()
        ask = dict(
            model="HuggingFaceTB/SmolLM2-135M-Instruct",
            temperature=0,
            max_tokens=10,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in client.chat.completions.create(**ask).choices[0].message.content
        # an adapter trained on the tiny model: right architecture, wrong base
        answer = httpx.post(
            f"{server.base_url}/v1/load_lora_adapter",
            timeout=60,
            json={"lora_name": "tiny-lora", "lora_path": str(adapter_factory(tiny_model_dir))},
        )
        assert answer.status_code == 400 and "shape mismatch" in answer.json()["error"]["message"]
        assert "Paris" in client.chat.completions.create(**ask).choices[0].message.content


def test_serve_model_command(tiny_model_dir):
    """`apprentice serve-model` in its own process, with an API key as vLLM's --api-key."""
    port = free_port()
    env = {**os.environ, "VLLM_API_KEY": "sekret"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apprentice.cli",
            "serve-model",
            "--model",
            str(tiny_model_dir),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read().decode()
            time.sleep(0.2)
        assert httpx.get(f"{url}/v1/models").status_code == 401
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sekret"}).json()
        assert models["data"][0]["id"] == str(tiny_model_dir)
    finally:
        process.terminate()
        process.wait(timeout=30)
