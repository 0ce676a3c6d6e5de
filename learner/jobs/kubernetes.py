"""The `kubernetes` launcher: one batch/v1 Job per training run, through the Kubernetes API.

Per run: create a Job (the pod runs `python -m torch.distributed.run --nproc-per-node
<processes> -m learner.jobs.one_run --policy P --run-id R ...`, see `job_manifest`), poll it
until its Complete or Failed condition, read the outcome from the run's `training_runs` row,
then delete the Job (and its pods). `ttlSecondsAfterFinished` makes Kubernetes collect the Jobs
of a learner that died while waiting. `backoffLimit` is 0: a failed run is not retried by
Kubernetes (its row says why; the scheduler starts the next run on its own terms, with a new id).

The scheduler runs one run at a time, so a Job that never ends must not hold it:
- a Job with no ready, succeeded or failed pod `start_timeout_s` after its creation (no node has
  a free GPU, the image cannot be pulled) is deleted and its run recorded as failed; the Job's
  status alone tells this (`ready` counts pods whose containers run; a pending pod is `active`
  but not ready), so the learner needs no access to pods;
- `active_deadline_s` (a day by default) makes Kubernetes fail a Job that runs too long;
- reads and deletes are retried with backoff for `api_retry_s` through 5xx, 429, a reset
  connection and a 401 (the token file is read again: bound tokens rotate); past that the
  launcher deletes the Job and records the run as failed rather than leave a Job no one waits
  for;
- a create whose answer is lost (a timeout or a reset after the server stored the Job) is
  settled by reading the Job by its name (unique per run) before calling the run failed.

The API is spoken with httpx (already a core dependency): four calls (create, read, delete a
Job; nothing else) do not justify the `kubernetes` client's generated models and its urllib3
stack. Credentials: inside a pod, the service account's token (re-read for every request: bound
tokens rotate) and CA; outside, a kubeconfig's cluster and user (a token, a token file, or a
client certificate). Kubeconfig exec and auth-provider plugins are not supported: give such a
user a service-account token.

The database URL never goes into the Job: the pod gets it from the operator's `env` /
`env_from` (a Secret), like the learner's own deployment.
"""

from __future__ import annotations

import base64
import copy
import logging
import os
import re
import ssl
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import yaml

from apprentice.settings import KubernetesJobSettings, PolicySettings
from learner.jobs.one_run import one_run_arguments
from learner.jobs.training_runs import RunOutcome, launch_outcome, record_failed_launch

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POLICY_LABEL = "apprentice.dev/policy"
RUN_LABEL = "apprentice.dev/run-id"
POLICY_ANNOTATION = "apprentice.dev/policy-name"


class KubernetesError(RuntimeError):
    """The API refused a request or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status; None when no answer came (connection, timeout)

    @property
    def transient(self) -> bool:
        """An error that trying again may cure: no answer, throttling or a server-side failure."""
        return self.status is None or self.status == 429 or self.status >= 500


class JobNotStarted(RuntimeError):
    """The Job's pod did not start within `start_timeout_s`."""


class Backoff:
    """Exponential delays within a time budget: bounded retries."""

    def __init__(self, budget_s: float, first_s: float = 0.5, most_s: float = 30.0) -> None:
        self.deadline = time.monotonic() + budget_s
        self.delay, self.most_s = first_s, most_s

    def wait(self) -> bool:
        """Sleep before the next try; False (without sleeping) when the budget has no room for one."""
        if time.monotonic() + self.delay > self.deadline:
            return False
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.most_s)
        return True


@dataclass
class Credentials:
    """How to reach and authenticate to one API server."""

    server: str
    token: str | None = None
    token_file: Path | None = None  # re-read per request (service-account tokens rotate)
    verify: ssl.SSLContext | bool = True
    cert: tuple[str, str] | None = None  # client certificate and key files
    _files: list[Any] = field(default_factory=list, repr=False)  # temporary files kept alive

    def headers(self) -> dict[str, str]:
        token = self.token_file.read_text().strip() if self.token_file else self.token
        return {"Authorization": f"Bearer {token}"} if token else {}


