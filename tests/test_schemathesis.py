"""The whole API under fuzzing: schemathesis, every check, against a real gateway.

The gateway runs in keys mode (an admin key and a client key) in front of the fake upstream,
with a policy and some adapter versions of it, on a fresh PostgreSQL; the schemathesis CLI reads
its `/openapi.json` and runs every phase (examples, coverage, fuzzing, stateful) with `--checks
all`: server errors, statuses, content types, headers and bodies the document does not declare,
schema-valid requests refused, schema-violating ones accepted, `405` without `Allow`,
authentication ignored. The key of each security scheme comes from a config file, so the client
key calls the model endpoints and the admin key the admin ones. Zero failures is the only
passing result.

Fuzzing as users' traffic is, not as one seed is: every run draws a new seed, printed with the
line that replays it (`APPRENTICE_FUZZ_SEED=<seed>`). The stateful phase follows the document's
OpenAPI links (gateway/endpoints/openapi.py, `LINKS`) from the answers that name a policy, a
version, a trajectory, a response, a reward or a key to the operations that take it, so every
operation is reached with real ids: each must answer something other than 404 at least once.

Examples per operation are bounded (`APPRENTICE_FUZZ_EXAMPLES`, 10 by default) so a run stays
within a few minutes on a two-core machine; `make fuzz` is the deeper run (100 an operation).
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
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from tests.support.processes import REPO_ROOT, cli

# About two minutes of fuzzing (make test-fast skips it).
pytestmark = pytest.mark.slow

ARTIFACTS = REPO_ROOT / "tests" / "artifacts" / "schemathesis"

ADMIN_KEY = "apprentice-admin-fuzz-0123456789"
SEED_VARIABLE = "APPRENTICE_FUZZ_SEED"
EXAMPLES_VARIABLE = "APPRENTICE_FUZZ_EXAMPLES"
DEFAULT_EXAMPLES = 10
# From this many examples an operation (`make fuzz`), every operation must have been reached.
DEEP_EXAMPLES = 100
CONFIG = """
seed = {seed}
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

# Registering an evaluation set whose name the policy already has answers 409 (docs/evaluation-sets.md).
[[operations]]
include-path-regex = "^/v1/admin/policies/[^/]+/eval-sets$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409"]

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


def _statuses(har: Path, spec: dict[str, Any], base_path: str) -> dict[tuple[str, str], set[int]]:
    """The statuses each documented operation answered during the run (from the HAR report)."""
    operations = _operations(spec)
    seen: dict[tuple[str, str], set[int]] = defaultdict(set)
    for entry in json.loads(har.read_text())["log"]["entries"]:
        method = entry["request"]["method"].upper()
        path = urlsplit(entry["request"]["url"]).path.removeprefix(base_path) or "/"
        for documented_method, documented_path, pattern in operations:
            if method == documented_method and pattern.match(path):
                seen[(method, documented_path)].add(int(entry["response"]["status"]))
                break
    return seen


def _seed_versions(db, policy: str) -> None:
    """Adapter versions of the policy, so that the version operations have something to act on: a
    retired one (rollback), a candidate (approve, reject, promote) and a rejected one."""
    for number, status in ((1, "retired"), (2, "candidate"), (3, "rejected")):
        db.execute(
            "INSERT INTO adapter_versions (id, policy, version, name, status, base_model, path) "
            "VALUES (%s, %s, %s, %s, %s, 'fake-model', '/nowhere')",
            (uuid.uuid4(), policy, number, f"{policy}-v{number}", status),
        )


def test_schemathesis_finds_no_failure_in_any_operation(
    start_gateway, fake_upstream, database_url, db, tmp_path, capsys
):
    seed = _seed()
    max_examples = int(os.environ.get(EXAMPLES_VARIABLE) or DEFAULT_EXAMPLES)
    replay = f"schemathesis seed {seed}, {max_examples} examples: replay with {SEED_VARIABLE}={seed}"
    with capsys.disabled():
        print(f"\n{replay}", flush=True)
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
    gateway = start_gateway(
        auth={"mode": "keys", "admin_key": "os.environ/FUZZ_ADMIN_KEY"},
        env={"FUZZ_ADMIN_KEY": ADMIN_KEY},
        policies=[policy],
    )
    # Something recorded before the fuzzer comes: a trajectory and a call of the client's tenant.
    client = openai.OpenAI(base_url=gateway.base_url, api_key=client_key, max_retries=0)
    client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "Hello"}])

    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.format(seed=seed, max_examples=max_examples, client=client_key, admin=ADMIN_KEY))
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
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "output.txt").write_text(f"{replay}\n{output}")
    assert run.returncode == 0, f"{replay}\n{output[-20000:]}"
    # Every operation of the document, every phase run and passed, no failure and no error.
    operations = re.search(r"Operations:\s+(\d+) selected / (\d+) total", output)
    assert operations is not None and operations.group(1) == operations.group(2), output[:2000]
    assert int(operations.group(1)) >= 33
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in output, (replay, phase, output[-4000:])
    assert "Failures:" not in output and "Errors:" not in output, f"{replay}\n{output[-20000:]}"
    generated = re.search(r"(\d+) generated", output)
    assert generated is not None and int(generated.group(1)) >= 100 * max_examples, output[-4000:]
    assert "Traceback" not in gateway.log_text()

    # Every operation was reached with something it could act on at least once.
    spec = httpx.get(gateway.url + "/openapi.json").json()
    seen = _statuses(har, spec, "")
    (ARTIFACTS / "statuses.json").write_text(
        json.dumps(
            {f"{method} {path}": sorted(statuses) for (method, path), statuses in sorted(seen.items())}, indent=1
        )
    )
    if max_examples >= DEEP_EXAMPLES:
        # Answers other than a refused key (401, 403) or an unknown id (404): the operation acted.
        never_reached = sorted(
            f"{method} {path}"
            for method, path, _ in _operations(spec)
            if not seen.get((method, path), set()) - {401, 403, 404}
        )
        assert not never_reached, (replay, never_reached)
