"""The patterns that find values to redact: built-in kinds and the operator's own rules.

Every rule has a cheap `hint` (a substring or a short regex, run in C) that a text must contain
before the rule's full pattern runs: most recorded text holds none of these values, so most
strings cost a handful of substring tests. Card numbers must pass the Luhn check and phone
numbers must have a plausible digit count, so ordinary long numbers and dates stay as they are.

Phone numbers are found by shape (an international `+CC` number, or a national number grouped
with separators), not with libphonenumber: its matcher is pure Python and needs the text's
region, which a gateway serving the world does not know (docs/privacy.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from apprentice.settings import RedactionKinds

Validator = Callable[[str], bool]


# Runs of digits (separators removed: "415-555-0132" is ten) and of token characters (what keys
# are made of), found with bytes.translate and a substring search: C speed, where Python's regex
# engine scans prose several times slower and each `in` test of a literal costs as much again.
_DIGITS_AS_MARKS = bytes.maketrans(b"0123456789", b"##########")
_DIGIT_SEPARATORS = b" .-()+/"
_TOKEN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/=.~"
_TOKENS_AS_MARKS = bytes(ord("#") if byte in _TOKEN_CHARS else ord(" ") for byte in range(256))


class Screen:
    """Cheap facts about one text, computed once and shared by every rule's `may_match`."""

    __slots__ = ("text", "_encoded", "_marked", "_answers")

    def __init__(self, text: str) -> None:
        self.text = text
        self._encoded: bytes | None = None
        self._marked: dict[bool, bytes] = {}
        self._answers: dict[tuple[bool, int], bool] = {}

    def _run(self, digits: bool, count: int) -> bool:
        answer = self._answers.get((digits, count))
        if answer is None:
            marked = self._marked.get(digits)
            if marked is None:
                if self._encoded is None:
                    self._encoded = self.text.encode("utf-8", "surrogatepass")
                if digits:
                    marked = self._encoded.translate(_DIGITS_AS_MARKS, _DIGIT_SEPARATORS)
                else:
                    marked = self._encoded.translate(_TOKENS_AS_MARKS)
                self._marked[digits] = marked
            answer = self._answers[(digits, count)] = b"#" * count in marked
        return answer

    def digit_run(self, count: int) -> bool:
        """At least `count` digits in a row once separators are removed."""
        return self._run(True, count)

    def token_run(self, count: int) -> bool:
        """At least `count` key characters (letters, digits, _-+/=.~) in a row."""
        return self._run(False, count)


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of value: `label` names its placeholders (`<EMAIL_...>`)."""

    label: str
    # What the rule finds: each pattern with the substrings one of which a text must hold for it
    # to run (None: always run). When a pattern has a capturing group that took part in a match,
    # only the group is replaced.
    patterns: tuple[tuple[tuple[str, ...] | None, re.Pattern[str]], ...]
    # The shortest text a match can be: shorter strings (roles, names, ids) are not looked at.
    min_length: int = 1
    # Digits in a row (separators removed) a text must hold for the patterns to be tried.
    min_digits: int | None = None
    # Key characters in a row a text must hold (tested before the hints, which cost more).
    min_token: int | None = None
    validate: Validator | None = None
    # How a value is compared with itself elsewhere (`Bob@X.com` is `bob@x.com`).
    normalize: Callable[[str], str] | None = None

    @property
    def screened(self) -> bool:
        """Whether `may_match` tests anything cheaper than the patterns (an operator's rule does not)."""
        return self.min_digits is not None or self.min_token is not None or self.patterns[0][0] is not None

    def may_match(self, screen: Screen) -> bool:
        """A cheap test that is true wherever a pattern can match (false positives only cost time)."""
        if len(screen.text) < self.min_length:
            return False
        if self.min_token is not None and not screen.token_run(self.min_token):
            return False
        if self.min_digits is not None and not screen.digit_run(self.min_digits):
            return False
        return any(hints is None or any(hint in screen.text for hint in hints) for hints, _ in self.patterns)

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """Where the values are in `text` (call after `may_match`)."""
        for hints, pattern in self.patterns:
            if hints is not None and len(self.patterns) > 1 and not any(hint in text for hint in hints):
                continue
            grouped = pattern.groups > 0
            for match in pattern.finditer(text):
                start, end = match.span(1) if grouped and match.start(1) >= 0 else match.span()
                if start < end and (self.validate is None or self.validate(text[start:end])):
                    yield start, end


class Gate:
    """The union of some rules' screens as one quick test per string: most strings of a body
    that holds something to redact hold nothing themselves, and are passed over at the cost of
    a substring test and a translate or two instead of every rule's screen."""

    __slots__ = ("open", "literals", "min_digits", "min_token")

    def __init__(self, rules: list[Rule]) -> None:
        self.open = any(not rule.screened for rule in rules)  # an operator's rule: every string
        self.literals = tuple(
            hint
            for rule in rules
            if rule.min_digits is None and rule.min_token is None
            for hints, _ in rule.patterns
            for hint in hints or ()
        )
        digits = [rule.min_digits for rule in rules if rule.min_digits is not None]
        tokens = [rule.min_token for rule in rules if rule.min_token is not None]
        self.min_digits = min(digits) if digits else None
        self.min_token = min(tokens) if tokens else None

    def admits(self, text: str) -> bool:
        if self.open or any(literal in text for literal in self.literals):
            return True
        if self.min_digits is None and self.min_token is None:
            return False
        encoded = text.encode("utf-8", "surrogatepass")
        if self.min_digits is not None and b"#" * self.min_digits in encoded.translate(
            _DIGITS_AS_MARKS, _DIGIT_SEPARATORS
        ):
            return True
        return self.min_token is not None and b"#" * self.min_token in encoded.translate(_TOKENS_AS_MARKS)


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies (ISO/IEC 7812)."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def only_digits(value: str) -> str:
    return "".join(char for char in value if char.isdigit())


def _card(value: str) -> bool:
    digits = only_digits(value)
    return 13 <= len(digits) <= 19 and luhn_valid(digits) and len(set(digits)) > 1


def _phone(value: str) -> bool:
    # Nine digits at least: dates (01-02-2026) and short codes are not phone numbers.
    return 9 <= len(only_digits(value)) <= 15


def _phone_key(value: str) -> str:
    digits = only_digits(value)
    return "+" + digits if value.lstrip().startswith("+") else digits


EMAIL = Rule(
    "EMAIL",
    min_length=6,
    patterns=(
        (
            ("@",),
            re.compile(
                r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}\b"
            ),
        ),
    ),
    normalize=str.lower,
)

