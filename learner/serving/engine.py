"""The generation engine: one background thread that batches requests and decodes them.

Requests arrive from the event loop (`generate`) and wait in a queue. The engine thread keeps
one running batch with a KV cache (left padding + attention mask). Its rows may belong to
different adapters and to the base model: each forward pass gives peft one adapter name per row
(`LoraManager.activate_rows`), so while a canary serves part of the traffic both versions decode
in the same steps instead of taking turns. Between decode steps the engine admits waiting
requests (continuous batching: their prompts are prefilled and their caches merged into the
running one) and drops finished sequences.

Invariants:
- Row i of the cache, the mask and the positions belongs to `seqs[i]`, and runs with the adapter
  its request named (None: the base).
- Admission is first come, first served over all adapters: the oldest waiting request joins
  first, and one that does not fit the batch stops admission (younger requests do not overtake
  it), so no request starves.
- Every adapter a running sequence uses stays loaded and unchanged until it finishes: adapter
  loads and unloads (`call`) run on the engine thread, between decode steps, and one that
  touches an adapter a running sequence uses, or that would wrap or unwrap the model (the first
  load, the last unload), runs only while no batch runs: while one waits nothing new is
  admitted, so the running batch drains. Any other load or unload (a new canary, a version that
  stopped serving, while others serve) runs at the next step boundary without a drain: draining
  a CPU batch of 32-token answers took 6-20 s on a busy machine, each time, and stopped new
  requests from starting meanwhile. A request whose adapter was unloaded while it waited fails
  with UnknownAdapterError when its turn comes.

Priority (vLLM's `priority` field: lower values first, 0 by default): waiting requests are
admitted most urgent first (then oldest first), and a less urgent request starts only while no
more urgent one waits or runs; when a more urgent request arrives, the running sequences of less
urgent requests are abandoned (their requests fail with RequestAbandoned) before the next step,
so a batch holds one priority at a time and a client's request never shares decode steps with
less urgent work (on a CPU every row of a batch costs the step time). The gateway's exploration samples
(gateway/exploration) are such requests: work that is worth doing only on idle capacity.

torch releases the GIL while it computes, so the event loop keeps answering HTTP requests and
streaming tokens meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from learner.models import cache_keyword
from learner.serving.adapters import LoraManager
from learner.serving.sampling import SamplingParams, make_generator, processed_logprobs, sample_row, top_logprobs

log = logging.getLogger(__name__)


class RequestAbandoned(Exception):
    """A less urgent request gave way to a more urgent one (see "Priority" above)."""


class UnknownAdapterError(Exception):
    """The adapter a waiting request named was unloaded before its turn came."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class SequenceUpdate:
    """What one decode step produced for one choice: sent to the request's consumer."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class EngineStats:
    """Counters the tests and the benchmark read to see that batching happens."""

    steps: int = 0
    tokens: int = 0
    max_batch_size: int = 0
    prefills: int = 0
    prefill_rows: int = 0  # prompt rows the prefills ran: one per distinct (prompt, adapter) admitted together
    mixed_steps: int = 0  # forward passes (prefills too) whose rows used several adapters, or an adapter and the base
    abandoned: int = 0  # requests abandoned for a more urgent one (see "Priority")


class _Request:
    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        adapter: str | None,
        sink: Callable[[list[SequenceUpdate] | BaseException], None],
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.adapter = adapter
        self.sink = sink
        self.priority = priority
        self.cancelled = False
        self.arrival = time.monotonic()


class _Sequence:
    """One choice of a request while it decodes."""

    def __init__(self, request: _Request, index: int, device: torch.device) -> None:
        self.request = request
        self.params = request.params
        self.index = index
        self.generator = make_generator(request.params.seed, index, device)
        self.output_ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.finished = False


class _Batch:
    """The running batch: sequences, their KV cache and where each one stands."""

    def __init__(self, seqs: list[_Sequence], cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor) -> None:
        self.seqs = seqs
        self.cache = cache
        self.mask = mask  # [B, T] 1 for real tokens, 0 for left padding
        self.positions = positions  # [B] position id of the next token to feed

    @property
    def adapters(self) -> list[str | None]:
        """The adapter of each row (None: the base), in row order."""
        return [s.request.adapter for s in self.seqs]


def _left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _cache_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values), [B, heads, T, dim]: what merging and pruning rows slice.

    Only attention layers with a plain key/value cache can be sliced by row and time; a model
    with other cache layers (linear attention, sliding windows kept elsewhere) is refused here
    rather than decoded wrongly.
    """
    tensors = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            raise TypeError(f"the engine needs a key/value cache in every layer, not {type(layer).__name__}")
        tensors.append((keys, values))
    return tensors