def in_cluster() -> Credentials | None:
    """The pod's own service account, when this process runs in a Kubernetes pod."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (SERVICE_ACCOUNT / "token").is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    return Credentials(
        f"https://{host}:{port}",
        token_file=SERVICE_ACCOUNT / "token",
        verify=ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt")),
    )


def from_kubeconfig(path: Path, context_name: str | None = None) -> Credentials:
    """The cluster and user of a kubeconfig context (its current-context by default)."""
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise KubernetesError(f"kubeconfig {path}: {exc}") from exc
    name = context_name or config.get("current-context")
    context = _named(config, "contexts", name, path)["context"]
    cluster = _named(config, "clusters", context["cluster"], path)["cluster"]
    user = _named(config, "users", context["user"], path).get("user") or {}
    if "exec" in user or "auth-provider" in user:
        raise KubernetesError(
            f"kubeconfig {path}: user {context['user']!r} authenticates through a plugin, which is not "
            "supported; give the learner a service-account token"
        )
    credentials = Credentials(str(cluster["server"]).rstrip("/"), token=user.get("token"))
    if user.get("tokenFile"):
        credentials.token_file = Path(user["tokenFile"])
    if cluster.get("insecure-skip-tls-verify"):
        credentials.verify = False
    else:
        ca = _file(credentials, cluster, "certificate-authority", path)
        if ca:
            credentials.verify = ssl.create_default_context(cafile=ca)
    cert, key = _file(credentials, user, "client-certificate", path), _file(credentials, user, "client-key", path)
    if cert and key:
        credentials.cert = (cert, key)
    return credentials


def _named(config: dict[str, Any], section: str, name: str | None, path: Path) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return dict(entry)
    raise KubernetesError(f"kubeconfig {path}: no {section[:-1]} named {name!r}")


def _file(credentials: Credentials, entry: dict[str, Any], key: str, path: Path) -> str | None:
    """A kubeconfig file reference (relative to the kubeconfig) or its inline `-data` (base64)."""
    if entry.get(key):
        return str((path.parent / entry[key]).resolve())
    if entry.get(f"{key}-data"):
        handle = tempfile.NamedTemporaryFile(prefix="apprentice-kube-", suffix=".pem")  # noqa: SIM115 (kept open)
        handle.write(base64.b64decode(entry[f"{key}-data"]))
        handle.flush()
        credentials._files.append(handle)
        return handle.name
    return None


def credentials_for(settings: KubernetesJobSettings) -> Credentials:
    """`api_url` with the in-cluster token when given; else in-cluster; else the kubeconfig."""
    inside = in_cluster()
    kubeconfig = settings.kubeconfig or Path(os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config")
    if settings.kubeconfig is None and inside is not None:
        if settings.api_url:
            inside.server = settings.api_url.rstrip("/")
        return inside
    credentials = from_kubeconfig(kubeconfig, settings.context)
    if settings.api_url:
        credentials.server = settings.api_url.rstrip("/")
    return credentials


class JobsAPI:
    """batch/v1 Jobs of one namespace. Reads and deletes (idempotent) are retried for `retry_s`;
    a create is tried once: only the caller can tell whether a lost answer created the Job."""

    def __init__(self, credentials: Credentials, namespace: str, timeout_s: float = 30.0, retry_s: float = 0.0) -> None:
        self.credentials, self.retry_s = credentials, retry_s
        self.base = f"{credentials.server}/apis/batch/v1/namespaces/{namespace}/jobs"
        self.client = httpx.Client(verify=credentials.verify, cert=credentials.cert, timeout=timeout_s)

    def _request(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self.client.request(method, url, headers=self.credentials.headers(), **kwargs)
        except httpx.HTTPError as exc:
            raise KubernetesError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise KubernetesError(f"{method} {url}: {response.status_code} {_message(response)}", response.status_code)
        body: dict[str, Any] = response.json()
        return body

    def retryable(self, error: KubernetesError) -> bool:
        """Transient errors, and a 401 when the token comes from a file (it may have rotated)."""
        return error.transient or (error.status == 401 and self.credentials.token_file is not None)

    def _retried(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        backoff = Backoff(self.retry_s)
        while True:
            try:
                return self._request(method, url, **kwargs)
            except KubernetesError as exc:
                if not self.retryable(exc) or not backoff.wait():
                    raise
                log.warning("%s (trying again)", exc)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", self.base, json=manifest)

    def read(self, name: str) -> dict[str, Any]:
        return self._retried("GET", f"{self.base}/{name}")

    def find(self, name: str) -> dict[str, Any] | None:
        """The Job, or None when there is none of that name."""
        try:
            return self.read(name)
        except KubernetesError as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, name: str) -> None:
        """Delete the Job and, in the background, its pods; a Job already gone is no error."""
        try:
            self._retried("DELETE", f"{self.base}/{name}", json={"propagationPolicy": "Background"})
        except KubernetesError as exc:
            if exc.status != 404:
                raise

    def close(self) -> None:
        self.client.close()


def _message(response: httpx.Response) -> str:
    """The API's Status message when there is one (e.g. `jobs.batch is forbidden: ...`)."""
    try:
        return str(response.json().get("message") or response.text[:300])
    except ValueError:
        return response.text[:300]