PHONE = Rule(
    "PHONE",
    min_length=9,
    patterns=(
        (
            None,
            re.compile(
                # +CC then groups of digits (spaces, dots, dashes, an area code in parentheses)
                r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(\d{1,4}\))?(?:[ .-]?\d{2,5}){2,5}(?!\w)"
                # North American: (415) 555-0132, 415-555-0132, 415.555.0132
                r"|(?<![\w(+.-])(?:\(\d{3}\)[ ]?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w-])"
                # national numbers with a trunk 0: 06 12 34 56 78, 030 1234 5678, 020 7946 0958
                r"|(?<![\w+.-])0\d{1,4}(?:[ .-]\d{2,4}){2,4}(?![\w-])"
            ),
        ),
    ),
    min_digits=9,
    validate=_phone,
    normalize=_phone_key,
)

CARD = Rule(
    "CARD",
    min_length=13,
    patterns=((None, re.compile(r"(?<![\w.-])\d(?:[ -]?\d){12,18}(?![\w-])")),),
    min_digits=13,
    validate=_card,
    normalize=only_digits,
)

# Each with the literal its text must contain: the pattern runs only where that literal is.
_SECRET_PATTERNS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("-----BEGIN",),
        r"-----BEGIN[A-Z ]{0,40} PRIVATE KEY-----[\s\S]{1,20000}?-----END[A-Z ]{0,40} PRIVATE KEY-----",
    ),
    (("sk-",), r"(?<![\w-])sk-(?:proj-|ant-(?:api\d\d-)?|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    (("apk-",), r"(?<![\w-])apk-[A-Za-z0-9_-]{20,}"),
    (("AKIA", "ASIA", "ABIA", "ACCA"), r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![A-Z0-9])"),
    (
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        r"(?<!\w)(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
    ),
    (("xox",), r"(?<!\w)xox[abposr]-[A-Za-z0-9-]{10,}"),
    (("AIza",), r"(?<![\w-])AIza[0-9A-Za-z_-]{35}"),
    (("k_live_", "k_test_"), r"(?<!\w)[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}"),
    (("eyJ",), r"(?<![\w-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    # the token after "Bearer" (the word itself stays)
    (("earer ",), r"(?<=[Bb]earer )[A-Za-z0-9._~+/-]{16,}=*"),
    # aws_secret_access_key = ..., "AWS_SECRET_ACCESS_KEY": "..."
    (
        ("aws_secret", "AWS_SECRET"),
        r"(?i:aws_secret_access_key)[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
    ),
)

# Each of the keys holds at least 16 key characters in a row, so text without such a run skips
# them all at the cost of one test; a private key block is found by its (rare) first line alone.
SECRET_MIN_TOKEN = 16
PRIVATE_KEY = Rule("SECRET", patterns=tuple((hints, re.compile(p)) for hints, p in _SECRET_PATTERNS[:1]), min_length=40)
KEYS = Rule(
    "SECRET",
    patterns=tuple((hints, re.compile(p)) for hints, p in _SECRET_PATTERNS[1:]),
    min_length=SECRET_MIN_TOKEN,
    min_token=SECRET_MIN_TOKEN,
)
SECRETS = (PRIVATE_KEY, KEYS)

BUILT_IN: dict[str, tuple[Rule, ...]] = {"secret": SECRETS, "email": (EMAIL,), "card": (CARD,), "phone": (PHONE,)}


def compile_rules(kinds: RedactionKinds) -> list[Rule]:
    """The rules a redaction section enables, in the order they claim overlapping text: secrets
    first (a key may contain digits and an @), then e-mails, cards, phones, the operator's."""
    rules = [rule for name, kind in BUILT_IN.items() if getattr(kinds, name) for rule in kind]
    for custom in kinds.rules:
        flags = re.IGNORECASE if custom.ignore_case else 0
        rules.append(Rule(custom.name.upper(), ((None, re.compile(custom.pattern, flags)),)))
    return rules
