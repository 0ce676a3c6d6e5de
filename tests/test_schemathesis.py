"""The whole API under fuzzing: schemathesis, every check, against a real gateway.

The gateway runs in keys mode (an admin key and a client key) in front of a fake upstream of its
own, with a policy and some adapter versions of it, on a fresh PostgreSQL; the schemathesis CLI
reads its `/openapi.json` and runs every phase (examples, coverage, fuzzing, stateful) with
`--checks all`: server errors, statuses, content types, headers and bodies the document does not
declare, schema-valid requests refused, schema-violating ones accepted, `405` without `Allow`,
authentication ignored. The key of each security scheme comes from a config file, so the client
key calls the model endpoints and the admin key the admin ones. Zero failures is the only
passing result.

Fuzzing as users' traffic is, not as one seed is: every run draws a new seed, printed with the
line that replays it (`APPRENTICE_FUZZ_SEED=<seed>`), and written to the artifacts. The stateful
phase follows the document's OpenAPI links (gateway/endpoints/openapi.py, `LINKS`) from the
answers that name a policy, a version, a trajectory, a response, a reward or a key to the
operations that take it, and the ids recorded before the run (the policy's versions, two
trajectories, a stored response) stand in for generated ones half of the time, so operations are
reached with real ids. Each operation's statuses are written to
`tests/artifacts/schemathesis/statuses.json`; in the deep run every operation must answer
something other than a refused key or 404 at least once.

Examples per operation are bounded (`APPRENTICE_FUZZ_EXAMPLES`, 10 by default) so a run stays
within about two minutes on a two-core machine; `make fuzz` is the deeper run (100 an operation).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from tests.support.processes import REPO_ROOT, FakeUpstreamProcess
from tests.test_auth import cli

# About two minutes of fuzzing (make test-fast skips it).
pytestmark = pytest.mark.slow

ARTIFACTS = REPO_ROOT / "tests" / "artifacts" / "schemathesis"

ADMIN_KEY = "apprentice-admin-fuzz-0123456789"
SEED_VARIABLE = "APPRENTICE_FUZZ_SEED"
EXAMPLES_VARIABLE = "APPRENTICE_FUZZ_EXAMPLES"
DEFAULT_EXAMPLES = 10
# From this many examples an operation (`make fuzz`), every operation must have been reached.
DEEP_EXAMPLES = 100
# The formats the document declares beyond JSON Schema's (a Python regular expression), drawn valid.
HOOKS = REPO_ROOT / "tests" / "support" / "schemathesis_hooks.py"
CONFIG = """
seed = {seed}
hooks = "{hooks}"
# Hypothesis' health checks judge how hard the bodies are to draw, not the API.
suppress-health-check = ["all"]

[generation]
max-examples = {max_examples}
database = "none"

[cache]
enabled = false

# The links the document declares, only: links inferred from names would follow the key
# listing's ids to the client key this run authenticates with, and revoke it.
[phases.stateful.inference]
algorithms = []

# The model operations are called with the models this gateway serves most of the time (random
# names only reach the 404 that lists them): the policy, and a deployment of the fake upstream.
[dictionaries.models]
values = ["agent", "fake-model"]

[[operations]]
include-path-regex = "^(/v1)?/(chat/completions|responses|messages|messages/count_tokens|embeddings)$"
parameters."body.model" = {{ dictionary = "models", probability = 0.9 }}

# The resources recorded before the run, by their real ids half of the time (the links reach them
# too, when the answer they follow names one): the policy's versions, two trajectories (DELETE may
# remove either), and a stored response.
[dictionaries.versions]
values = {versions}

[dictionaries.trajectories]
values = {trajectories}

[dictionaries.responses]
values = {responses}

[[operations]]
include-path-regex = "^/v1/admin/versions/[^/]+$"
parameters."path.version" = {{ dictionary = "versions", probability = 0.5 }}

# A transition that puts a version in service loads it at the policy's endpoints first; the fake
# upstream loads no adapter, so with a real version these answer the documented 502
# (adapter_load_failed, naming the endpoint), as they do for an operator whose inference server
# refuses the adapter.
[[operations]]
include-path-regex = "^/v1/admin/versions/[^/]+/(approve|reject|promote)$"
parameters."path.version" = {{ dictionary = "versions", probability = 0.5 }}
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502"]

[[operations]]
include-path-regex = "^/v1/admin/policies/[^/]+/rollback$"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502"]

[[operations]]
include-path-regex = "^/v1/trajectories/"
parameters."path.trajectory_id" = {{ dictionary = "trajectories", probability = 0.5 }}