def _merge_caches(a: DynamicCache, b: DynamicCache, length: int) -> DynamicCache:
    """Stack two caches along the batch, left-padding the shorter one in time."""
    data = []
    for (ka, va), (kb, vb) in zip(_cache_tensors(a), _cache_tensors(b), strict=True):
        data.append(
            (
                torch.cat([_left_pad(ka, length, 2), _left_pad(kb, length, 2)]),
                torch.cat([_left_pad(va, length, 2), _left_pad(vb, length, 2)]),
            )
        )
    return DynamicCache(ddp_cache_data=data)


def _cache_rows(cache: DynamicCache, index: torch.Tensor, first: int = 0) -> DynamicCache:
    """Rows `index` of a cache (repeated rows copied), from time column `first` on."""
    data = [
        (k.index_select(0, index)[:, :, first:], v.index_select(0, index)[:, :, first:])
        for k, v in _cache_tensors(cache)
    ]
    return DynamicCache(ddp_cache_data=data)


def _distinct_prompts(seqs: list[_Sequence]) -> tuple[list[tuple[tuple[int, ...], str | None]], list[int]]:
    """The distinct (prompt, adapter) pairs of `seqs` in first-seen order, and for each sequence
    the index of its pair: row i of the batch is row `rows[i]` of the distinct prefill."""
    first: dict[tuple[tuple[int, ...], str | None], int] = {}
    rows = [first.setdefault((tuple(s.request.prompt_ids), s.request.adapter), len(first)) for s in seqs]
    return list(first), rows


