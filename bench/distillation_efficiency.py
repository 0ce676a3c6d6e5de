"""Samples needed: SFT on a teacher's answers then RL, against RL alone, on a task with a low base rate.

The task: "Describe X in one sentence." rewarded 1 only when the answer is all lowercase, a
rule the prompt never states, so SmolLM2-135M-Instruct's base rate is a few percent at most
(measured and printed). GRPO learns only from groups where some answer succeeds, so RL alone
starts from almost no signal; a teacher that follows the rule gives demonstrations.

Both arms: the same model (SmolLM2-135M-Instruct), the same LoRA (r=8, alpha 16, the seven
projections), the bare on-policy GRPO loop of bench/learning_efficiency.py (4 prompts x 8
answers a step at temperature 1, lr 1e-4), and the same budget of samples. SFT-then-RL spends
TEACHER_SAMPLES of its budget on the teacher's answers (each a sample: a hosted call that was
paid for and rewarded), of which it keeps the rewarded ones (the distillation's min_reward
selection), fine-tunes on them with Apprentice's SFT trainer (learner/sft/trainer.py: the
policy's chat template, assistant tokens only), then runs RL for the rest. RL alone spends it
all on RL. Held-out success (prompts neither arm trains on, EVAL_SAMPLES answers, Wilson 95%
interval) is measured at the same sample counts for both; "samples needed" is the first
checkpoint at which an arm reaches TARGET. The two arms run side by side, one process each,
so that both see the same machine load.

    python -m bench.distillation_efficiency                 # 512 samples an arm, writes docs/benchmarks.md
    python -m bench.distillation_efficiency --samples 128 --eval-samples 32   # the reduced run
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.learning_efficiency import (
    GROUP_SIZE,
    PROMPTS_PER_STEP,
    SEED,
    BareLoop,
    Evaluation,
    Task,
    log,
)
from bench.report import machine_line, markdown_table, write_section
from examples.word_limit_agent import HELD_OUT_TOPICS, TOPICS

SECTION_TITLE = "Warm start: SFT on a teacher's answers then RL, against RL alone"
STEP_SAMPLES = PROMPTS_PER_STEP * GROUP_SIZE
TEACHER_SAMPLES = 64
EVAL_SAMPLES = 64
TARGET = 0.5
SFT_LR = 5e-4
SFT_EPOCHS = 3
TEACHER_SUCCESS = 0.75  # the teacher follows the rule three times in four


def _lowercase(answer: str, ended: bool) -> float:
    return 1.0 if ended and any(c.isalpha() for c in answer) and answer == answer.lower() else 0.0


TASK = Task(
    "hidden_lowercase",
    "one sentence, rewarded only when all lowercase (the prompt does not say so)",
    lambda topic: f"Describe {topic} in one sentence.",
    _lowercase,
    512,
)

_TEMPLATES = (
    "{t} is a quiet and lovely part of everyday life.",
    "{t} brings calm, color and a little wonder to the day.",
    "people enjoy {t} because it feels simple and warm.",
    "{t} is something many of us notice and remember.",
)


def teacher_answer(topic: str, rng: random.Random) -> str:
    """A hosted teacher that follows the rule TEACHER_SUCCESS of the time (else capitalises)."""
    text = rng.choice(_TEMPLATES).format(t=topic)
    return text if rng.random() < TEACHER_SUCCESS else text[0].upper() + text[1:]


@dataclass
class Arm:
    name: str
    curve: list[tuple[int, Evaluation]] = field(default_factory=list)  # (samples spent, held-out success)
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def needed(self, target: float) -> int | None:
        return next((samples for samples, found in self.curve if found.rate >= target), None)


def evaluate(loop: BareLoop) -> Evaluation:
    topics = HELD_OUT_TOPICS[:16]
    per_prompt = max(1, EVAL_SAMPLES // len(topics))
    topics = topics[: max(1, EVAL_SAMPLES // per_prompt)]
    successes, n = 0.0, 0
    for start in range(0, len(topics), 8):
        prompts = [TASK.prompt(t) for t in topics[start : start + 8]]
        _, _, answers, ended = loop.sample(prompts, per_prompt)
        successes += sum(TASK.score(a, e) for a, e in zip(answers, ended, strict=True))
        n += len(answers)
    return Evaluation(successes, n)


def distil(loop: BareLoop, rng: random.Random) -> tuple[int, float]:
    """SFT on the rewarded ones of TEACHER_SAMPLES teacher answers; (kept, final loss)."""
    from learner.grpo.tokens import CallRecord, trajectory_segments
    from learner.sft.trainer import SFTConfig, train_sft

    segments = []
    for _ in range(TEACHER_SAMPLES):
        topic = rng.choice(TOPICS)
        answer = teacher_answer(topic, rng)
        if TASK.score(answer, True) < 1.0:  # min_reward 1: only the answers that followed the rule
            continue
        call = CallRecord(
            messages=[{"role": "user", "content": TASK.prompt(topic)}],
            tools=None,
            answer={"role": "assistant", "content": answer},
        )
        segments.extend(trajectory_segments(loop.tokenizer, [call]))
    config = SFTConfig(
        lr=SFT_LR,
        epochs=SFT_EPOCHS,
        max_steps=None,
        micro_batch_size=8,
        grad_accumulation=1,
        max_grad_norm=1.0,
        max_seq_len=512,
        seed=SEED,
    )
    loop.model.train()
    result = train_sft(loop.model, loop.optimizer, segments, config, loop.tokenizer.pad_token_id or 0)
    return len(segments), float(result.loss or 0.0)


def run_arm(name: str, model_dir: Path, samples: int, threads: int, *, warm: bool, eval_samples: int) -> Arm:
    globals()["EVAL_SAMPLES"] = eval_samples  # a worker process starts with the module's default
    arm = Arm(name)
    loop = BareLoop(model_dir, threads)
    loop.tokenizer.padding_side = "left"
    rng = random.Random(SEED)
    started = time.monotonic()
    spent = 0
    arm.curve.append((0, evaluate(loop)))
    log(f"{name}: base {arm.curve[-1][1].text()}")
    if warm:
        kept, loss = distil(loop, random.Random(SEED + 1))
        spent = TEACHER_SAMPLES
        arm.notes.append(f"SFT on {kept} of {TEACHER_SAMPLES} teacher answers (loss {loss:.3f})")
        arm.curve.append((spent, evaluate(loop)))
        log(f"{name}: after SFT {arm.curve[-1][1].text()}")
    checkpoint = 2 * STEP_SAMPLES
    while spent + STEP_SAMPLES <= samples:
        prompts = [TASK.prompt(t) for t in rng.sample(TOPICS, PROMPTS_PER_STEP)]
        reward = loop.step(prompts, TASK)
        spent += STEP_SAMPLES
        log(f"{name}: {spent} samples, step mean reward {reward:.2f}")
        if spent % checkpoint == 0 or spent + STEP_SAMPLES > samples:
            arm.curve.append((spent, evaluate(loop)))
            log(f"{name}: {spent} samples held out {arm.curve[-1][1].text()}")
    arm.wall_s = time.monotonic() - started
    return arm


def report(arms: list[Arm], samples: int, command: str, write: bool) -> None:
    points = sorted({s for arm in arms for s, _ in arm.curve})
    rows = []
    for point in points:
        row: list[object] = [point]
        for arm in arms:
            found = dict(arm.curve).get(point)
            row.append(found.text() if found else "-")
        rows.append(row)
    needed = [
        f"{arm.name}: {arm.needed(TARGET) if arm.needed(TARGET) is not None else f'not reached in {samples}'}"
        for arm in arms
    ]
    body = "\n".join(
        [
            machine_line(),
            "",
            f"Command: `{command}`. Task: {TASK.describe}; SmolLM2-135M-Instruct, LoRA r=8 on the seven "
            f"projections, the bare GRPO loop of bench/learning_efficiency.py ({PROMPTS_PER_STEP} prompts x "
            f"{GROUP_SIZE} answers a step, temperature 1, lr 1e-4); the same budget of {samples} samples for both "
            f"arms. SFT-then-RL spends {TEACHER_SAMPLES} of them on a teacher's answers (it follows the rule "
            f"{TEACHER_SUCCESS:.0%} of the time; the rewarded ones are kept, min_reward 1), fine-tuned with "
            f"learner/sft/trainer.py (lr {SFT_LR:g}, {SFT_EPOCHS} epochs), then RL. Held-out success on "
            f"{EVAL_SAMPLES} answers to prompts neither arm trains on, Wilson 95% interval.",
            "",
            markdown_table(["samples spent", *[arm.name for arm in arms]], rows),
            "",
            f"Samples needed to reach {TARGET:.0%} held-out success: " + "; ".join(needed) + ".",
            "",
            f"Size: {samples} samples an arm, {EVAL_SAMPLES} held-out answers a checkpoint (the full run, "
            "`python -m bench.distillation_efficiency`, is 512 and 64).",
            "",
            "Wall time: "
            + "; ".join(f"{arm.name} {arm.wall_s:.0f} s" for arm in arms)
            + ". "
            + " ".join(note for arm in arms for note in arm.notes),
        ]
    )
    print(body)
    if write:
        write_section(SECTION_TITLE, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=512, help="the sample budget of each arm")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each arm's process")
    parser.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES, help="held-out answers per checkpoint")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    globals()["EVAL_SAMPLES"] = args.eval_samples  # read by evaluate() and report()
    from learner.models import fetch_default_model

    model_dir = fetch_default_model()
    # The two arms run side by side, one process each (a core each on a 2-core machine), so that
    # both see the same machine load; each arm's own figures do not depend on the other's.
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        jobs = [
            pool.submit(run_arm, name, model_dir, args.samples, args.threads, warm=warm, eval_samples=args.eval_samples)
            for name, warm in (("SFT then RL", True), ("RL alone", False))
        ]
        arms = [job.result() for job in jobs]
    report(arms, args.samples, "python -m bench.distillation_efficiency " + " ".join(sys.argv[1:]), not args.no_write)


if __name__ == "__main__":
    main()
