"""The server's scheduler: one thread owns the model's sessions and runs one evaluation per step.

Each step is one batch (``model.eval_batch``): the next token of every running request, and
prompt tokens of the requests still reading theirs (``Scheduler._plan`` has the rules). So N
requests in flight read the weights once per step between them; short prompts that arrive
together are read together (their first tokens come in the same step); and a long prompt goes in
chunks between the others' tokens instead of stalling them for its whole prefill. The prompt
tokens a step may carry beside decoding tokens, long prompts' and short ones' alike, are at most
``prefill_chunk`` and, with ``step_latency``, as many as keep the step within that multiple of a
step of the decoding tokens alone (``StepBudget``, which learns both costs from the steps'
times). When nothing else runs, a long prompt goes in chunks of ``n_batch``, the evaluation's own
step.

A request waits (FIFO) until a slot is free: a slot is a session of the model (``fork_session``)
with its own KV cache, and a request takes the free slot whose cache holds the longest prefix of
its prompt, which it then does not evaluate again (``Model._keep_prefix``). Its sampler, stop
strings and residual policy are its own; the slot's policy goes back to the server's afterwards.

Cancellation (a client that went away: ``job.cancel`` set) is seen at the start of every step, so
a request stops between two chunks of its prompt or before its next token, and its slot is free
for the next step.

Every architecture batches, multi-head latent attention (deepseek2) and the hybrids'
linear-attention layers (qwen35moe, qwen3next) included: those run per sequence on each session's
own latent cache or recurrent states inside the one evaluation, on the CPU or a device. Where
several sequences cannot share one evaluation (``rm_batch_eval`` refuses it), each sequence of a
step is evaluated on its own session in turn: the same tokens and results, without the shared
reads.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from . import chat
from .errors import (InternalError, InvalidArgumentError, NeedsCPUError, RapidMoEError, UnavailableError,
                     UnsupportedError)
from .model import Model, TextStream, eval_batch
from .sampling import Sampler, logprobs_shape

log = logging.getLogger("rapidmoe.server")

DEFAULT_PREFILL_CHUNK = 64   # prompt tokens per step while other requests decode (cli.py's help says 64)
DEFAULT_STEP_LATENCY = 2.5   # a step with prompt tokens: at most this many times one of the decoding tokens alone


class StepBudget:
    """How many prompt tokens a step may carry beside the decoding tokens of the running requests.

    ``latency`` None: ``chunk`` always. ``latency`` f: from the times of the steps (``observe``) it
    keeps what a step of n decoding tokens alone takes (t_d, per n) and what each prompt token
    adds to a step (c), and gives the prompt tokens that keep a step within f * t_d:
    (f - 1) * t_d / c, at least 1, at most ``chunk``.

    - t_d: the least of the latest TIMINGS steps of n decoding tokens alone (other work on the
      machine only adds time, and a slow timing would widen every step's bound until the next).
      For an n not timed yet, the t_d of the largest smaller n timed (more tokens take longer, so
      the bound stays); with none,
      0 prompt tokens (a step of the decoding tokens alone, to time). Every REPROBE steps with
      prompt tokens, 0 again: t_d grows with the decoding requests' contexts.
    - c: it grows as a prompt's context grows (each token's attention reads all of it), and a
      step's time varies, so a step that costs more per prompt token than c sets c at once, and
      one that costs less brings it down by halves: a step over its bound costs every decoding
      request a late token, one under it only a slower prompt. Until a step with prompt tokens
      has been timed, PROBE tokens (a full chunk at a long context can take many decoding
      steps' time)."""

    SMOOTH = 0.5          # weight of the newest step in the per-token cost's average
    TIMINGS = 4           # steps of the decoding tokens alone that t_d is the least of
    REPROBE = 32          # steps with prompt tokens between two timings of the decoding tokens alone
    PROBE = 8             # prompt tokens beside decoding ones before their cost is known

    def __init__(self, chunk: int, latency: float | None = None):
        if chunk < 1:
            raise InvalidArgumentError(f"prefill_chunk must be >= 1, got {chunk}")
        if latency is not None and not latency > 1:
            raise InvalidArgumentError(f"step_latency must be > 1 (a multiple of a decoding step's time), got {latency}")
        self.chunk, self.latency = chunk, latency
        self.t_decode: dict[int, float] = {}  # decoding tokens: seconds, a step of them alone
        self._timings: dict[int, collections.deque] = {}   # and its latest TIMINGS times
        self.per_token: float | None = None   # seconds a prompt token adds to a step
        self.since_decode = 0                 # steps with prompt tokens since the last without

    def decode_time(self, n_decode: int) -> float | None:
        """t_d for n_decode tokens: timed, or the largest smaller count's; None: neither."""
        if n_decode in self.t_decode:
            return self.t_decode[n_decode]
        below = [n for n in self.t_decode if n < n_decode]
        return self.t_decode[max(below)] if below else None

    def observe(self, n_decode: int, n_prompt: int, seconds: float) -> None:
        """A step of n_decode decoding tokens and n_prompt prompt tokens took seconds."""
        a = self.SMOOTH
        if n_decode == 0:
            return                            # a prompt alone: nobody waited on it
        if n_prompt == 0:
            times = self._timings.setdefault(n_decode, collections.deque(maxlen=self.TIMINGS))
            times.append(seconds)
            self.t_decode[n_decode] = min(times)
            self.since_decode = 0
            return
        self.since_decode += 1
        t_d = self.decode_time(n_decode)
        if t_d is not None:
            c = max(seconds - t_d, 0.0) / n_prompt
            rise = self.per_token is None or c > self.per_token
            self.per_token = c if rise else a * c + (1 - a) * self.per_token

    def prompt_tokens(self, n_decode: int) -> int:
        """Prompt tokens for the next step, which has n_decode (> 0) decoding tokens."""
        if self.latency is None:
            return self.chunk
        t_d = self.decode_time(n_decode)
        if t_d is None or self.since_decode >= self.REPROBE:
            return 0
        if not self.per_token:            # none seen, or steps that took no longer than t_d
            return min(self.chunk, self.PROBE)
        return int(max(1, min(self.chunk, (self.latency - 1) * t_d / self.per_token)))


@dataclasses.dataclass
class End:
    """The last event of a job."""

    usage: dict | None = None
    error: BaseException | None = None
    cancelled: bool = False
    stop: str | None = None       # the stop string that ended the reply, if one did


class Job(Protocol):
    """What the scheduler needs of a request (server._Job)."""

    req: Any                      # server.GenRequest
    cancel: threading.Event       # set: stop at the next step
    slot: int | None


class Observer:
    """Hooks for metrics; the default does nothing. Called from the scheduler's thread."""

    def queued(self, n_waiting: int, n_running: int) -> None: ...
    def first_token(self, seconds: float) -> None: ...
    def token_gap(self, seconds: float) -> None: ...
    def step(self, n_tokens: int, n_seqs: int, kv_tokens: int) -> None: ...
    def left_waiting(self) -> None: ...
    def finished(self, status: str, prompt_tokens: int, evaluated: int, completion_tokens: int,
                 stats: dict | None) -> None: ...


class _Seq:
    """A request on its slot: its prompt still to evaluate, its sampler and its text so far."""

    def __init__(self, job: Job, slot: Model, post: Callable[[Any], None], name: str, arrived: float):
        req = job.req
        self.job, self.slot, self.post, self.req = job, slot, post, req
        self.sampler = Sampler(req.sampling, req.logit_bias,
                               req.grammar.constraint() if getattr(req, "grammar", None) is not None else None)
        self.n_top = req.logprobs                 # None: no logprobs, and none computed
        self.shape = None if self.n_top is None else logprobs_shape(req.kind, slot.tokenizer, req.text_offset)
        self.history = list(req.prompt_ids)
        keep = self.cached = slot._keep_prefix(self.history)
        self.rest = np.asarray(req.prompt_ids[keep:], dtype=np.int32)   # prompt tokens to evaluate
        self.done = 0                             # of them, evaluated
        # where the slot checkpoints on the way (a hybrid model; Model._prompt_marks), in rest
        self.marks = [m - keep for m in slot._prompt_marks(keep, len(req.prompt_ids))]
        self.next_token: int | None = None        # sampled, to evaluate in the next step
        self.n_gen = 0
        self.text = TextStream(slot.tokenizer, req.stop)
        self.chat = chat.ChatChunks(chat.HarmonyChannels() if req.harmony else None,
                                    req.show_reasoning, req.tools, getattr(req, "thinking", None)) \
            if req.kind == "chat" else None
        self.head = {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                     "model": name}
        self.arrived, self.last = arrived, None

    @property
    def prefilling(self) -> bool:
        return self.done < self.rest.size

    @property
    def left(self) -> int:
        """Prompt tokens still to evaluate."""
        return self.rest.size - self.done

    def take(self, n: int) -> list[int]:
        """The next n prompt tokens, fewer where the slot checkpoints before them."""
        stop = next((m for m in self.marks if m > self.done), self.rest.size)
        return self.rest[self.done:min(self.done + n, stop)].tolist()

    def emit(self, text: str, finish_reason: str | None = None, tokens: list | None = None) -> None:
        """Sends text, with the logprobs of ``tokens`` (TextStream.released: the tokens it completes)."""
        logprobs = self.shape(tokens) if tokens else None
        chunk = {**self.head, "choices": [{"text": text, "index": 0, "logprobs": logprobs,
                                           "finish_reason": finish_reason}]}
        for c in self.chat.feed(chunk) if self.chat is not None else [chunk]:
            self.post(c)

    def usage(self) -> dict:
        n = len(self.req.prompt_ids)
        return {"prompt_tokens": n, "completion_tokens": self.n_gen, "total_tokens": n + self.n_gen,
                "prompt_tokens_details": {"cached_tokens": self.cached}}   # OpenAI's: the prompt's reused prefix


class Scheduler:
    """Runs the requests given to ``submit`` on ``slots`` (sessions of one model, the first the
    model itself; each with the same n_ctx), in a thread of its own. A slot goes back to the
    first slot's residual policy and budget (as they are now) after a request that chose its own.
    ``observer`` receives the counts and timings (the server's statistics and metrics).
    ``prefill_chunk`` and ``step_latency``: the prompt tokens a step may carry (StepBudget)."""

    SHORT_PROMPT_TOKENS = 8   # prompt tokens a step carries at least while the oldest prompt is short

    def __init__(self, slots: Sequence[Model], name: str, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 observer: Observer | None = None, step_latency: float | None = None):
        self.step_budget = StepBudget(prefill_chunk, step_latency)
        self.slots, self.name, self.prefill_chunk = list(slots), name, prefill_chunk
        self.observer = observer or Observer()
        m = self.slots[0]
        self.policy, self.budget = m.residual_policy, m.residual_budget
        self.batched = len(self.slots) > 1
        self.free: queue.Queue = queue.Queue()    # slot indices, in the order they were freed
        for i in range(len(self.slots)):
            self.free.put_nowait(i)
        self._inbox: collections.deque = collections.deque()   # (job, post, arrived), not yet seen by the thread
        self._waiting: collections.deque = collections.deque()
        self._running: list[_Seq] = []           # in the order they took their slots
        self._slot_tasks: list = []              # (slot, fn, future): slot_task's, waiting for their slot
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="rapidmoe-scheduler", daemon=True)
        self._thread.start()

    # -- from other threads ------------------------------------------------------------------------

    def submit(self, job: Job, post: Callable[[Any], None]) -> None:
        """Queues job; ``post`` (thread-safe) receives its chunks, then one End (at once, cancelled,
        once the scheduler is closing)."""
        with self._cv:
            stopped = self._stop
            if not stopped:
                self._inbox.append((job, post, time.perf_counter()))
                self._cv.notify()
        if stopped:
            post(End(cancelled=True))

    def slot_task(self, slot: int, fn: Callable[[Model], Any]) -> concurrent.futures.Future:
        """Runs ``fn(model)`` on slot ``slot`` in the scheduler's thread once the slot is free (before
        a waiting request may take it), with the slot held meanwhile; the future has its result or
        its exception (UnavailableError when the scheduler closes first)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if not 0 <= slot < len(self.slots):
            fut.set_exception(InvalidArgumentError(f"no slot {slot}: the slots are 0 to {len(self.slots) - 1}"))
            return fut
        with self._cv:
            stopped = self._stop
            if not stopped:
                self._slot_tasks.append((slot, fn, fut))
                self._cv.notify()
        if stopped:
            fut.set_exception(UnavailableError("the server is shutting down"))
        return fut

    def _run_slot_tasks(self) -> None:
        with self._cv:
            tasks, self._slot_tasks = self._slot_tasks, []
        if not tasks:
            return
        free = []
        while not self.free.empty():
            free.append(self.free.get_nowait())
        later = []
        for slot, fn, fut in tasks:
            if slot not in free:                 # busy: after the request that holds it
                later.append((slot, fn, fut))
            elif fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.slots[slot]))
                except BaseException as exc:     # the caller's to answer
                    fut.set_exception(exc)
        for i in free:                           # back in their order
            self.free.put_nowait(i)
        with self._cv:
            self._slot_tasks[:0] = later

    def wake(self) -> None:
        """Makes an idle loop look at its jobs again (a cancel flag was set)."""
        with self._cv:
            self._cv.notify()

    @property
    def n_running(self) -> int:
        return len(self.slots) - self.free.qsize()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join()

    def pick_slot(self, prompt_ids: Sequence[int], first: int) -> int:
        """Of the free slots (first, just taken, and any others free now), the one whose cache
        holds the longest prefix of the prompt (the earliest freed among equals); the others go
        back in their order."""
        free = [first]
        while not self.free.empty():
            free.append(self.free.get_nowait())
        best = max(free, key=lambda i: (self.slots[i]._reusable(prompt_ids), -free.index(i)))
        for i in free:
            if i != best:
                self.free.put_nowait(i)
        return best

    # -- the loop ------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._stop or self._inbox or self._waiting or self._running or self._slot_tasks):
                    self._cv.wait()
                if self._stop:
                    break
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            try:
                self._run_slot_tasks()
                self._step()
            except Exception:                    # pragma: no cover - a bug: fail the requests, keep serving
                log.exception("scheduler step failed")
                for s in list(self._running):
                    try:                         # a failure here must not end the loop for everyone else
                        self._finish(s, End(error=InternalError("internal error in the scheduler")))
                    except Exception:
                        log.exception("scheduler: a request could not be ended")
                        with contextlib.suppress(ValueError):
                            self._running.remove(s)
        with self._cv:                           # jobs submitted while closing are ended too
            left = list(self._waiting) + list(self._inbox)
            self._inbox.clear()
            tasks, self._slot_tasks = self._slot_tasks, []
        for _, _, fut in tasks:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(UnavailableError("the server is shutting down"))
        with contextlib.suppress(RuntimeError):  # the server's event loop may be gone already
            for s in list(self._running):
                self._finish(s, End(cancelled=True))
            for job, post, _ in left:
                post(End(cancelled=True))

    def _step(self) -> None:
        self._drop_cancelled()
        self._start_waiting()
        self.observer.queued(len(self._waiting), len(self._running))
        work = self._plan()
        if not work:
            self.observer.queued(len(self._waiting), len(self._running))
            return
        t0 = time.perf_counter()
        results = self._eval(work)
        n_decode = sum(1 for s, _ in work if not s.prefilling)
        self.step_budget.observe(n_decode, sum(len(t) for _, t in work) - n_decode, time.perf_counter() - t0)
        self.observer.step(sum(len(t) for _, t in work), len(work), sum(m.n_past for m in self.slots))
        for (s, toks), got in zip(work, results):
            if isinstance(got, BaseException):
                self._finish(s, End(error=got))
                continue
            if s.prefilling:
                s.done += len(toks)
                if s.prefilling:
                    if s.done in s.marks:
                        s.slot._checkpoint()
                    continue
                s.slot._checkpoint()             # the prompt's end: the next turn goes back to it
            self._next_token(s, got)
        self.observer.queued(len(self._waiting), len(self._running))

    def _plan(self) -> list[tuple[_Seq, list[int]]]:
        """The step's batch: the next token of every decoding request, then prompt tokens of the
        requests still reading theirs, oldest first, under the step's prompt budget.

        - Others decode: ``step_budget.prompt_tokens`` prompt tokens (``prefill_chunk``, fewer with
          ``step_latency``; none in a step it times), shared in arrival order (a prompt may end
          its share mid-way); while the oldest prompt being read is no longer than
          ``prefill_chunk``, at least SHORT_PROMPT_TOKENS (its first token comes within a few
          steps even when a slow step has made a prompt token look dear).
        - Nothing decodes: the oldest prompt, and the whole prompts after it while all of them
          together fit in ``prefill_chunk`` and ``n_batch`` (short prompts start together); a
          prompt longer than that goes alone, in chunks of ``n_batch``."""
        work = [(s, [s.next_token]) for s in self._running if not s.prefilling]
        reading = [s for s in self._running if s.prefilling]
        if not reading:
            return work
        n_batch = reading[0].slot.n_batch
        if not work:
            first, room = reading[0], min(self.prefill_chunk, n_batch)
            if first.left > room:
                return [(first, first.take(n_batch))]
            for s in reading:
                if s.left > room:
                    break
                work.append((s, s.take(s.left)))
                room -= len(work[-1][1])
            return work
        budget = self.step_budget.prompt_tokens(len(work))
        if budget and reading[0].rest.size <= self.prefill_chunk:   # a short prompt starts within a few steps
            budget = max(budget, self.SHORT_PROMPT_TOKENS)
        room = min(max(1, min(self.prefill_chunk, n_batch - len(work))), budget)
        for s in reading:
            if room == 0:
                break
            work.append((s, s.take(min(s.left, room))))
            room -= len(work[-1][1])
        return work

    def _drop_cancelled(self) -> None:
        for item in [w for w in self._waiting if w[0].cancel.is_set()]:
            self._waiting.remove(item)
            self.observer.left_waiting()
            item[1](End(cancelled=True))
        for s in [s for s in self._running if s.job.cancel.is_set()]:
            self._finish(s, End(cancelled=True, usage=s.usage()))

    def _start_waiting(self) -> None:
        while self._waiting and not self.free.empty():
            job, post, arrived = self._waiting.popleft()
            job.slot = self.pick_slot(job.req.prompt_ids, self.free.get_nowait())
            slot = self.slots[job.slot]
            try:
                if slot.residual_path is not None:
                    # Set for every request: a request's own policy, or the server's back. The
                    # controllers step per position of the sequence (policy.h), so a request's
                    # residual decisions do not depend on what its slot served before.
                    slot.set_residual(job.req.policy or self.policy,
                                      self.budget if job.req.budget is None else job.req.budget)
                slot.clear_stats()
                s = _Seq(job, slot, post, self.name, arrived)
            except Exception as exc:             # this request's settings: the others go on
                self._release(job.slot)
                post(End(error=exc))
                continue
            self._running.append(s)

    def _eval(self, work: list[tuple[_Seq, list[int]]]) -> list:
        """Each sequence's last logits (or the exception its evaluation raised)."""
        if self.batched and len(work) > 1:
            try:
                return eval_batch([(s.slot, toks) for s, toks in work])
            except (UnsupportedError, NeedsCPUError) as exc:   # nothing was evaluated
                log.warning("batches of sequences are not possible here (%s); evaluating them one by one", exc)
                self.batched = False
            except RapidMoEError:                # find the sequence at fault: each alone, the caches as before
                pass
        out = []
        for s, toks in work:
            try:
                out.append(s.slot.eval(toks))
            except Exception as exc:
                out.append(exc)
        return out

    def _next_token(self, s: _Seq, logits: np.ndarray) -> None:
        """Samples s's next token from logits and sends the text it completes; ends s at an
        end-of-generation token, a stop string, max_tokens or a full context."""
        if s.n_gen >= s.req.max_tokens:          # max_tokens 0: the prompt only
            self._finish(s, End(usage=s.usage()), "length")
            return
        now = time.perf_counter()
        t = s.sampler.sample(logits, s.history)
        if t in s.slot.tokenizer.eog_ids:
            self._finish(s, End(usage=s.usage()), "stop")
            return
        # Only a request that asked pays for its logprobs: one pass over the vocabulary, its own
        # logits (a row of the step's batch that no other request reads).
        logprob = s.sampler.logprob(logits, t, s.n_top) if s.n_top is not None else None
        s.history.append(t)
        s.n_gen += 1
        if s.last is None:
            self.observer.first_token(now - s.arrived)
        else:
            self.observer.token_gap(now - s.last)
        s.last = now
        piece = s.text.feed(t, logprob)
        if piece is not None:
            s.emit(piece, tokens=s.text.released())
        if s.text.stopped:
            self._finish(s, End(usage=s.usage(), stop=s.text.stop_hit), "stop", flush=False)
        elif s.n_gen >= s.req.max_tokens:
            self._finish(s, End(usage=s.usage()), "length")
        elif s.slot.n_past + 1 > s.slot.n_ctx:
            self._finish(s, End(usage=s.usage()), "stop")
        else:
            s.next_token = t

    def _finish(self, s: _Seq, end: End, finish_reason: str | None = None, flush: bool = True) -> None:
        """Ends s: its last text and finish reason (unless it failed or was cancelled), its End,
        the statistics, and its slot back to the server's residual policy and to the free ones."""
        if finish_reason is not None:
            rest = s.text.flush() if flush else ""
            left = s.text.released()
            if rest or left:
                s.emit(rest, tokens=left)
            s.emit("", finish_reason)
        self._running.remove(s)
        stats = None
        try:
            stats = s.slot.stats()
            if s.slot.residual_path is not None and (s.slot.residual_policy, s.slot.residual_budget) != \
                    (self.policy, self.budget):
                s.slot.set_residual(self.policy, self.budget)
        except Exception:                        # pragma: no cover - a closed model at shutdown
            log.exception("slot %d: could not read its statistics or restore its residual policy", s.job.slot)
        status = "error" if end.error is not None else "cancelled" if end.cancelled else "ok"
        self.observer.finished(status, len(s.req.prompt_ids), s.done, s.n_gen, stats)
        self._release(s.job.slot)
        s.post(end)

    def _release(self, slot: int) -> None:
        self.free.put_nowait(slot)
