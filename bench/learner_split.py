"""Training and serving on one machine: what each costs the other.

Starts `apprentice serve-model` (SmolLM2-135M-Instruct unless --model; its default threads:
half the cores) and keeps it busy with --concurrency clients (chat completions of up to
--max-tokens tokens at temperature 1). Meanwhile a learner-like training process runs GRPO
optimizer steps on synthetic samples the way a long-lived learner does (model loaded once,
`training_threads` torch threads, `os.nice(--nice)`). Reported:

- serving: completions/s and completion tokens/s idle, and while a training run is going;
- training: a run's wall time without traffic and with traffic, and the model load a
  long-lived learner no longer pays per run.

    python -m bench.learner_split [--model DIR] [--samples 64] [--window 30] [--nice 10]
    python -m bench.learner_split --quick       # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from bench.harness import start_model_server

PROMPT = "Describe {} in 8 words or fewer."
THINGS = ["the ocean", "a cat", "winter", "coffee", "the moon", "a library", "a bicycle", "rain"]


class Traffic:
    """Clients sending completions back to back; every finished completion is timestamped."""

    def __init__(self, base_url: str, concurrency: int, max_tokens: int) -> None:
        self.base_url, self.concurrency, self.max_tokens = base_url, concurrency, max_tokens
        self.done: list[tuple[float, int]] = []  # (time.time() at the end, completion tokens)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _client(self, client: AsyncOpenAI, index: int) -> None:
        seed = index * 100_000
        while not self._stop.is_set():
            seed += 1
            answer = await client.chat.completions.create(
                model="bench",
                messages=[{"role": "user", "content": PROMPT.format(THINGS[seed % len(THINGS)])}],
                max_tokens=self.max_tokens,
                temperature=1.0,
                seed=seed,
            )
            self.done.append((time.time(), answer.usage.completion_tokens if answer.usage else 0))

    async def _run(self) -> None:
        client = AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=300)
        await asyncio.gather(*[self._client(client, i) for i in range(self.concurrency)])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=300)

    def rate(self, start: float, end: float) -> tuple[float, float]:
        """Completions/s and completion tokens/s finished within [start, end] (time.time())."""
        inside = [tokens for at, tokens in self.done if start <= at <= end]
        span = max(end - start, 1e-9)
        return len(inside) / span, sum(inside) / span


def train_child(args: argparse.Namespace) -> None:
    """The learner's side, in its own process (niced as `apprentice learner` is): load once, train one run."""
    if args.nice:
        os.nice(args.nice)
    import torch

    from apprentice.settings import LearningSettings
    from learner.grpo.adapters import new_lora
    from learner.grpo.tokens import Segment
    from learner.grpo.trainer import GRPOTrainer, TrainerConfig, TrainSample
    from learner.jobs.policy_trainer import training_threads
    from learner.models import load_base_model

    learning = LearningSettings(lr=1e-4, micro_batch_size=8, grad_accumulation=4, threads=args.threads)
    torch.set_num_threads(training_threads(learning))
    started = time.perf_counter()
    base, _ = load_base_model(args.model, device="cpu")
    model = new_lora(base, 8, 16, learning.lora_target_modules)
    load_s = time.perf_counter() - started
    generator = torch.Generator().manual_seed(0)
    prompt, completion = 32, 16
    samples = []
    for i in range(args.samples):
        ids = torch.randint(100, 40000, (prompt + completion,), generator=generator).tolist()
        mask = [False] * prompt + [True] * completion
        samples.append(TrainSample(str(i), 0.0, 1.0 if i % 2 else -1.0, [Segment(ids, mask, None, 1.0, None)]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning.lr)
    trainer = GRPOTrainer(model, TrainerConfig.from_settings(learning), fresh=True, optimizer=optimizer)
    trainer.train(samples[:8])  # warm-up (first-call allocations), as a long-lived learner has had
    print(json.dumps({"ready": time.time()}), flush=True)
    sys.stdin.readline()  # the parent says go
    start = time.time()
    result = trainer.train(samples)
    print(
        json.dumps(
            {
                "load_s": load_s,
                "start": start,
                "end": time.time(),
                "steps": result.optimizer_steps,
                "threads": torch.get_num_threads(),
                "train_s": result.duration_s,
            }
        ),
        flush=True,
    )


class Child:
    """A training child process: loaded and warmed up, trains one run when told to."""

    def __init__(self, args: argparse.Namespace) -> None:
        command = [
            sys.executable,
            "-m",
            "bench.learner_split",
            "--child",
            "--model",
            args.model,
            "--samples",
            str(args.samples),
            "--nice",
            str(args.nice),
        ] + (["--threads", str(args.threads)] if args.threads else [])
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._line()  # ready

    def _line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("the training child exited")
            if line.startswith("{"):
                return json.loads(line)

    def train(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        figures = self._line()
        self.process.wait(timeout=60)
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--samples", type=int, default=64, help="sequences in the training run (32 per step)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of idle serving measured")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None, help="training threads (default: half the cores)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a smoke run: one step of 8 sequences, a 2 s window")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.window, args.max_tokens = 8, 2.0, 4  # one small optimizer step
    if args.model is None:
        from learner.models import fetch_default_model

        args.model = str(fetch_default_model())
    if args.child:
        train_child(args)
        return

    server, server_url = start_model_server(args.model, Path(tempfile.mkdtemp(prefix="learner-split-")), "bench")
    try:
        quiet = Child(args).train()
        traffic = Traffic(server_url, args.concurrency, args.max_tokens)
        traffic.start()
        time.sleep(1 if args.quick else 5)  # the server's batches fill up
        idle_start = time.time()
        time.sleep(args.window)
        idle = traffic.rate(idle_start, time.time())
        child = Child(args)  # loads while traffic runs, as a learner that starts beside a busy server
        busy = child.train()
        during = traffic.rate(busy["start"], busy["end"])
        traffic.stop()
    finally:
        server.stop()
    print(
        f"cores {os.cpu_count()}, training threads {quiet['threads']}, nice {args.nice}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"model load (paid once by a long-lived learner): {quiet['load_s']:.1f}s")
    print(
        f"training run, {args.samples} sequences, {quiet['steps']} optimizer steps: "
        f"{quiet['train_s']:.1f}s without traffic, {busy['train_s']:.1f}s with traffic"
    )
    print(
        f"serving, {args.concurrency} clients: idle {idle[0]:.2f} completions/s ({idle[1]:.0f} tokens/s); "
        f"while training {during[0]:.2f} completions/s ({during[1]:.0f} tokens/s)"
    )


if __name__ == "__main__":
    main()
