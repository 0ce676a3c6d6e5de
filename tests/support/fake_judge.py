"""A fake LLM judge for the fake upstream: models named `judge-<rule>[-<fault><k>]`.

It reads the judge prompt the gateway sends (gateway/judging/transcript.py: attempts as
`<attempt id="t1">` sections of role-headed blocks) and scores each attempt's last assistant
text by a rule the judged policy does not know:

- `length`: the attempt's answer length over the longest answer's (relative, in [0, 1]);
- `lowercase`: 1 when the answer has letters and no capital letter, else 0;
- `short<N>`: 1 when the answer has at most N words, else 0.

`<fault><k>` makes the first k attempts of a judgement (counted by the assistant turns the
gateway appends on a retry) answer badly, then answers well: `notjson`, `missing` (one id
left out), `extra` (an unknown id), `nan` (NaN as a score), `range` (a score of 1.5),
`duplicate` (one id twice), `bool` (true as a score), `fenced` (a good answer inside a
```json fence, which the judge accepts). k defaults to 99: always.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_ATTEMPT = re.compile(r'<attempt id="([^"]+)">\n(.*?)\n</attempt>', re.DOTALL)
_HEADER = re.compile(r"^\[([^\]\n]+)\]$", re.MULTILINE)
_MODEL = re.compile(r"^judge-([a-z]+)(\d*)(?:-([a-z]+)(\d*))?$")


def attempts(prompt: str) -> dict[str, str]:
    """label -> the attempt's last assistant text."""
    out: dict[str, str] = {}
    for label, body in _ATTEMPT.findall(prompt):
        blocks = _HEADER.split(body)
        # split gives [before, role1, text1, role2, text2, ...]
        answer = ""
        for index in range(1, len(blocks) - 1, 2):
            if blocks[index] == "assistant":
                answer = blocks[index + 1].strip()
        out[label] = answer
    return out


def _rule_scores(rule: str, parameter: str, answers: dict[str, str]) -> dict[str, float]:
    if rule == "length":
        longest = max((len(a) for a in answers.values()), default=0) or 1
        return {label: round(len(a) / longest, 4) for label, a in answers.items()}
    if rule == "lowercase":
        return {
            label: 1.0 if re.search(r"[a-z]", a) and not re.search(r"[A-Z]", a) else 0.0 for label, a in answers.items()
        }
    if rule == "short":
        limit = int(parameter or 10)
        return {label: 1.0 if len(a.split()) <= limit else 0.0 for label, a in answers.items()}
    raise ValueError(f"fake judge: unknown rule {rule!r}")


def _faulty(fault: str, scores: dict[str, float]) -> str:
    entries = [
        {"trajectory_id": label, "explanation": f"scored {value}", "score": value} for label, value in scores.items()
    ]
    if fault == "notjson":
        return "The first attempt is clearly the best, I would give it a high score."
    if fault == "missing":
        return orjson.dumps({"scores": entries[1:]}).decode()
    if fault == "extra":
        return orjson.dumps({"scores": [*entries, {"trajectory_id": "t99", "explanation": "?", "score": 0.5}]}).decode()
    if fault == "nan":
        return orjson.dumps({"scores": entries}).decode().replace(f'"score":{entries[0]["score"]}', '"score":NaN', 1)
    if fault == "range":
        return orjson.dumps({"scores": [{**entries[0], "score": 1.5}, *entries[1:]]}).decode()
    if fault == "duplicate":
        return orjson.dumps({"scores": [*entries, entries[0]]}).decode()
    if fault == "bool":
        return orjson.dumps({"scores": [{**entries[0], "score": True}, *entries[1:]]}).decode()
    if fault == "fenced":
        return "Here are the scores:\n```json\n" + orjson.dumps({"scores": entries}).decode() + "\n```"
    raise ValueError(f"fake judge: unknown fault {fault!r}")


def judge_content(body: dict[str, Any]) -> str:
    """The content of the fake judge's answer to one chat completions request."""
    match = _MODEL.match(str(body.get("model")))
    if match is None:
        raise ValueError(f"fake judge: cannot read model {body.get('model')!r}")
    rule, parameter, fault, count = match.groups()
    messages = body.get("messages") or []
    prompt = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    scores = _rule_scores(rule, parameter, attempts(prompt))
    retries_so_far = sum(1 for m in messages if m.get("role") == "assistant")
    if fault and retries_so_far < int(count or 99):
        return _faulty(fault, scores)
    entries = [
        {"trajectory_id": label, "explanation": f"{rule}: {value}", "score": value} for label, value in scores.items()
    ]
    return orjson.dumps({"scores": entries}).decode()
