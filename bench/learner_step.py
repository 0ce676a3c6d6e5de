"""One GRPO optimizer step: Apprentice's trainer vs a bare torch+peft loop vs TRL's GRPOTrainer.

All three compute the same loss (clipped ratio, eps 0.2/0.28, token-level mean, no KL) on the
same batch (--batch sequences of --prompt-tokens + --completion-tokens, advantages +-1; each batch
twice: every row its own prompt, then one GRPO group, every row answering one prompt) with the
same model (SmolLM2-135M-Instruct unless --model, LoRA r=8 on all seven projections), then clip
the gradient and take an AdamW step. The figure is the median wall time of --steps steps after
one warm-up step, and tokens/s over all tokens of the batch.

- bare: `model(...).logits` over every position, log_softmax, gather, mask; the textbook loop.
- apprentice: `GRPOTrainer.backward_step` (hidden states gathered at loss positions before the
  LM head; the prefix all rows of a micro-batch share run once), at micro-batch = batch and at
  micro-batch = batch / 2 with 2 accumulation steps.
- trl: `GRPOTrainer.compute_loss` (loss_type "bnpo", the token-level mean) on the same
  tensors, when trl imports here (`pip install trl`, or PYTHONPATH to a directory holding it).

    python -m bench.learner_step [--model DIR] [--steps 5] [--batch 8] [--threads 2] [--prompts K ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.report import machine_line, markdown_table, write_section

TITLE = "Learner step"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EPS_LOW, EPS_HIGH, LR = 0.2, 0.28, 1e-5


def fresh_lora(model_dir: str) -> Any:
    from learner.grpo.adapters import new_lora
    from learner.models import load_base_model

    torch.manual_seed(0)
    model, _ = load_base_model(model_dir, device="cpu")
    return new_lora(model, 8, 16, TARGETS)


def make_batch(vocab: int, batch: int, prompt: int, completion: int, prompts: int) -> dict[str, torch.Tensor]:
    """`batch` rows answering `prompts` distinct prompts (a GRPO group's rows share theirs)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab - 100, (batch, prompt + completion), generator=generator)
    ids[:, :prompt] = ids[torch.arange(batch) % prompts, :prompt]
    advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(batch)])
    return {"ids": ids, "advantages": advantages, "prompt": torch.tensor(prompt)}


def timed(step: Callable[[], None], steps: int) -> list[float]:
    step()  # warm-up
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times


def bare_loop(model: Any, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    ids, advantages, prompt = batch["ids"], batch["advantages"], int(batch["prompt"])
    mask = torch.zeros_like(ids, dtype=torch.float32)
    mask[:, prompt:] = 1.0
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
        old = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - old)
        adv = advantages.unsqueeze(1)
        per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
        m = mask[:, 1:]
        loss = (per_token * m).sum() / m.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return step


def apprentice_step(model: Any, batch: dict[str, torch.Tensor], micro: int) -> tuple[Callable[[], None], float]:
    from apprentice.settings import LearningSettings
    from learner.grpo.tokens import Segment
    from learner.grpo.trainer import GRPOTrainer, TrainerConfig, TrainSample

    ids, advantages, prompt = batch["ids"], batch["advantages"], int(batch["prompt"])
    samples = [
        TrainSample(
            str(i),
            0.0,
            float(advantages[i]),
            [Segment(ids[i].tolist(), [False] * prompt + [True] * (ids.shape[1] - prompt), None, 1.0, None)],
        )
        for i in range(ids.shape[0])
    ]
    config = TrainerConfig.from_settings(
        LearningSettings(
            lr=LR, micro_batch_size=micro, grad_accumulation=ids.shape[0] // micro, eps_low=EPS_LOW, eps_high=EPS_HIGH
        )
    )
    trainer = GRPOTrainer(model, config, fresh=True)
    started = time.perf_counter()
    rows = trainer.prepare(samples, {})  # the once-per-run scoring pass (old logprobs)
    scoring = time.perf_counter() - started
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        trainer.backward_step(samples, rows)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return step, scoring


