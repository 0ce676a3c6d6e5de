"""Schemathesis hooks for tests/test_schemathesis.py: the formats the gateway's OpenAPI document
declares beyond JSON Schema's own, so the fuzzer draws valid values for them.

`python-regex` (apprentice/evalsets/scoring.py, an expected answer matched as a regular
expression): a pattern Python's `re` compiles. Without this strategy the fuzzer would draw any
string for it, and a schema-valid request would be refused with 400 for a pattern that does not
compile. Loaded by path from the run's config (`hooks`), so it imports only what is installed.
"""

from __future__ import annotations

import re

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
