"""The judge's rubric: the policy's own text or a general default, and its hash.

The hash names the rubric in every judgement and judge reward: "the same group, judge and
rubric are never judged twice", and a changed rubric is a new judge whose agreement with real
outcomes is measured apart from the old one's.
"""

from __future__ import annotations

import hashlib

from apprentice.settings import JudgeSettings

# Written for relative scoring (RULER's insight): the judge need not know the absolute scale
# of success, only which attempts did the task better than the others.
DEFAULT_RUBRIC = """\
You compare several attempts by an AI agent at the same task and score each one.
- An attempt that achieves the user's goal scores higher than one that does not.
- Among attempts that achieve it, prefer the one that is correct, complete and follows every \
instruction (format, length, language, constraints), with fewer mistakes, detours and \
unnecessary tool calls.
- An attempt that is wrong, refuses without reason, invents facts, or breaks an instruction \
scores low, even when it is confident or long.
- Judge what the attempts did, not what they claim to have done. Tool results are facts.
- Use the whole range from 0 to 1: the best attempt near 1, a failed one near 0; equal \
attempts get equal scores."""


def rubric_text(judge: JudgeSettings) -> str:
    """The rubric a policy's judge uses."""
    return judge.rubric.strip() if judge.rubric and judge.rubric.strip() else DEFAULT_RUBRIC


def rubric_hash(text: str) -> str:
    """A short stable name of a rubric's exact text (sha256, 16 hex digits)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
