"""The fuzzer's hook for the document's one custom format (tests/support/schemathesis_hooks.py):
a "negative" case whose only violation is a Python pattern that compiles is valid and dropped;
a pattern that does not compile, and any other violation, is still sent."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest
from schemathesis.core.mutations import Mutation, MutationChannel, OperatorKind
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode

from tests.test_schemathesis import HOOKS


@pytest.fixture(scope="module")
def hooks() -> Any:
    """The hooks file loaded as the fuzzer loads it: by path."""
    spec = importlib.util.spec_from_file_location("schemathesis_hooks_under_test", HOOKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mutation(path: tuple[str, ...], keywords: tuple[str, ...] = ("format",)) -> Mutation:
    return Mutation(
        path=path,
        parameter_location=ParameterLocation.BODY,
        schema_pointer="/properties/" + "/properties/".join(path),
        channel=MutationChannel.SCHEMA,
        operator=OperatorKind.NEGATE_CONSTRAINTS,
        keywords=keywords,
        parameter=path[-1],
        original_value=None,
        new_value=None,
    )


def case(body: Any, *mutations: Mutation, mode: GenerationMode = GenerationMode.NEGATIVE) -> Any:
    meta = SimpleNamespace(
        generation=SimpleNamespace(mode=mode), phase=SimpleNamespace(data=SimpleNamespace(mutations=mutations))
    )
    return SimpleNamespace(meta=meta, body=body)


def scoring(expected: Any) -> dict[str, Any]:
    return {"method": "expected", "match": "regex", "expected": expected}


def test_a_compiling_pattern_sent_as_a_format_violation_is_dropped(hooks):
    # The case seed 318032983 reported as ST201: "õ7|" compiles, so the 201 was right.
    assert not hooks.filter_case(None, case({"scoring": scoring("õ7|")}, mutation(("scoring", "expected"))))
    items = {"items": [{"scoring": scoring("a+")}, {"scoring": scoring(r"\d")}]}
    assert not hooks.filter_case(None, case(items, mutation(("items", "scoring", "expected"))))


@pytest.mark.parametrize("expected", ["(", "*a", "[z-a]", "", 7])
def test_a_real_violation_is_still_sent(hooks, expected):
    assert hooks.filter_case(None, case({"scoring": scoring(expected)}, mutation(("scoring", "expected"))))
    items = {"items": [{"scoring": scoring("a+")}, {"scoring": scoring(expected)}]}
    assert hooks.filter_case(None, case(items, mutation(("items", "scoring", "expected"))))


def test_other_mutations_and_positive_cases_are_kept(hooks):
    body = {"scoring": scoring("a+"), "name": "x"}
    both = case(body, mutation(("scoring", "expected")), mutation(("name",), ("minLength",)))
    assert hooks.filter_case(None, both), "another violation makes the case negative"
    assert hooks.filter_case(None, case(body, mutation(("scoring", "expected"), ("minLength",))))
    assert hooks.filter_case(None, case(body, mutation(("created_at",))))
    assert hooks.filter_case(None, case(body, mode=GenerationMode.POSITIVE))
    assert hooks.filter_case(None, case(body)), "a negative case without recorded mutations is kept"