[[operations]]
include-path-regex = "^/v1/responses/[^/]+$"
parameters."path.response_id" = {{ dictionary = "responses", probability = 0.5 }}

# A page of a stored response's input items: `after` naming no item of that response is refused
# with a documented 400 naming it (a cursor from elsewhere), which JSON Schema cannot say.
[[operations]]
include-path-regex = "^/v1/responses/[^/]+/input_items$"
parameters."path.response_id" = {{ dictionary = "responses", probability = 0.5 }}
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429", "5xx"]

[auth.openapi.GatewayKey]
bearer = "{client}"

[auth.openapi.AnthropicApiKey]
api_key = "{client}"

[auth.openapi.AdminKey]
bearer = "{admin}"

# A policy's Responses and Messages calls are translated to chat completions, and a reward is
# checked against its policy's rules: the translator refuses what JSON Schema cannot say (a
# tool_choice naming a tool the request does not define, a function_call_output without its
# call, an idempotency_key that differs from the Idempotency-Key header), each with a 400 naming
# the field. For these operations only, a schema-valid request may be answered 400.
[[operations]]
include-path-regex = "^(/v1)?/(responses|messages|messages/count_tokens|rewards)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429", "5xx"]

# Revoking a key and replacing its limits act on the keys this run authenticates with when given
# an id read from an answer (the listing's). Fuzzed with generated ids, and in the stateful phase
# with the ids of keys the fuzzer created itself (the document's links from POST /v1/admin/keys).
[[operations]]
include-path-regex = "^/v1/admin/keys/"
phases.coverage.extra-data-sources.responses = false
phases.fuzzing.extra-data-sources.responses = false
"""


def _schemathesis() -> str:
    return str(Path(sys.executable).with_name("schemathesis"))


def _seed() -> int:
    """A new seed each run, unless one is given to replay a run."""
    given = os.environ.get(SEED_VARIABLE)
    return int(given) if given else secrets.randbelow(2**31)


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, re.Pattern[str]]]:
    """Each documented (method, path) with a regex matching its concrete URLs' paths."""
    found = []
    for path, item in spec["paths"].items():
        pattern = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")
        found.extend((method.upper(), path, pattern) for method in item)
    return found


def _statuses(har: Path, spec: dict[str, Any]) -> dict[tuple[str, str], set[int]]:
    """The statuses each documented operation answered during the run (from the HAR report)."""
    operations = _operations(spec)
    seen: dict[tuple[str, str], set[int]] = defaultdict(set)
    for entry in json.loads(har.read_text())["log"]["entries"]:
        method = entry["request"]["method"].upper()
        path = urlsplit(entry["request"]["url"]).path or "/"
        for documented_method, documented_path, pattern in operations:
            if method == documented_method and pattern.match(path):
                seen[(method, documented_path)].add(int(entry["response"]["status"]))
                break
    return seen


def _never_reached(spec: dict[str, Any], seen: dict[tuple[str, str], set[int]]) -> list[str]:
    """Operations that answered nothing but a refused key (401, 403) or an unknown id (404)."""
    return sorted(
        f"{method} {path}"
        for method, path, _ in _operations(spec)
        if not seen.get((method, path), set()) - {401, 403, 404}
    )


def _seed_versions(db, policy: str) -> None:
    """Adapter versions of the policy, so that the version operations have something to act on: a
    retired one (rollback), a candidate (approve, reject, promote) and a rejected one."""
    for number, status in ((1, "retired"), (2, "candidate"), (3, "rejected")):
        db.execute(
            "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path) "
            "VALUES (%s, %s, %s, %s, %s, 'fake-model', '/nowhere')",
            (uuid.uuid4(), policy, number, f"{policy}-v{number}", status),
        )


@pytest.fixture
def own_upstream(tmp_path: Path) -> Iterator[FakeUpstreamProcess]:
    """A fake upstream of this test's own: whatever the fuzzer sends it, the session's one, which
    every later test uses, is not the one it reaches."""
    process = FakeUpstreamProcess(tmp_path)
    process.start()
    yield process
    process.stop()