def label_value(text: str) -> str:
    """A valid label value (63 characters of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def job_name(policy: str, run_id: str) -> str:
    """`apprentice-learn-<policy>-<run id prefix>`: a DNS-1123 label, unique per run."""
    slug = re.sub(r"[^a-z0-9-]+", "-", policy.lower()).strip("-")[:36].strip("-") or "policy"
    return f"apprentice-learn-{slug}-{run_id[:8]}"


def job_manifest(policy: PolicySettings, trigger: str, run_id: str) -> dict[str, Any]:
    """The batch/v1 Job of one run, from `policy.learning.kubernetes`."""
    learning = policy.learning
    kube = learning.kubernetes
    if kube is None:
        raise ValueError(f"policy {policy.name!r}: the kubernetes launcher needs learning.kubernetes")
    labels = {
        **kube.labels,
        "app.kubernetes.io/name": "apprentice",
        "app.kubernetes.io/component": "learner-run",
        POLICY_LABEL: label_value(policy.name),
        RUN_LABEL: run_id,
    }
    resources = copy.deepcopy(kube.resources)
    if kube.gpus:
        resources.setdefault("limits", {}).setdefault("nvidia.com/gpu", learning.processes)
    mounts = list(kube.volume_mounts)
    volumes = list(kube.volumes)
    if kube.shm_size:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": kube.shm_size}})
    container: dict[str, Any] = {
        "name": "learner",
        "image": kube.image,
        "command": ["python", *one_run_arguments(policy, trigger, run_id, kube.config_path)],
        "env": list(kube.env),
        "envFrom": list(kube.env_from),
        "resources": resources,
        "volumeMounts": mounts,
    }
    if kube.image_pull_policy:
        container["imagePullPolicy"] = kube.image_pull_policy
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        "nodeSelector": dict(kube.node_selector),
        "tolerations": list(kube.tolerations),
    }
    if kube.service_account:
        pod["serviceAccountName"] = kube.service_account
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": kube.ttl_seconds_after_finished,
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    if kube.active_deadline_s:
        spec["activeDeadlineSeconds"] = kube.active_deadline_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(policy.name, run_id),
            "namespace": kube.namespace,
            "labels": labels,
            "annotations": {POLICY_ANNOTATION: policy.name, "apprentice.dev/trigger": trigger[:250]},
        },
        "spec": spec,
    }


def finished(job: dict[str, Any]) -> str | None:
    """ "Complete" or "Failed" once the Job has finished (its condition of that type is True); else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def started(job: dict[str, Any]) -> bool:
    """Whether the Job's pod has run: a ready, succeeded or failed pod. A pending pod (no node
    for it, its image not pulled) counts as `active` but not `ready`. Before Kubernetes 1.24 the
    status has no `ready`; there `active` is all there is to go by."""
    status = job.get("status") or {}
    if status.get("succeeded") or status.get("failed") or finished(job):
        return True
    if "ready" in status:
        return bool(status["ready"])
    return bool(status.get("active"))


