"""Replace the values that rules find in a JSON body with placeholders, without touching it.

Placeholders are `<LABEL_xxxxxx>`: six hex digits of HMAC-SHA256 under a key that is itself
derived from the redaction key and the trajectory id. So the same value is the same
placeholder in every call of a trajectory, on any gateway process and after a restart (the
calls of one run may be served by several processes), and nothing is kept to map
placeholders back: no table, no memory. Another trajectory has another key, so the same value
there gets an unrelated placeholder and the two cannot be linked. Six hex digits (24 bits)
keep two values of one trajectory apart (two of 100 distinct e-mails in one trajectory
collide with probability 3e-4) while a placeholder of a low-entropy value stays ambiguous even
to someone holding the key: about 600 ten-digit phone numbers share each one.

Bodies are walked copy-on-write: a dict or list that holds nothing to redact is returned as
it is, so what the client receives (built from the same objects) is never changed.
"""

from __future__ import annotations

import hashlib
import hmac
from bisect import bisect_left
from typing import Any

from gateway.redaction.rules import Gate, Rule, Screen

PLACEHOLDER_HEX = 6
# Token fields: numbers, or fragments of text that is redacted as a whole (see record.py).
SKIPPED_KEYS = frozenset({"token_ids", "prompt_token_ids", "logprobs", "prompt_logprobs", "top_logprobs"})


def trajectory_key(key: bytes, trajectory_id: str) -> bytes:
    """The per-trajectory HMAC key: placeholders of two trajectories cannot be compared."""
    return hmac.new(key, b"apprentice-redaction\x00" + trajectory_id.encode(), hashlib.sha256).digest()


class Redaction:
    """One record's redaction: the rules, the trajectory's key, and how many values it replaced."""

    __slots__ = ("rules", "key", "count", "_shortest", "_gate")

    def __init__(self, rules: list[Rule], key: bytes) -> None:
        self.rules = rules
        self.key = key
        self.count = 0
        self._shortest = 1  # strings shorter than the shortest possible match are not looked at
        self._gate: Gate | None = None  # strings it does not admit are not looked at

    def placeholder(self, rule: Rule, value: str) -> str:
        normal = rule.normalize(value) if rule.normalize is not None else value
        digest = hmac.new(self.key, rule.label.encode() + b"\x00" + normal.encode(), hashlib.sha256).hexdigest()
        return f"<{rule.label}_{digest[:PLACEHOLDER_HEX]}>"

    def text(self, text: str) -> str:
        """`text` with every value found replaced; the same str object when nothing is found."""
        # Accepted spans, sorted by start and never overlapping (so their ends are sorted too):
        # earlier rules (secrets first) keep text that later ones also match.
        starts: list[int] = []
        ends: list[int] = []
        spans: list[Rule] = []
        screen = Screen(text)
        for rule in self.rules:
            if not rule.may_match(screen):
                continue
            for start, end in rule.spans(text):
                index = bisect_left(starts, end)
                if index and ends[index - 1] > start:
                    continue
                starts.insert(index, start)
                ends.insert(index, end)
                spans.insert(index, rule)
        if not spans:
            return text
        parts: list[str] = []
        position = 0
        for start, end, rule in zip(starts, ends, spans, strict=True):
            parts.append(text[position:start])
            parts.append(self.placeholder(rule, text[start:end]))
            position = end
        parts.append(text[position:])
        self.count += len(spans)
        return "".join(parts)

    def body(self, body: Any) -> Any:
        """A JSON body with its strings redacted; the same object when nothing changed.

        The rules' cheap screens (an operator's rule: its pattern) are first tried on all of the
        body's text at once; only the rules that pass walk the body, string by string (their
        patterns run on the strings that pass the screens themselves)."""
        strings: list[str] = []
        _collect(body, strings)
        if not strings:
            return body
        joined = Screen("\x00".join(strings))
        active = [
            rule
            for rule in self.rules
            if (rule.may_match(joined) if rule.screened else next(rule.spans(joined.text), None) is not None)
        ]
        if not active:
            return body
        rules, self.rules = self.rules, active
        self._shortest = min(rule.min_length for rule in active)
        self._gate = Gate(active)
        try:
            return self.value(body)
        finally:
            self.rules, self._gate, self._shortest = rules, None, 1

    def value(self, value: Any) -> Any:
        """A JSON value with its strings redacted, walked; the same object when nothing changed."""
        if isinstance(value, str):
            if len(value) < self._shortest or (self._gate is not None and not self._gate.admits(value)):
                return value
            return self.text(value)
        if isinstance(value, dict):
            changed: dict[str, Any] | None = None
            for name, item in value.items():
                if name in SKIPPED_KEYS:
                    continue
                redacted = self.value(item)
                if redacted is not item:
                    if changed is None:
                        changed = dict(value)
                    changed[name] = redacted
            return value if changed is None else changed
        if isinstance(value, list):
            copied: list[Any] | None = None
            for index, item in enumerate(value):
                redacted = self.value(item)
                if redacted is not item:
                    if copied is None:
                        copied = list(value)
                    copied[index] = redacted
            return value if copied is None else copied
        return value


def _collect(value: Any, strings: list[str]) -> None:
    """Every string of a JSON value (token fields left out), depth first."""
    if isinstance(value, str):
        strings.append(value)
    elif isinstance(value, dict):
        for name, item in value.items():
            if name not in SKIPPED_KEYS:
                _collect(item, strings)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (str, dict, list)):
                _collect(item, strings)
