"""The walls between the packages, checked twice: statically and by running the code.

Statically, import-linter's contracts (pyproject.toml, `[tool.importlinter]`) say that the gateway
and the learner do not import each other, that the core package `apprentice` imports neither, and
that torch, transformers, peft and vllm are imported only under learner/. At run time, the
command line and a real gateway start in an interpreter where those libraries cannot be imported,
which also covers imports that no static analysis sees (entry points, `importlib`, plugins).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.processes import REPO_ROOT, GatewayProcess

ML_LIBRARIES = ("torch", "transformers", "peft", "vllm")
BLOCKED_IMPORTS_LOG = "APPRENTICE_TEST_BLOCKED_IMPORTS_LOG"

# Put first on PYTHONPATH, this runs at the start of every interpreter of the test, child processes
# (uvicorn's workers) included. A library missing from the machine looks exactly like this to the
# code that imports it; the log shows where an attempt came from when the test fails.
BLOCKER = f'''"""Made by tests/test_architecture.py: {", ".join(ML_LIBRARIES)} cannot be imported here."""

import os
import sys
import traceback
from importlib.abc import MetaPathFinder

BLOCKED = {ML_LIBRARIES!r}


class BlockMachineLearningLibraries(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in BLOCKED:
            return None
        with open(os.environ["{BLOCKED_IMPORTS_LOG}"], "a") as log:
            log.write(f"pid {{os.getpid()}} imported {{fullname}}:\\n" + "".join(traceback.format_stack(limit=12)))
        raise ModuleNotFoundError(f"No module named {{fullname!r}} (blocked by tests/test_architecture.py)",
                                  name=fullname)


sys.meta_path.insert(0, BlockMachineLearningLibraries())
'''

# Every command either side registers, and the core's own: listing or describing one must not
# import the machine-learning libraries (the learner's commands import them in their bodies).
COMMANDS = [[], ["db"], ["up"], ["gateway"], ["keys"], ["learn"], ["learner"], ["serve-model"], ["fetch-model"]]


def console_script(name: str) -> str:
    """A console script of this environment (the interpreter's bin/), as installed by pip."""
    return str(Path(sys.executable).with_name(name))


class BlockedImports:
    """An environment for child processes in which the ML libraries cannot be imported."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        (directory / "sitecustomize.py").write_text(BLOCKER)
        self.log_path = directory / "attempts.log"
        self.log_path.touch()
        python_path = [str(directory), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.env = {"PYTHONPATH": os.pathsep.join(python_path), BLOCKED_IMPORTS_LOG: str(self.log_path)}

    def attempts(self) -> str:
        return self.log_path.read_text()

    def run(self, args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, env={**os.environ, **self.env}, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture
def blocked(tmp_path: Path) -> BlockedImports:
    return BlockedImports(tmp_path / "blocked-imports")


def test_import_contracts_hold() -> None:
    result = subprocess.run(
        [console_script("lint-imports"), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    summary = re.search(r"Contracts: (\d+) kept, 0 broken", report)
    assert summary is not None and int(summary.group(1)) >= 3, report


def test_the_blocker_blocks(blocked: BlockedImports) -> None:
    """Without this the tests below would pass just as well with a blocker that did nothing."""
    result = blocked.run([sys.executable, "-c", "import torch"])
    assert result.returncode != 0
    assert "ModuleNotFoundError: No module named 'torch' (blocked by tests/test_architecture.py)" in result.stderr
    assert "imported torch" in blocked.attempts()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(["apprentice", *command]))
def test_command_line_needs_no_ml_library(blocked: BlockedImports, command: list[str]) -> None:
    result = blocked.run([console_script("apprentice"), *command, "--help"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Usage: apprentice" in result.stdout
    assert blocked.attempts() == ""


def test_gateway_serves_without_ml_libraries(
    blocked: BlockedImports, start_gateway: Callable[..., GatewayProcess]
) -> None:
    gateway = start_gateway(workers=2, env=blocked.env)
    assert httpx.get(gateway.url + "/healthz", timeout=10).status_code == 200
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused-in-open-mode", max_retries=0)
    completion = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hello without torch"}]
    )
    assert (completion.choices[0].message.content or "").startswith("hello without torch")
    assert blocked.attempts() == "", blocked.attempts()