def run_label(job: dict[str, Any]) -> str | None:
    return ((job.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL)


class KubernetesLauncher:
    """One Job per run; see the module docstring."""

    def __init__(self, policy: PolicySettings, database_url: str, jobs: JobsAPI | None = None) -> None:
        kube = policy.learning.kubernetes
        if kube is None:
            raise ValueError(f"policy {policy.name!r}: the kubernetes launcher needs learning.kubernetes")
        self.policy, self.url, self.kube = policy, database_url, kube
        self._jobs = jobs

    @property
    def jobs(self) -> JobsAPI:
        if self._jobs is None:  # credentials are read when first needed: a learner starts without a cluster
            self._jobs = JobsAPI(credentials_for(self.kube), self.kube.namespace, retry_s=self.kube.api_retry_s)
        return self._jobs

    def launch(self, trigger: str) -> RunOutcome:
        run_id = str(uuid.uuid4())
        manifest = job_manifest(self.policy, trigger, run_id)
        name = manifest["metadata"]["name"]
        created_at = datetime.now(timezone.utc)
        try:
            self._create(manifest, run_id)
        except KubernetesError as exc:
            return RunOutcome("failed", self.policy.name, error=f"creating Job {name}: {exc}")
        log.info("policy %s: run %s in Job %s/%s", self.policy.name, run_id, self.kube.namespace, name)
        try:
            result = self._wait(name)
        except (KubernetesError, JobNotStarted) as exc:
            return self._give_up(name, run_id, trigger, created_at, exc)
        fallback = RunOutcome(
            "failed",
            self.policy.name,
            error=f"Job {name} ended {result} without a training run row (the policy's lock was busy, learning "
            "was paused or disabled, or the pod failed before its run began: see the pod's log)",
        )
        outcome = launch_outcome(self.url, self.policy.name, run_id, fallback)
        try:
            self.jobs.delete(name)
        except KubernetesError as exc:  # ttlSecondsAfterFinished collects it anyway
            log.warning("deleting finished Job %s: %s", name, exc)
        return outcome

    def _create(self, manifest: dict[str, Any], run_id: str) -> None:
        """Create the Job. When the answer is an error that may hide a stored Job (none came, a
        5xx, a 409 after such a try), the Job is looked up by its name: if it is this run's, it
        was created; if there is none, the create is tried again (within `api_retry_s`)."""
        name = manifest["metadata"]["name"]
        backoff = Backoff(self.kube.api_retry_s)
        while True:
            try:
                self.jobs.create(manifest)
                return
            except KubernetesError as exc:
                if not (exc.transient or exc.status == 409):
                    raise
                error = exc
            existing = self.jobs.find(name)
            if existing is not None:
                if run_label(existing) != run_id:
                    raise KubernetesError(f"Job {name} exists and belongs to run {run_label(existing)}", 409)
                log.warning("creating Job %s: %s; the Job was created nonetheless", name, error)
                return
            if not backoff.wait():
                raise error
            log.warning("creating Job %s: %s (trying again)", name, error)

    def _wait(self, name: str) -> str:
        """Poll the Job until it finishes; "Complete" or "Failed". Raises JobNotStarted when its
        pod has not started within `start_timeout_s`, KubernetesError when the API stays
        unreachable past `api_retry_s` or the Job is gone."""
        deadline = time.monotonic() + self.kube.start_timeout_s
        running = False
        while True:
            job = self.jobs.read(name)
            state = finished(job)
            if state is not None:
                return state
            running = running or started(job)
            if not running and time.monotonic() > deadline:
                status = job.get("status") or {}
                counts = f"active {status.get('active', 0)}, ready {status.get('ready', 0)}"
                raise JobNotStarted(
                    f"Job {name}: no pod started within {self.kube.start_timeout_s:g} s ({counts}): no node can "
                    "take it (GPUs, node_selector, tolerations) or its "
                    "image cannot be pulled; see `kubectl describe pods -l "
                    f"{RUN_LABEL}={run_label(job)}`"
                )
            time.sleep(self.kube.poll_s)

    def _give_up(
        self, name: str, run_id: str, trigger: str, created_at: datetime, reason: KubernetesError | JobNotStarted
    ) -> RunOutcome:
        """Stop waiting for a Job: delete it (its pod, if any, ends its row on SIGTERM) and record
        the run as failed, so that neither the Job nor a `running` row outlives the wait."""
        error = f"{type(reason).__name__}: {reason}"
        log.error("policy %s: giving run %s up: %s", self.policy.name, run_id, error)
        try:
            self.jobs.delete(name)
        except KubernetesError as exc:  # active_deadline_s ends it, if set
            log.error("deleting Job %s: %s", name, exc)
            error += f" (deleting the Job failed too: {exc})"
        record_failed_launch(self.url, self.policy.name, run_id, trigger, created_at, error)
        return launch_outcome(self.url, self.policy.name, run_id, RunOutcome("failed", self.policy.name, error=error))
