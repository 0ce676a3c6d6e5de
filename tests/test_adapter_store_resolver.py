"""The local server's copy of vLLM's filesystem LoRA resolver, rule by rule (no model, no torch).

The rules are vLLM's (`vllm/plugins/lora_resolvers/filesystem_resolver.py`, `vllm/plugins/
__init__.py`, `vllm/envs.py`); the end-to-end behaviour with a real server is in
tests/test_adapter_store_replicas.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from learner.serving.resolver import INVALID_DIR, FilesystemResolver, resolver_from_environment

BASE = "/models/tiny"


def adapter(directory: Path, **config: object) -> Path:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "base_model_name_or_path": BASE, "r": 8, **config})
    )
    return directory


def test_finds_an_adapter_for_the_servers_base_model(tmp_path: Path) -> None:
    found = adapter(tmp_path / "agent-v1")
    assert FilesystemResolver(tmp_path).resolve(BASE, "agent-v1") == os.path.realpath(found)


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("agent-v1", {"base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}),  # another base
        ("agent-v1", {"peft_type": "lora"}),  # vLLM compares with "LORA" exactly
        ("agent-v1", {"peft_type": None}),
        ("nothing-here", {}),
    ],
)
def test_refuses_what_vllm_refuses(tmp_path: Path, name: str, config: dict) -> None:
    adapter(tmp_path / "agent-v1", **config)
    assert FilesystemResolver(tmp_path).resolve(BASE, name) is None


def test_never_leaves_its_directory(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    outside = adapter(tmp_path / "outside")
    (store / "link").symlink_to(outside)  # a symlink out of the directory
    resolver = FilesystemResolver(store)
    assert resolver.resolve(BASE, "../outside") is None
    assert resolver.resolve(BASE, str(outside)) is None  # absolute
    assert resolver.resolve(BASE, "link") is None
    inside = adapter(store / "real")
    (store / "alias").symlink_to(inside)  # a symlink that stays inside is followed, as vLLM does
    assert resolver.resolve(BASE, "alias") == os.path.realpath(inside)


def test_a_directory_without_a_config_or_with_a_broken_one_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{")
    resolver = FilesystemResolver(tmp_path)
    assert resolver.resolve(BASE, "empty") is None
    assert resolver.resolve(BASE, "broken") is None


def test_the_environment_turns_it_on_as_vllm_reads_it(tmp_path: Path) -> None:
    on = {"VLLM_LORA_RESOLVER_CACHE_DIR": str(tmp_path), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert resolver_from_environment(on).cache_dir == tmp_path  # VLLM_PLUGINS unset: every plugin loads
    named = {**on, "VLLM_PLUGINS": "some_other,lora_filesystem_resolver"}
    assert resolver_from_environment(named).cache_dir == tmp_path
    assert resolver_from_environment({**on, "VLLM_PLUGINS": "lora_hf_hub_resolver"}) is None
    assert resolver_from_environment({**on, "VLLM_PLUGINS": ""}) is None
    assert resolver_from_environment({**on, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}) is not None
    assert resolver_from_environment({**on, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "False"}) is None
    assert resolver_from_environment({"VLLM_LORA_RESOLVER_CACHE_DIR": str(tmp_path)}) is None
    assert resolver_from_environment({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) is None


def test_a_cache_dir_that_is_not_a_directory_stops_the_server_at_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for value in (str(tmp_path / "missing"), str(tmp_path / "file")):
        with pytest.raises(ValueError) as refused:
            resolver_from_environment(
                {"VLLM_LORA_RESOLVER_CACHE_DIR": value, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
            )
        assert str(refused.value) == INVALID_DIR
        assert "VLLM_LORA_RESOLVER_CACHE_DIR must be set to a valid directory" in str(refused.value)
