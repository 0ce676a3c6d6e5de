"""deploy/ is checked with the validators that run without a container engine: the Compose
specification's model, Kubernetes' schemas (strict), and Apprentice's own config loader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from compose_spec import ComposeSpecification

from apprentice.settings import load_settings
from tests.support.processes import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
K8S_FILES = sorted((DEPLOY / "k8s").glob("*.yaml"))


def test_compose_file_is_valid_and_complete():
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    spec = ComposeSpecification.model_validate(data)
    services = spec.services or {}
    assert {"postgres", "migrate", "vllm", "gateway", "learner"} <= set(services)
    vllm = data["services"]["vllm"]
    assert "--enable-lora" in vllm["command"] and vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    for gpu_service in ("vllm", "learner"):
        devices = data["services"][gpu_service]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    # vLLM and the learner share the adapter volume at the same path.
    assert "adapters:/var/lib/apprentice/adapters" in data["services"]["learner"]["volumes"]
    assert any(v.startswith("adapters:/var/lib/apprentice/adapters") for v in vllm["volumes"])
    for service in data["services"].values():
        build = service.get("build")
        if build:
            assert (DEPLOY / build["context"] / build["dockerfile"]).resolve().exists()


@pytest.mark.parametrize("path", K8S_FILES, ids=lambda p: p.name)
def test_kubernetes_manifests_validate_strictly(path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_has_the_pieces_the_product_needs():
    documents = [d for path in K8S_FILES for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert ("Deployment", "gateway") in kinds and ("Service", "gateway") in kinds
    assert ("Deployment", "learner") in kinds and ("StatefulSet", "vllm") in kinds
    assert ("PersistentVolumeClaim", "adapters") in kinds and ("Secret", "apprentice-secrets") in kinds
    gateway = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway")
    assert gateway["spec"]["replicas"] >= 2
    learner = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "learner")
    assert learner["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_deploy_configs_load(monkeypatch, tmp_path):
    monkeypatch.setenv("APPRENTICE_ADMIN_KEY", "x")
    monkeypatch.setenv("OPENAI_API_KEY", "y")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db/apprentice")
    settings = load_settings(DEPLOY / "config" / "apprentice.yaml")
    assert settings.database_url == "postgresql://u:p@db/apprentice"
    assert settings.policies and settings.auth.mode == "keys"
    configmap = yaml.safe_load((DEPLOY / "k8s" / "02-config.yaml").read_text().split("\n---\n")[0])
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    assert load_settings(path).policies[0].endpoints == ["http://vllm-0.vllm:8000/v1", "http://vllm-1.vllm:8000/v1"]