def trl_step(model: Any, model_dir: str, batch: dict[str, torch.Tensor]) -> Callable[[], None] | str:
    try:
        import pyarrow
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except Exception as exc:  # not installed, or does not import with this transformers
        return f"trl did not import: {type(exc).__name__}: {exc}"[:200]
    from learner.models import load_tokenizer

    ids, advantages, prompt = batch["ids"], batch["advantages"], int(batch["prompt"])
    n, completion = ids.shape[0], ids.shape[1] - prompt
    try:
        args = GRPOConfig(
            output_dir="/tmp/apprentice-bench-trl",
            per_device_train_batch_size=n,
            num_generations=n,
            max_completion_length=completion,
            loss_type="bnpo",
            beta=0.0,
            epsilon=EPS_LOW,
            epsilon_high=EPS_HIGH,
            learning_rate=LR,
            max_grad_norm=1.0,
            report_to=[],
            use_cpu=True,
            logging_steps=1000,
            save_strategy="no",
            bf16=False,
            fp16=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
            args=args,
            # never iterated (we call compute_loss); an explicit fingerprint skips
            # datasets' hashing, which fails with some dill / pyarrow pairs
            train_dataset=Dataset(pyarrow.table({"prompt": ["x"] * n}), fingerprint="bench"),
            processing_class=load_tokenizer(model_dir),
        )
    except Exception as exc:
        return f"GRPOTrainer could not be built: {type(exc).__name__}: {exc}"[:200]
    inputs = {
        "prompt_ids": ids[:, :prompt],
        "prompt_mask": torch.ones_like(ids[:, :prompt]),
        "completion_ids": ids[:, prompt:],
        "completion_mask": torch.ones_like(ids[:, prompt:]),
        "advantages": advantages,
        "num_items_in_batch": torch.tensor(float(n * completion)),
    }
    with torch.no_grad():
        old = trainer._get_per_token_logps_and_entropies(model, ids, torch.ones_like(ids), completion)[0]
    inputs["old_per_token_logps"] = old
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step, which we bypass
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=64)
    parser.add_argument(
        "--prompts",
        type=int,
        action="append",
        help="distinct prompts in the batch, once per value (default: one a row, then 1: the batch is one GRPO "
        "group, whose prompt the Apprentice trainer runs once)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: one small step per row, no TRL; writes nothing"
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.batch, args.prompt_tokens, args.completion_tokens = 1, 2, 16, 16
        args.no_trl = args.no_write = True
    torch.set_num_threads(args.threads)
    from learner.models import resolve_model_path

    model_dir = str(resolve_model_path(args.model))
    tokens = args.batch * (args.prompt_tokens + args.completion_tokens)
    rows: list[list[object]] = []
    notes: list[str] = []

    def record(name: str, times: list[float], extra: str = "") -> None:
        median = statistics.median(times)
        rows.append([name, f"{median:.2f}", f"{min(times):.2f}", f"{tokens / median:.0f}", extra])
        print(f"{name}: median {median:.2f}s min {min(times):.2f}s, {tokens / median:.0f} tokens/s {extra}", flush=True)

    for prompts in args.prompts or [args.batch, 1]:
        shape = f"{prompts} prompt{'s' if prompts > 1 else ''}"
        model = fresh_lora(model_dir)
        vocab = model.get_base_model().config.vocab_size
        batch = make_batch(vocab, args.batch, args.prompt_tokens, args.completion_tokens, prompts)
        record(f"bare torch+peft loop (full logits), {shape}", timed(bare_loop(model, batch), args.steps))
        for micro in (args.batch, max(1, args.batch // 2)):
            model = fresh_lora(model_dir)
            step, scoring = apprentice_step(model, batch, micro)
            accumulation = args.batch // micro
            record(
                f"apprentice GRPOTrainer, micro-batch {micro} x {accumulation}, {shape}",
                timed(step, args.steps),
                f"once-per-run scoring pass {scoring:.2f}s",
            )
        if not args.no_trl:
            model = fresh_lora(model_dir)
            trl_loop = trl_step(model, model_dir, batch)
            if isinstance(trl_loop, str):
                notes.append(trl_loop)
                print(trl_loop)
            else:
                import trl

                try:
                    record(
                        f"TRL {trl.__version__} GRPOTrainer.compute_loss (bnpo), {shape}",
                        timed(trl_loop, args.steps),
                        "logits at completion positions (logits_to_keep); also computes entropies",
                    )
                except Exception as exc:
                    notes.append(f"TRL {trl.__version__}: compute_loss failed here: {type(exc).__name__}: {exc}"[:200])
                    print(notes[-1])
    load = os.getloadavg()
    body = "\n\n".join(
        [
            f"`python -m bench.learner_step --steps {args.steps} --batch {args.batch} --threads {args.threads}`: one "
            f"optimizer step (forward, backward, grad clip, AdamW) of LoRA r=8 on all seven projections of "
            f"{os.path.basename(model_dir)}, fp32 on CPU, {args.batch} sequences of {args.prompt_tokens} prompt + "
            f"{args.completion_tokens} completion tokens, same loss (clipped ratio, eps 0.2/0.28, token mean) "
            "in all rows.",
            markdown_table(["implementation", "median step (s)", "best (s)", "tokens/s", "notes"], rows),
            "The Apprentice trainer applies the LM head only at loss positions (half the tokens here) and runs the "
            "prefix that every row of a micro-batch shares once (a group's prompt: the rows with 1 prompt; random "
            "prompts share nothing); the scoring pass (old-policy logprobs, no gradient) runs once per learner run, "
            "not per step. Micro-batching trades a little speed for bounded memory at the same gradient.",
            *notes,
            f"{machine_line()} torch {torch.__version__}, {args.threads} threads; load average during the run "
            f"{load[0]:.1f} / {load[1]:.1f} (other work shares these cores, so absolute times are noisy).",
        ]
    )
    print(body)
    if not args.no_write:
        write_section(TITLE, body)


if __name__ == "__main__":
    main()
