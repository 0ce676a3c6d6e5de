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
    # vLLM and the learner share the adapter volume at the same path, and the adapter store that
    # vLLM's filesystem resolver reads at the path the promotion job publishes to.
    assert "adapters:/var/lib/apprentice/adapters" in data["services"]["learner"]["volumes"]
    assert any(v.startswith("adapters:/var/lib/apprentice/adapters") for v in vllm["volumes"])
    assert "adapter-store:/var/lib/apprentice/adapter-store" in data["services"]["learner"]["volumes"]
    assert "adapter-store:/var/lib/apprentice/adapter-store:ro" in vllm["volumes"]
    assert vllm["environment"]["VLLM_PLUGINS"] == "lora_filesystem_resolver"
    assert vllm["environment"]["VLLM_LORA_RESOLVER_CACHE_DIR"] == "/var/lib/apprentice/adapter-store"
    for service in data["services"].values():
        build = service.get("build")
        if build:
            assert (DEPLOY / build["context"] / build["dockerfile"]).resolve().exists()


def assert_valid_kubernetes(path: Path) -> None:
    """Kubernetes' own schemas accept every document of the file (strict: no unknown fields)."""
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", K8S_FILES, ids=lambda p: p.name)
def test_kubernetes_manifests_validate_strictly(path: Path):
    assert_valid_kubernetes(path)


def test_kubernetes_has_the_pieces_the_product_needs():
    documents = [d for path in K8S_FILES for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert ("Deployment", "gateway") in kinds and ("Service", "gateway") in kinds
    assert ("Deployment", "learner") in kinds and ("StatefulSet", "vllm") in kinds
    assert ("PersistentVolumeClaim", "adapters") in kinds and ("Secret", "apprentice-secrets") in kinds
    assert ("PersistentVolumeClaim", "adapter-store") in kinds
    gateway = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "gateway")
    assert gateway["spec"]["replicas"] >= 2
    # vLLM: a headless Service (its DNS name is the policy's endpoint) and the filesystem resolver.
    service = next(d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "vllm")
    assert service["spec"]["clusterIP"] == "None"
    vllm = next(d for d in documents if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "vllm")
    env = {e["name"]: e["value"] for e in vllm["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    assert env["VLLM_PLUGINS"] == "lora_filesystem_resolver"
    assert env["VLLM_LORA_RESOLVER_CACHE_DIR"] == "/var/lib/apprentice/adapter-store"
    # The learner service starts a Job per training run: it may create, read and delete Jobs, no more.
    learner = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "learner")
    assert learner["spec"]["template"]["spec"]["serviceAccountName"] == "apprentice-learner"
    assert "nvidia.com/gpu" not in learner["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    role = next(d for d in documents if d["kind"] == "Role" and d["metadata"]["name"] == "apprentice-learner-jobs")
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "delete"]}]
    # vLLM's LoRA endpoints are unauthenticated: only the gateways and the learner may reach them.
    policy = next(d for d in documents if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app": "vllm"}}
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchExpressions"][0]["values"] == ["gateway", "learner"]
    binding = next(d for d in documents if d["kind"] == "RoleBinding")
    assert (
        binding["subjects"][0]["name"] == "apprentice-learner"
        and binding["roleRef"]["name"] == role["metadata"]["name"]
    )


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
    policy = load_settings(path).policies[0]
    assert policy.endpoints == ["dns+http://vllm.apprentice.svc.cluster.local:8000/v1"]
    assert policy.promotion.adapter_store is not None
    assert str(policy.promotion.adapter_store.path) == "/var/lib/apprentice/adapter-store"
    # The Job a training run gets: the learner image, a GPU, the config and the adapters volume.
    assert policy.learning.launcher == "kubernetes" and policy.learning.kubernetes is not None
    job = policy.learning.kubernetes
    assert job.namespace == "apprentice" and job.resources["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "adapters", "mountPath": "/var/lib/apprentice/adapters"} in job.volume_mounts
    assert load_settings(path).history.retention_days == 3


def test_the_training_job_of_the_deploy_config_validates_strictly(monkeypatch, tmp_path):
    """The batch/v1 Job the learner creates per training run, from 02-config.yaml's settings, is
    accepted by Kubernetes' schema (the launcher builds it; nothing else checks it before a cluster)."""
    from learner.jobs.kubernetes import job_manifest

    monkeypatch.setenv("APPRENTICE_ADMIN_KEY", "x")
    monkeypatch.setenv("OPENAI_API_KEY", "y")
    configmap = yaml.safe_load((DEPLOY / "k8s" / "02-config.yaml").read_text().split("\n---\n")[0])
    config = tmp_path / "config.yaml"
    config.write_text(configmap["data"]["config.yaml"])
    policy = load_settings(config).policies[0]
    manifest = job_manifest(policy, "scheduled", "0190aa6e-2b3c-7d4e-8f90-123456789abc")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert_valid_kubernetes(path)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "learner.jobs.one_run" in " ".join(container["command"])