def test_schemathesis_finds_no_failure_in_any_operation(
    start_gateway, own_upstream, database_url, db, tmp_path, capsys
):
    fake_upstream = own_upstream
    seed = _seed()
    max_examples = int(os.environ.get(EXAMPLES_VARIABLE) or DEFAULT_EXAMPLES)
    replay = f"schemathesis seed {seed}, {max_examples} examples an operation: replay with {SEED_VARIABLE}={seed}"
    with capsys.disabled():
        print(f"\n{replay}", flush=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "seed.txt").write_text(replay + "\n")
    created = cli(database_url, tmp_path, "keys", "create", "--name", "fuzzer", "--tenant", "fuzz")
    assert created.returncode == 0, created.stderr
    client_key = created.stdout.strip()
    policy = {
        "name": "agent",
        "base_model": "fake-model",
        "endpoints": [fake_upstream.api_base],
        "record_tokens": False,
        "teacher": {"model": "fake-model"},  # so that GET .../teacher has something to answer
    }
    _seed_versions(db, "agent")
    model = {"model": "openai/fake-model", "api_base": fake_upstream.api_base, "api_key": "sk-upstream-secret"}
    gateway = start_gateway(
        model_list=[{"model_name": "fake-model", "litellm_params": model}],
        auth={"mode": "keys", "admin_key": "os.environ/FUZZ_ADMIN_KEY"},
        env={"FUZZ_ADMIN_KEY": ADMIN_KEY},
        policies=[policy],
    )
    # Something recorded before the fuzzer comes, of the client's tenant: two trajectories of chat
    # calls and a stored response.
    client = openai.OpenAI(base_url=gateway.base_url, api_key=client_key, max_retries=0)
    trajectories = []
    for text in ("Hello", "Hello again"):
        answer = client.chat.completions.with_raw_response.create(
            model="agent", messages=[{"role": "user", "content": text}]
        )
        trajectories.append(answer.headers["X-Apprentice-Trajectory-Id"])
    response = client.responses.create(model="agent", input="Hello")

    config = tmp_path / "schemathesis.toml"
    config.write_text(
        CONFIG.format(
            seed=seed,
            hooks=HOOKS,
            max_examples=max_examples,
            client=client_key,
            admin=ADMIN_KEY,
            versions=json.dumps([f"agent-v{number}" for number in (1, 2, 3)]),
            trajectories=json.dumps(trajectories),
            responses=json.dumps([response.id]),
        )
    )
    har = ARTIFACTS / "requests.har"
    run = subprocess.run(
        [
            _schemathesis(),
            "--config-file",
            str(config),
            "--no-color",
            "run",
            gateway.url + "/openapi.json",
            "--checks",
            "all",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            # One worker: Hypothesis parses lambdas' sources with `ast`, whose recursion counter
            # CPython 3.11 shares between threads ("AST constructor recursion depth mismatch",
            # CPython gh-106905), so two workers fail at random inside schemathesis.
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--report",
            "junit,har",
            "--report-dir",
            str(ARTIFACTS),
            "--report-har-path",
            str(har),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # Hypothesis keeps its `.hypothesis` folder in the working directory
        timeout=600 + 60 * max_examples,
    )
    output = run.stdout + run.stderr
    (ARTIFACTS / "output.txt").write_text(f"{replay}\n{output}")
    assert run.returncode == 0, f"{replay}\n{output[-20000:]}"
    # Every operation of the document, every phase run and passed, no failure and no error.
    operations = re.search(r"Operations:\s+(\d+) selected / (\d+) total", output)
    assert operations is not None and operations.group(1) == operations.group(2), output[:2000]
    assert int(operations.group(1)) >= 33
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in output, (replay, phase, output[-4000:])
    assert "Failures:" not in output and "Errors:" not in output, f"{replay}\n{output[-20000:]}"
    # Hypothesis stops drawing once a small schema is exhausted: about 3,600 cases at 10 examples an
    # operation, 7,900 at 100.
    generated = re.search(r"(\d+) generated", output)
    assert generated is not None and int(generated.group(1)) >= (5000 if max_examples >= DEEP_EXAMPLES else 1000), (
        output[-4000:]
    )
    assert "Traceback" not in gateway.log_text()

    spec = httpx.get(gateway.url + "/openapi.json").json()
    seen = _statuses(har, spec)
    never_reached = _never_reached(spec, seen)
    (ARTIFACTS / "statuses.json").write_text(
        json.dumps(
            {
                "replay": replay,
                "never_reached": never_reached,
                "statuses": {f"{method} {path}": sorted(codes) for (method, path), codes in sorted(seen.items())},
            },
            indent=1,
        )
    )
    # The report covers the run: every documented operation was called at least once.
    assert len(seen) == len(_operations(spec)), sorted(
        set(f"{m} {p}" for m, p, _ in _operations(spec)) - {f"{m} {p}" for m, p in seen}
    )
    if max_examples >= DEEP_EXAMPLES:
        # Every operation was reached with something it could act on at least once.
        assert not never_reached, (replay, never_reached)
