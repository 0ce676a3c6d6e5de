"""Schemathesis hooks for tests/test_schemathesis.py: the formats the gateway's OpenAPI document
declares beyond JSON Schema's own, so the fuzzer draws valid values for them.

`python-regex` (apprentice/evalsets/scoring.py, an expected answer matched as a regular
expression): a pattern Python's `re` compiles. Without this strategy the fuzzer would draw any
string for it, and a schema-valid request would be refused with 400 for a pattern that does not
compile. Loaded by path from the run's config (`hooks`), so it imports only what is installed.

The other side of the same format: in its negative phase schemathesis counts any value of a
format it cannot validate as a violation (`negative/__init__.py`, `_always_invalid`), so it sends
a pattern that compiles, `"õ7|"`, as "schema-violating" and reports the 201 as accepted invalid
data (ST201, seed 318032983 at 500 examples). `filter_case` drops exactly those cases: negative
ones whose every mutation is the `format` of `expected` (the only property of this format in
the document) and whose value compiles. A pattern that does not compile is still sent, and must
still be refused with 400.
"""

from __future__ import annotations

import re
from typing import Any

import schemathesis
from hypothesis import strategies as st

from apprentice.evalsets.scoring import PYTHON_REGEX_FORMAT

_ATOMS = st.sampled_from([".", r"\d", r"\w", r"\s", "[a-z]", "[^0-9]", "(ab|cd)", "a", "Z", "7", " ", "é"])
_QUANTIFIERS = st.sampled_from(["", "*", "+", "?", "*?", "{2}", "{1,3}"])


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


python_regexes = st.builds(
    "{}{}{}".format,
    st.sampled_from(["", "^"]),
    st.lists(st.builds(str.__add__, _ATOMS, _QUANTIFIERS), min_size=1, max_size=6).map("".join),
    st.sampled_from(["", "$"]),
).filter(_compiles)

schemathesis.openapi.format(PYTHON_REGEX_FORMAT, python_regexes)

# The one property the document gives PYTHON_REGEX_FORMAT (tests/test_request_checks.py checks
# where it is declared).
REGEX_PROPERTY = "expected"


def _values_at(body: Any, path: tuple[Any, ...]) -> list[Any]:
    """Every value at `path` (property names: a mutation's path skips array indices, so every
    element of an array on the way is followed)."""
    if isinstance(body, list):
        return [value for element in body for value in _values_at(element, path)]
    if not path:
        return [body]
    if not isinstance(body, dict) or path[0] not in body:
        return []
    return _values_at(body[path[0]], path[1:])


def _only_a_compiling_pattern(case: Any) -> bool:
    """Whether a negative case's every mutation is the regex format of `expected`, and every
    `expected` at its path (the mutated one among them) is a pattern that compiles (and is not
    empty: the field's minLength)."""
    mutations = getattr(getattr(case.meta.phase, "data", None), "mutations", None) or ()
    return bool(mutations) and all(
        mutation.keywords == ("format",)
        and mutation.path
        and mutation.path[-1] == REGEX_PROPERTY
        and (values := _values_at(case.body, tuple(mutation.path)))
        and all(isinstance(value, str) and len(value) >= 1 and _compiles(value) for value in values)
        for mutation in mutations
    )


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """Keep every case but a "negative" one that is valid: see the module's docstring."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_negative:
        return True
    return not _only_a_compiling_pattern(case)