@dataclass(frozen=True, eq=False)
class _Command:
    """An adapter change waiting for the engine thread (`GenerationEngine.call`)."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future
    adapter: str | None  # the one adapter it changes; None: it may change anything
    beside: Callable[[], bool] | None  # whether it leaves the other rows' model as it is, now

    def runs_beside(self, in_use: set[str | None]) -> bool:
        """Whether it may run between two decode steps of a batch whose rows use `in_use`."""
        return self.adapter is not None and self.adapter not in in_use and self.beside is not None and self.beside()


class GenerationEngine:
    """Batching generation over a transformers model whose adapters a LoraManager owns."""

    def __init__(
        self,
        lora: LoraManager,
        tokenizer: Any,
        device: torch.device,
        max_batch_size: int = 16,
        max_model_len: int = 8192,
    ) -> None:
        self.lora = lora
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.stats = EngineStats()
        self.eos_token_ids = self._eos_ids()
        # transformers renamed these keywords across versions; ask the model which it takes
        accepted = inspect.signature(lora.model.forward).parameters
        self._cache_kwarg = cache_keyword(lora.model.forward)
        self._logits_kwarg = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in accepted), None)
        self._cond = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._commands: deque[_Command] = deque()
        self._batch: _Batch | None = None
        self._stopping = False
        self._draining = False  # a command waits for the running batch: admit nothing new
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="apprentice-engine", daemon=True)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        config_eos = getattr(getattr(self.lora.model, "generation_config", None), "eos_token_id", None)
        for value in (config_eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        return ids

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    @property
    def num_running(self) -> int:
        """Sequences in the running batch (0 when idle)."""
        batch = self._batch
        return len(batch.seqs) if batch is not None else 0

    # ------------------------------------------------------------ API for the event loop

    async def call(
        self, fn: Callable[[], Any], *, adapter: str | None = None, beside: Callable[[], bool] | None = None
    ) -> Any:
        """Run `fn` on the engine thread between decode steps (adapter changes) and await it.

        Without `adapter` it waits for the running batch to drain. With it, `fn` changes only that
        adapter, and it runs at the next step boundary when no running sequence uses it and
        `beside()` (asked on the engine thread) says the change leaves the other rows' model as
        it is; otherwise it waits for the drain too."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._commands.append(_Command(fn, future, adapter, beside))
            self._cond.notify_all()
        return await asyncio.wrap_future(future)

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, adapter: str | None = None, priority: int = 0
    ) -> AsyncIterator[list[SequenceUpdate]]:
        """Yield each step's updates for this request until all its choices have finished."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[SequenceUpdate] | BaseException] = asyncio.Queue()

        def sink(item: list[SequenceUpdate] | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone (shutdown): nobody is listening
                pass

        request = _Request(f"req-{next(self._ids)}", prompt_ids, params, adapter, sink, priority)
        with self._cond:
            self._waiting.append(request)
            self._cond.notify_all()
        remaining = params.n
        try:
            while remaining:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                remaining -= sum(1 for update in item if update.finish_reason is not None)
                yield item
        finally:
            request.cancelled = True  # a client that went away stops using the batch

    # ------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while not (self._stopping or self._commands or self._waiting or self._batch):
                    self._cond.wait()
                if self._stopping:
                    break
                # Changing adapters under a running batch would change its outputs midway: let
                # it finish (nothing new joins it meanwhile) and run the commands afterwards.
                if self._batch is None:
                    commands = list(self._commands)
                else:
                    in_use = {seq.request.adapter for seq in self._batch.seqs}
                    commands = [command for command in self._commands if command.runs_beside(in_use)]
                for command in commands:
                    self._commands.remove(command)
                self._draining = bool(self._commands)
            for command in commands:
                self._run_command(command.fn, command.future)
            try:
                self._admit()
                if self._batch is not None:
                    self._step()
            except Exception as exc:  # never let one bad batch kill the server
                log.exception("generation failed")
                self._fail_batch(exc)
        stopped = RuntimeError("the engine stopped")
        self._fail_batch(stopped)
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        for request in waiting:
            request.sink(stopped)

    @staticmethod
    def _run_command(fn: Callable[[], Any], future: concurrent.futures.Future) -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    def _fail_batch(self, exc: BaseException) -> None:
        requests = {id(s.request): s.request for s in self._batch.seqs} if self._batch else {}
        self._batch = None
        for request in requests.values():
            request.sink(exc)

    # ------------------------------------------------------------ admission and prefill

    def _take_waiting(self) -> list[_Request]:
        """Waiting requests that may join now, whatever their adapter: oldest first, within the batch size.

        Most urgent first, then oldest first (see "Priority"). The first request that does not fit
        ends the turn, so younger (smaller) or less urgent requests never overtake it; a request
        larger than the whole batch (n > max_batch_size) runs alone.
        """
        with self._cond:
            if self._commands or self._draining:
                return []
            if any(request.cancelled for request in self._waiting):
                self._waiting = deque(request for request in self._waiting if not request.cancelled)
            room = self.max_batch_size - (len(self._batch.seqs) if self._batch else 0)
            # A less urgent request never joins a batch that runs more urgent ones.
            running = min((seq.request.priority for seq in self._batch.seqs), default=None) if self._batch else None
            taken: list[_Request] = []
            for request in sorted(self._waiting, key=lambda r: (r.priority, r.arrival)):
                if room <= 0 or (request.params.n > room and (taken or self._batch is not None)):
                    break
                if running is not None and request.priority > running:
                    break
                taken.append(request)
                room -= request.params.n
            for request in taken:
                self._waiting.remove(request)
            return taken

    def _abandon_less_urgent(self) -> None:
        """Abandon the running requests less urgent than the most urgent waiting one."""
        batch = self._batch
        if batch is None:
            return
        with self._cond:
            urgent = min((r.priority for r in self._waiting if not r.cancelled), default=None)
        if urgent is None:
            return
        victims = {id(s.request): s.request for s in batch.seqs if s.request.priority > urgent}
        for request in victims.values():
            request.cancelled = True
            self.stats.abandoned += 1
            request.sink(
                RequestAbandoned(f"abandoned for a request of priority {urgent} (its own: {request.priority})")
            )
        if victims:
            self._prune()

    def _admit(self) -> None:
        self._abandon_less_urgent()
        requests: list[_Request] = []
        for request in self._take_waiting():
            if request.adapter is not None and request.adapter not in self.lora.adapters:
                request.sink(UnknownAdapterError(request.adapter))  # unloaded while it waited
            else:
                requests.append(request)
        if not requests:
            return
        try:
            new = self._prefill(requests)
        except Exception as exc:  # fail the newcomers only; the running batch goes on
            log.exception("prefill failed")
            for request in requests:
                request.sink(exc)
            return
        self._batch = new if self._batch is None else self._merge(self._batch, new)
        self._prune()

    def _prefill(self, requests: list[_Request]) -> _Batch:
        """Run the prompts of newly admitted requests (n rows each) and sample their first tokens.

        Rows with the same prompt and adapter are run once and their cache rows and last logits
        copied (`_distinct_prompts`): a request's n choices, and a client's group of runs of one
        task sent at once. The prompt is most of the work on a CPU: 48 answers of 16 tokens to 8
        prompts sent 6 at a time spent 5.5 of their 10.5 s in prefills (SmolLM2-135M, 2 cores)."""
        seqs = [_Sequence(r, i, self.device) for r in requests for i in range(r.params.n)]
        distinct, rows = _distinct_prompts(seqs)
        length = max(len(prompt) for prompt, _ in distinct)
        input_ids = torch.full((len(distinct), length), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), length), dtype=torch.long)
        for row, (prompt, _) in enumerate(distinct):
            input_ids[row, length - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, length - len(prompt) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward([adapter for _, adapter in distinct], input_ids, mask, position_ids, cache)
        if len(distinct) < len(seqs):
            index = torch.tensor(rows, dtype=torch.long, device=self.device)
            cache = _cache_rows(cache, index)
            mask, logits = mask.index_select(0, index), logits.index_select(0, index)
        new = _Batch(seqs, cache, mask, mask.sum(-1))
        self.stats.prefills += 1
        self.stats.prefill_rows += len(distinct)
        self._sample_and_emit(new, logits)
        return new

    def _merge(self, old: _Batch, new: _Batch) -> _Batch:
        length = max(old.mask.shape[1], new.mask.shape[1])
        cache = _merge_caches(old.cache, new.cache, length)
        mask = torch.cat([_left_pad(old.mask, length, 1), _left_pad(new.mask, length, 1)])
        return _Batch(old.seqs + new.seqs, cache, mask, torch.cat([old.positions, new.positions]))

    # ------------------------------------------------------------ decoding

    def _step(self) -> None:
        batch = self._batch
        assert batch is not None
        last = torch.tensor([s.output_ids[-1] for s in batch.seqs], dtype=torch.long, device=self.device)
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.seqs), 1))], dim=1)
        logits = self._forward(
            batch.adapters, last.unsqueeze(-1), batch.mask, batch.positions.unsqueeze(-1), batch.cache
        )
        batch.positions = batch.positions + 1
        self._sample_and_emit(batch, logits)
        self._prune()

    def _forward(
        self,
        adapters: Sequence[str | None],
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """One forward pass, row i with `adapters[i]`, that extends `cache` in place; returns the last logits."""
        kwargs: dict[str, Any] = {self._cache_kwarg: cache, "use_cache": True}
        if self._logits_kwarg:
            kwargs[self._logits_kwarg] = 1  # the lm_head only where we sample
        if len(set(adapters)) > 1:
            self.stats.mixed_steps += 1
        with self.lora.activate_rows(adapters) as model:
            out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, **kwargs)
        return out.logits[:, -1, :]

    def _sample_and_emit(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Sample one token per sequence, check stop conditions and send each request its updates."""
        self.stats.steps += 1
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch.seqs))
        temperatures = torch.tensor(
            [s.params.temperature for s in batch.seqs], dtype=torch.float32, device=logits.device
        )
        logprobs = processed_logprobs(logits, temperatures)
        tokens = [sample_row(logprobs[row], s.params, s.generator) for row, s in enumerate(batch.seqs)]
        chosen = logprobs.gather(1, torch.tensor(tokens, device=logits.device).unsqueeze(-1)).squeeze(-1).tolist()
        updates: dict[int, list[SequenceUpdate]] = {}
        for row, seq in enumerate(batch.seqs):
            if seq.finished:
                continue
            token = tokens[row]
            entry = None
            if seq.params.logprobs:
                entry = TokenLogprob(token, chosen[row], top_logprobs(logprobs[row], seq.params.top_logprobs))
            update = self._advance(seq, token, entry)
            updates.setdefault(id(seq.request), []).append(update)
            self.stats.tokens += 1
        for seq in batch.seqs:
            batch_updates = updates.pop(id(seq.request), None)
            if batch_updates:
                seq.request.sink(batch_updates)

    def _advance(self, seq: _Sequence, token: int, entry: TokenLogprob | None) -> SequenceUpdate:
        """Append a token to a sequence and work out its new text and whether it is done."""
        params = seq.params
        seq.output_ids.append(token)
        finish_reason: str | None = None
        stop_reason: int | str | None = None
        if token in params.stop_token_ids:
            finish_reason, stop_reason = "stop", token
        elif token in self.eos_token_ids and not params.ignore_eos:
            finish_reason = "stop"
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=params.skip_special_tokens)
        if finish_reason is None and params.stop:
            start = max(0, len(seq.text) - max(len(s) for s in params.stop))
            hits = [(text.find(s, start), s) for s in params.stop]
            hits = [(at, s) for at, s in hits if at >= 0]
            if hits:
                at, stop = min(hits)
                text = text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
                finish_reason, stop_reason = "stop", stop
        if finish_reason is None and (
            len(seq.output_ids) >= params.max_tokens
            or len(seq.request.prompt_ids) + len(seq.output_ids) >= self.max_model_len
        ):
            finish_reason = "length"
        seq.text = text
        if finish_reason is not None or seq.request.cancelled:
            seq.finished = True
            end = len(text)
        else:
            # hold back what may still turn into a stop string or a multi-byte character
            end = len(text) - (max(len(s) for s in params.stop) - 1 if params.stop else 0)
            while end > seq.emitted and text[end - 1] == "\ufffd":
                end -= 1
        delta = text[seq.emitted : max(end, seq.emitted)]
        seq.emitted = max(end, seq.emitted)
        return SequenceUpdate(seq.index, [token], delta, [entry] if entry else [], finish_reason, stop_reason)

    def _prune(self) -> None:
        """Drop finished (or abandoned) sequences and the padding columns nobody needs any more."""
        batch = self._batch
        if batch is None:
            return
        keep = [row for row, s in enumerate(batch.seqs) if not s.finished and not s.request.cancelled]
        if not keep:
            self._batch = None
            return
        if len(keep) == len(batch.seqs):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = batch.mask.index_select(0, index)
        first = int((mask.sum(0) > 0).nonzero()[0].item())  # leading columns that are padding for all
        self._batch = _Batch(
            [batch.seqs[r] for r in keep],
            _cache_rows(batch.cache, index, first),
            mask[:, first:],
            batch.positions.index_select(0, index),
        )
