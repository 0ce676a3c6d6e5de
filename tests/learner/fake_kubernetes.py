"""A small fake of the Kubernetes API's batch/v1 Jobs, over real HTTP, with a "kubelet" that runs
each Job's container command as a local process.

Why a fake: no cluster runs here or in CI. What it keeps real: the HTTP requests the launcher
sends (paths, bearer token, JSON bodies, the DELETE's propagation policy), the Job manifest it
records, and the run itself: the container's command is started on this machine (its `python`
replaced by this interpreter), with the container's `env` and the `envFrom` Secrets the test
declares, so the Job's run writes its rows into the test database. A Job's status follows its
process: `active` and `ready` while it runs, then a `Complete` or `Failed` condition by its exit
status; deleting a Job stops its process (SIGTERM), as the garbage collector ends its pods.

Faults a real cluster has, on demand: `faults` answers the next request of a method with an
error status; `drop_create_answer` stores and starts a Job and then closes the connection
without an answer; `pending` keeps every pod pending (no node for it: `active` 1, `ready` 0,
nothing runs, until the Job's activeDeadlineSeconds fails it); `rotate_token` changes the
accepted token (and writes it to the token file) at the first read, so that the request in
flight gets a 401; `stand_in` runs this Python code with the container's arguments instead of
its command (tests of the launcher's waiting: no training).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FakeCluster:
    token: str
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> manifest as created
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)  # (method, path, body)
    deleted: list[str] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)
    log_dir: Path = Path(".")
    faults: list[tuple[str, int]] = field(default_factory=list)  # (method, status), each answered once
    drop_create_answer: bool = False
    pending: bool = False
    rotate_token: tuple[str, Path] | None = None  # (new token, token file)
    stand_in: str | None = None
    created: dict[str, float] = field(default_factory=dict)  # name -> time.monotonic() at creation

    def fault(self, method: str) -> int | None:
        """The status the next `method` request is to get instead of its answer (consumed)."""
        for index, (faulty, status) in enumerate(self.faults):
            if faulty == method:
                del self.faults[index]
                return status
        return None

    def start_pod(self, name: str, manifest: dict[str, Any]) -> None:
        container = manifest["spec"]["template"]["spec"]["containers"][0]
        if self.pending:
            return
        command = list(container["command"])
        if command[0] == "python":
            command[0] = sys.executable
        if self.stand_in is not None:
            command = [sys.executable, "-c", self.stand_in, *command[1:]]  # the arguments stay, in sys.argv
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for source in container.get("envFrom") or []:
            env.update(self.secrets[source["secretRef"]["name"]])
        env.update({item["name"]: item["value"] for item in container.get("env") or []})
        log = self.log_dir / f"{name}.log"
        self.logs[name] = log
        with log.open("wb") as out:
            self.processes[name] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def status(self, name: str) -> dict[str, Any]:
        if name not in self.processes:  # pending: a pod with no node, until the Job's deadline
            deadline = self.jobs[name]["spec"].get("activeDeadlineSeconds")
            if deadline is not None and time.monotonic() - self.created[name] > deadline:
                return {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}
            return {"active": 1, "ready": 0}
        code = self.processes[name].poll()
        if code is None:
            return {"active": 1, "ready": 1}
        kind = "Complete" if code == 0 else "Failed"
        return {
            "succeeded" if code == 0 else "failed": 1,
            "ready": 0,
            "conditions": [{"type": kind, "status": "True", "reason": "Fake"}],
        }

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def _handler(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    prefix = "/apis/batch/v1/namespaces/"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._reply(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": reason,
                    "message": message,
                    "code": code,
                },
            )

        def _route(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body: Any = json.loads(self.rfile.read(length)) if length else None
            cluster.requests.append((method, self.path, body))
            if method == "GET" and cluster.rotate_token is not None:
                cluster.token, token_file = cluster.rotate_token
                token_file.write_text(cluster.token)
                cluster.rotate_token = None
            status = cluster.fault(method)
            if status is not None:
                return self._status(status, "InternalError" if status >= 500 else "Fault", f"injected {status}")
            if self.headers.get("Authorization") != f"Bearer {cluster.token}":
                return self._status(401, "Unauthorized", "Unauthorized")
            if not self.path.startswith(prefix) or "/jobs" not in self.path:
                return self._status(404, "NotFound", f"no route {self.path}")
            namespace, _, rest = self.path[len(prefix) :].partition("/jobs")
            name = rest.strip("/")
            if method == "POST" and not name:
                if body.get("apiVersion") != "batch/v1" or body.get("kind") != "Job":
                    return self._status(400, "BadRequest", "not a batch/v1 Job")
                job = body["metadata"]["name"]
                if body["metadata"].get("namespace", namespace) != namespace:
                    return self._status(400, "BadRequest", "the namespace of the body does not match the request")
                if job in cluster.jobs:
                    return self._status(409, "AlreadyExists", f'jobs.batch "{job}" already exists')
                cluster.jobs[job] = body
                cluster.created[job] = time.monotonic()
                cluster.start_pod(job, body)
                if cluster.drop_create_answer:
                    cluster.drop_create_answer = False
                    self.close_connection = True  # the Job exists; its creator hears nothing
                    return None
                return self._reply(201, body)
            if name not in cluster.jobs or name in cluster.deleted:
                return self._status(404, "NotFound", f'jobs.batch "{name}" not found')
            if method == "GET":
                return self._reply(200, {**cluster.jobs[name], "status": cluster.status(name)})
            if method == "DELETE":
                cluster.deleted.append(name)
                process = cluster.processes.get(name)
                if process is not None and process.poll() is None:
                    process.terminate()
                return self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
            return self._status(405, "MethodNotAllowed", method)

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler


class FakeKubernetesAPI:
    """The fake API server on 127.0.0.1, in a thread; `url` and `cluster` for the test."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cluster))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeKubernetesAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.cluster.stop()
