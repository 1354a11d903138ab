"""The server's scheduler (rapidmoe_gguf.scheduler): one evaluation per step for every running
request, prompts in chunks between the others' tokens, cancellation between chunks, queueing
beyond the slots, and a failing request that leaves the others alone.

Oracle: each request generated alone by the Python API (Model.create_completion) on a Model of
its own. The runtime keeps a token's arithmetic independent of the batch it is in (test_batch), so
greedy requests served together must give exactly the text, tokens and finish reasons they give
alone."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import server as srv
from rapidmoe_gguf.errors import RapidMoEError
from rapidmoe_gguf.scheduler import End, Observer, Scheduler, StepBudget
from conftest import VOCAB
from test_server import BAD, MESSAGES, gguf, running, sse  # noqa: F401  (gguf is a fixture)

GREEDY = rm.SamplingParams(temperature=0)


def ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def request(prompt_ids, max_tokens, stop=(), policy=None, sampling=GREEDY) -> srv.GenRequest:
    return srv.GenRequest("completion", list(prompt_ids), max_tokens, sampling, list(stop), False, False, policy, None)


class Job:
    def __init__(self, req):
        self.req, self.cancel, self.slot = req, threading.Event(), None
        self.items, self.done = [], threading.Event()

    def __call__(self, item):                     # the scheduler's post
        self.items.append(item)
        if isinstance(item, End):
            self.done.set()

    def result(self, timeout=60):
        assert self.done.wait(timeout), "the request did not end"
        end = self.items[-1]
        chunks = self.items[:-1]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        finish = chunks[-1]["choices"][0]["finish_reason"] if chunks else None
        return text, finish, end


class Steps(Observer):
    def __init__(self):
        self.steps, self.waiting = [], []

    def step(self, n_tokens, n_seqs, kv_tokens):
        self.steps.append((n_tokens, n_seqs))

    def queued(self, n_waiting, n_running):
        self.waiting.append(n_waiting)


def alone(path, req: srv.GenRequest, **model_kw):
    with rm.Model(path, n_threads=2, **model_kw) as m:
        if req.policy is not None:
            m.set_residual(req.policy)
        r = m.create_completion(req.prompt_ids, max_tokens=req.max_tokens, temperature=0, stop=req.stop)
    return r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]


def serve_jobs(model, n_slots, reqs, prefill_chunk=8, together=True, step_latency=None):
    """Runs reqs on a Scheduler over model and n_slots - 1 forks; returns the jobs and the steps."""
    obs = Steps()
    sched = Scheduler([model] + [model.fork_session() for _ in range(n_slots - 1)], "m", prefill_chunk, obs,
                      step_latency=step_latency)
    jobs = [Job(r) for r in reqs]
    try:
        with sched._cv:                            # all arrive before the first step
            for j in jobs:
                sched.submit(j, j)
        for j in jobs:
            j.result()
    finally:
        sched.close()
    return jobs, obs, sched


def test_scheduler_requests_served_together_equal_each_alone(gguf):
    """Six greedy requests on four slots (two wait): prompts of 1 to 40 tokens, 0 to 20 new
    tokens, one with a stop string, one with its own residual policy (none, beside the server's
    all). Steps carry several sequences, and a prompt chunk is at most 8 tokens beside others."""
    stop_text = alone(gguf, request(ids(9, 3), 12), n_ctx=128)[0][2:4]
    assert len(stop_text) == 2
    reqs = [request(ids(17, 1), 20), request(ids(1, 2), 8), request(ids(9, 3), 12, stop=[stop_text]),
            request(ids(40, 4), 5, policy="none"), request(ids(5, 5), 0), request(ids(23, 6), 16)]
    m = rm.Model(gguf, n_ctx=128, n_threads=2)
    with m:
        jobs, obs, sched = serve_jobs(m, 4, reqs)
        assert sched.batched
        assert [s.residual_policy for s in sched.slots] == ["all"] * 4   # restored after the request
    for req, job in zip(reqs, jobs):
        text, finish, end = job.result()
        want_text, want_finish, want_usage = alone(gguf, req, n_ctx=128)
        assert (text, finish, end.usage) == (want_text, want_finish, want_usage)
        assert end.error is None and not end.cancelled
    assert jobs[2].result()[1] == "stop" and stop_text not in jobs[2].result()[0]
    assert max(n for n, _ in obs.steps) > 3 and max(s for _, s in obs.steps) >= 3
    assert max(obs.waiting) == 2
    assert all(n <= 8 + s - 1 for n, s in obs.steps if s > 1)   # one chunk of <= 8, one token per other


def test_scheduler_long_prompt_goes_in_chunks_between_tokens(gguf):
    """A 200-token prompt arrives beside a decoding request: every step then is that request's
    token and at most 16 prompt tokens, so the decoding request goes on while the prompt is read."""
    m = rm.Model(gguf, n_ctx=512, n_threads=2)
    m.tokenizer.eog_ids = frozenset()
    short, long_ = request(ids(6, 7), 40), request(ids(200, 8), 6)
    with m:
        jobs, obs, _ = serve_jobs(m, 2, [short, long_], prefill_chunk=16)
    assert obs.steps[0] == (6, 1)                       # the first prompt alone, in one step
    chunks = [n - 1 for n, s in obs.steps[1:] if s == 2 and n > 2]
    assert sum(chunks) == 200 and max(chunks) == 16   # the last chunk gives the first token
    for req, job in zip((short, long_), jobs):
        with rm.Model(gguf, n_ctx=512, n_threads=2) as ref:
            ref.tokenizer.eog_ids = frozenset()
            want = ref.create_completion(req.prompt_ids, max_tokens=req.max_tokens, temperature=0)
        text, finish, end = job.result()
        assert (text, finish, end.usage) == (want["choices"][0]["text"], "length", want["usage"])


def want_alone(path, req, n_ctx):
    with rm.Model(path, n_ctx=n_ctx, n_threads=2) as ref:
        ref.tokenizer.eog_ids = frozenset()
        r = ref.create_completion(req.prompt_ids, max_tokens=req.max_tokens, temperature=0)
    return r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]


def test_scheduler_short_prompts_that_arrive_together_start_together(gguf):
    """Four prompts of 5, 6, 4 and 7 tokens arrive on an idle scheduler (chunk 16): the first step
    reads the first three whole (15 tokens; the fourth would pass 16), so their first tokens come
    together; the next step is their three tokens and the fourth prompt."""
    m = rm.Model(gguf, n_ctx=128, n_threads=2)
    m.tokenizer.eog_ids = frozenset()
    reqs = [request(ids(n, 20 + n), 6) for n in (5, 6, 4, 7)]
    with m:
        jobs, obs, _ = serve_jobs(m, 4, reqs, prefill_chunk=16)
    assert obs.steps[:3] == [(15, 3), (3 + 7, 4), (4, 4)]
    for req, job in zip(reqs, jobs):
        text, finish, end = job.result()
        assert (text, finish, end.usage) == want_alone(gguf, req, 128)


def test_scheduler_prompts_together_stay_within_n_batch(gguf):
    """n_batch 8 under a chunk of 16: prompts of 3, 4 and 5 tokens on an idle scheduler go 3 + 4
    (the 5 would pass 8), then the 5 beside the two decoding tokens."""
    m = rm.Model(gguf, n_ctx=128, n_threads=2, n_batch=8)
    m.tokenizer.eog_ids = frozenset()
    reqs = [request(ids(n, 40 + n), 4) for n in (3, 4, 5)]
    with m:
        jobs, obs, _ = serve_jobs(m, 3, reqs, prefill_chunk=16)
    assert obs.steps[:2] == [(7, 2), (2 + 5, 3)]
    for req, job in zip(reqs, jobs):
        text, finish, end = job.result()
        assert (text, finish, end.usage) == want_alone(gguf, req, 128)


def short_prompts_beside_a_decoding_request(gguf, budget=None):
    """While one request decodes, three 10-token prompts arrive together (chunk 16); with budget
    (a stand-in for the StepBudget) the scheduler asks it for each step's prompt tokens. Returns
    the steps from the first that saw the prompts, and each request's result and its text alone."""
    m = rm.Model(gguf, n_ctx=128, n_threads=2)
    m.tokenizer.eog_ids = frozenset()
    # the first request decodes long enough to be still decoding when the prompts arrive, even
    # when this thread gets the core late (the model's worker spins between products)
    first, later = request(ids(3, 30), 100), [request(ids(10, 31 + i), 5) for i in range(3)]
    obs = Steps()
    with m:
        sched = Scheduler([m] + [m.fork_session() for _ in range(3)], "m", 16, obs)
        if budget is not None:
            sched.step_budget = budget
        try:
            j0 = Job(first)
            sched.submit(j0, j0)
            while len(j0.items) < 2:
                time.sleep(0.001)
            jobs = [Job(r) for r in later]
            with sched._cv:
                for j in jobs:
                    sched.submit(j, j)
                k = len(obs.steps)
                assert not j0.done.is_set(), "the first request ended before the prompts came"
            results = [j.result() for j in [j0] + jobs]
        finally:
            sched.close()
    for req, (text, finish, end) in zip([first] + later, results):
        assert (text, finish, end.usage) == want_alone(gguf, req, 128)
    return obs.steps[k:]


def test_scheduler_prompts_share_the_step_budget_beside_decoding(gguf):
    """Without a latency bound the steps read the prompts oldest first, 16 prompt tokens a step, a
    prompt split where the budget ends: 10 + 6, then 4 + 10 beside the then two decoding
    requests."""
    steps = short_prompts_beside_a_decoding_request(gguf)
    i = next(i for i in range(len(steps)) if steps[i][1] > 1)   # a step may have been under way
    assert steps[i:i + 2] == [(1 + 16, 3), (2 + 14, 4)]


class FixedBudget:
    """A StepBudget that gives the prompt tokens it is told (then `rest`) and records the steps."""

    def __init__(self, tokens, rest):
        self.tokens, self.rest, self.asked, self.seen = list(tokens), rest, [], []

    def prompt_tokens(self, n_decode):
        self.asked.append(n_decode)
        return self.tokens.pop(0) if self.tokens else self.rest

    def observe(self, n_decode, n_prompt, seconds):
        if self.asked:
            self.seen.append((n_decode, n_prompt))


def test_scheduler_short_prompts_beside_decoding_take_the_step_budget(gguf):
    """Short prompts beside decoding tokens are bounded as long ones are: each step carries the
    prompt tokens the budget gives for its count of decoding tokens, none in a step it times
    (0), and a prompt that ends gives its first token and decodes in the next step."""
    budget = FixedBudget([0, 9], 12)
    short_prompts_beside_a_decoding_request(gguf, budget)
    assert budget.seen[:4] == [(1, 0), (1, 9), (1, 1 + 10 + 1), (3, 9)]
    assert budget.asked == [1, 1, 1, 3]


def test_scheduler_short_prompts_take_at_least_a_few_tokens_a_step(gguf):
    """A budget below SHORT_PROMPT_TOKENS (8) while the oldest prompt is short gives 8, so a short
    prompt starts within a few steps; 0 (a step to time) stays 0, and more than the chunk is the
    chunk (16)."""
    assert Scheduler.SHORT_PROMPT_TOKENS == 8
    budget = FixedBudget([0, 2, 3], 20)
    short_prompts_beside_a_decoding_request(gguf, budget)
    assert budget.seen[:4] == [(1, 0), (1, 8), (1, 2 + 6), (2, 4 + 10)]
    assert budget.asked == [1, 1, 1, 2]


def test_step_budget_keeps_a_step_within_its_latency_multiple():
    """StepBudget on given step times: 0 (a step to time) until it has timed the decoding tokens
    alone (per count of them; a larger count borrows a smaller one's time), PROBE tokens until it
    has timed prompt tokens, then (f - 1) * t_decode / per-token cost, between 1 and the chunk;
    a dearer per-token cost counts at once, a cheaper one by halves; a new timing every REPROBE
    steps, t_decode the least of the latest TIMINGS."""
    assert StepBudget(64).prompt_tokens(4) == 64
    b = StepBudget(64)
    b.observe(4, 0, 0.010)
    b.observe(4, 64, 0.074)
    assert b.prompt_tokens(4) == 64                    # no latency bound: the chunk
    b = StepBudget(64, latency=2.5)
    b.observe(0, 100, 5.0)                             # a prompt alone: nobody waited
    assert b.prompt_tokens(4) == 0 and b.t_decode == {}   # first a step of decoding tokens alone
    b.observe(4, 0, 0.010)
    assert b.prompt_tokens(4) == StepBudget.PROBE      # no prompt-token cost seen yet: a few tokens
    b.observe(4, 8, 0.018)                             # 1 ms a prompt token
    assert b.prompt_tokens(4) == 15                    # 1.5 * 10 ms / 1 ms
    assert b.prompt_tokens(3) == 0                     # three decoding tokens: not timed yet
    assert b.prompt_tokens(6) == 15 and b.decode_time(6) == 0.010   # six: at least four's time
    b.observe(4, 15, 0.010 + 15 * 0.0029)              # 2.9 ms a token: taken at once
    assert b.prompt_tokens(4) == 5
    b.observe(4, 5, 0.010 + 5 * 0.001)                 # 1 ms: the average, 1.95 ms
    assert b.prompt_tokens(4) == 7
    for _ in range(8):
        b.observe(4, 1, 0.100)                         # 90 ms a token: at least one
    assert b.prompt_tokens(4) == 1
    for _ in range(StepBudget.REPROBE - 11):
        b.observe(4, 1, 0.100)
    assert b.prompt_tokens(4) == 0                     # time the decoding tokens alone again
    b.observe(4, 0, 0.200)                             # a slow timing: the least of the latest stays
    assert b.prompt_tokens(4) == 1 and b.since_decode == 0 and b.t_decode[4] == 0.010
    for _ in range(StepBudget.TIMINGS - 1):
        b.observe(4, 0, 0.300)
    assert b.t_decode[4] == 0.200                      # the 10 ms timing has left the latest four
    b = StepBudget(64, latency=2.5)
    b.observe(4, 0, 0.010)
    b.observe(4, 8, 0.009)                             # no longer than t_d: no cost to go by
    assert b.per_token == 0 and b.prompt_tokens(4) == StepBudget.PROBE
    b = StepBudget(8, latency=100)
    b.observe(1, 0, 0.01)
    b.observe(1, 8, 0.018)
    assert b.prompt_tokens(1) == 8                     # at most the chunk
    for bad in (dict(chunk=0), dict(chunk=8, latency=1.0), dict(chunk=8, latency=float("nan"))):
        with pytest.raises(RapidMoEError, match="prefill_chunk|step_latency"):
            StepBudget(**bad)


def long_prompt_step_cost(p: int, ctx: int) -> float:
    """A model of a step's seconds (the benchmark file's shape, 2 threads): 4 decoding tokens
    take 28 ms; p prompt tokens at context ctx add 30 ms * (1 - (15/16)^p) for the experts they
    touch that the decoding tokens did not, 0.2 ms each, and each its attention over its
    context, 3.1 us a position (6 ms a token at 1,900)."""
    if p == 0:
        return 0.028
    return 0.028 + 0.030 * (1 - (15 / 16) ** p) + sum(0.0002 + 3.1e-6 * (ctx + i) for i in range(p))


@pytest.mark.parametrize("latency", [2.0, 2.5])
def test_step_budget_bounds_a_long_prompt_on_a_cost_model(latency):
    """StepBudget fed the step times of the model above, with no clock, while a 2,000-token prompt
    is read beside 4 decoding tokens: no step passes 1.06 times its bound (the per-token cost it
    uses is the previous step's, at a shorter context), and it takes at most 1.1 times the steps
    of a planner that knew the model (the largest chunk within the bound at each context)."""
    b, t_d, ctx, steps, worst = StepBudget(64, latency), long_prompt_step_cost(0, 0), 0, 0, 0.0
    while ctx < 2000:
        p = min(b.prompt_tokens(4), 2000 - ctx)
        t = long_prompt_step_cost(p, ctx)
        b.observe(4, p, t)
        worst, ctx, steps = max(worst, t / t_d), ctx + p, steps + 1
    best, ctx = 0, 0
    while ctx < 2000:
        p = max(q for q in range(1, 65) if q == 1 or long_prompt_step_cost(q, ctx) <= latency * t_d)
        best, ctx = best + 1, ctx + p
    assert worst <= 1.06 * latency
    assert steps <= 1.1 * best


def test_scheduler_with_a_step_latency_bound_gives_the_same_text(gguf):
    """The long prompt of the test above beside a decoding request, with the prompt budget learnt
    from the step times (step_latency 1.5): steps of at most 16 prompt tokens beside the other's
    token, the budget learnt, and both requests' text as alone."""
    m = rm.Model(gguf, n_ctx=512, n_threads=2)
    m.tokenizer.eog_ids = frozenset()
    short, long_ = request(ids(6, 7), 40), request(ids(200, 8), 6)
    with m:
        jobs, obs, sched = serve_jobs(m, 2, [short, long_], prefill_chunk=16, step_latency=1.5)
        assert 1 in sched.step_budget.t_decode and sched.step_budget.per_token is not None
    assert obs.steps[0] == (6, 1) and all(n <= 1 + 16 for n, s in obs.steps if s == 2)
    for req, job in zip((short, long_), jobs):
        text, finish, end = job.result()
        assert (text, finish, end.usage) == want_alone(gguf, req, 512)


def test_scheduler_cancel_stops_a_prompt_between_chunks(gguf):
    """Cancelled after its third chunk of 16, a 200-token prompt stops there: its End says
    cancelled, its cache holds the three chunks, and its slot serves the next request."""
    m = rm.Model(gguf, n_ctx=512, n_threads=2, n_batch=16)
    job = Job(request(ids(200, 9), 4))
    calls = []
    evaluate = m.eval

    def counted(toks):
        calls.append(len(toks))
        if len(calls) == 3:
            job.cancel.set()
        return evaluate(toks)

    m.eval = counted
    with m:
        sched = Scheduler([m], "m")
        try:
            sched.submit(job, job)
            _, _, end = job.result()
            assert end.cancelled and end.error is None
            assert calls == [16, 16, 16] and m.n_past == 48
            nxt = Job(request(ids(5, 10), 3))
            sched.submit(nxt, nxt)
            _, finish, end = nxt.result()
            assert end.usage["completion_tokens"] >= 1 and finish in ("stop", "length")
            assert sched.free.qsize() == 1
        finally:
            sched.close()


def test_scheduler_a_failing_request_leaves_the_others(gguf):
    """A request whose prompt the model refuses (a token id outside the vocabulary, which the
    server's checks would have stopped) fails alone; the others in its batch go on unchanged."""
    good = [request(ids(7, 11), 10), request(ids(12, 12), 10)]
    bad = request([5, 6, VOCAB + 3], 10)
    m = rm.Model(gguf, n_ctx=128, n_threads=2)
    with m:
        jobs, _, _ = serve_jobs(m, 3, [good[0], bad, good[1]])
    _, _, end = jobs[1].result()
    assert isinstance(end.error, rm.InvalidArgumentError) and "vocabulary" in str(end.error)
    for req, job in zip(good, (jobs[0], jobs[2])):
        text, finish, end = job.result()
        assert (text, finish, end.usage) == alone(gguf, req, n_ctx=128)


def test_scheduler_reuses_the_longest_cached_prefix(gguf):
    """A request that repeats a served prompt and adds to it takes the slot holding that prompt
    and evaluates only the tokens after the common prefix, with the reply of a cold prefill."""
    class Evaluated(Observer):
        def __init__(self):
            self.evaluated = []

        def finished(self, status, prompt_tokens, evaluated, completion_tokens, stats):
            self.evaluated.append(evaluated)

    first, other = request(ids(30, 16), 4), request(ids(12, 17), 4)
    follow = request(first.prompt_ids + ids(6, 18), 6)
    obs = Evaluated()
    with rm.Model(gguf, n_ctx=128, n_threads=2) as m:
        sched = Scheduler([m, m.fork_session()], "m", observer=obs)
        try:
            jobs = [Job(r) for r in (first, other)]
            with sched._cv:
                for j in jobs:
                    sched.submit(j, j)
            for j in jobs:
                j.result()
            job = Job(follow)
            sched.submit(job, job)
            text, finish, end = job.result()
        finally:
            sched.close()
    assert job.slot == jobs[0].slot and obs.evaluated == [30, 12, 6]
    assert end.usage.pop("prompt_tokens_details") == {"cached_tokens": 30}   # what it did not evaluate
    want_text, want_finish, want_usage = alone(gguf, follow, n_ctx=128)
    assert want_usage.pop("prompt_tokens_details") == {"cached_tokens": 0}
    assert (text, finish, end.usage) == (want_text, want_finish, want_usage)


@pytest.mark.parametrize("kind", ["qwen3_next", "deepseek_v2"])
def test_scheduler_hybrid_and_mla_sequences_batch(tmp_path, kind):
    """Qwen3-Next (linear-attention layers) and DeepSeek-V2 (multi-head latent attention): the
    sequences of a step share one evaluation, each with the results it has alone."""
    from test_arch_deepseek import make_checkpoint
    from test_arch_qwen35 import make_tiny_hybrid

    if kind == "qwen3_next":
        make_tiny_hybrid(tmp_path / "hf", kind)
    else:
        make_checkpoint(tmp_path / "hf", kind)
    out = tmp_path / "h.gguf"
    rm.convert(tmp_path / "hf", out, recipe="f32", progress=False)
    reqs = [request(ids(9, 13), 6), request(ids(4, 14), 8), request(ids(1, 15), 5)]
    m = rm.Model(out, n_ctx=64, n_threads=2)
    with m:
        jobs, obs, sched = serve_jobs(m, 3, reqs)
        assert sched.batched
    assert max(s for _, s in obs.steps) == 3
    for req, job in zip(reqs, jobs):
        text, finish, end = job.result()
        assert (text, finish, end.usage) == alone(out, req, n_ctx=64)


def test_scheduler_hybrid_slot_checkpoints_the_prompt_tail(tmp_path):
    """A hybrid slot stops reading a prompt 4 tokens before its end to keep its states there
    (Model._prompt_marks), then reads the rest: the answer is the one it has alone, and a prompt
    that differs in those last tokens goes back there."""
    from rapidmoe_gguf._native import lib
    from test_arch_qwen35 import make_tiny_hybrid

    make_tiny_hybrid(tmp_path / "hf", "qwen3_5_moe")
    out = tmp_path / "h.gguf"
    rm.convert(tmp_path / "hf", out, recipe="f32", progress=False)
    req = request(ids(40, 21), 5)
    m = rm.Model(out, n_ctx=128, n_threads=2)
    with m:
        jobs, obs, sched = serve_jobs(m, 1, [req], prefill_chunk=8)
        assert [lib.rm_session_reusable(m._live(), n) for n in (35, 36, 39, 40)] == [0, 36, 36, 40]
    assert obs.steps[:2] == [(36, 1), (4, 1)]
    text, finish, end = jobs[0].result()
    assert (text, finish, end.usage) == alone(out, req, n_ctx=128)


# -- through the server --------------------------------------------------------------------------

CASES = [
    ("/v1/completions", {"prompt": "hello world", "max_tokens": 14}),
    ("/v1/completions", {"prompt": "The quick brown fox jumps over", "max_tokens": 9, "stream": True}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 7, "stream": True}),
    ("/v1/completions", {"prompt": "experts route tokens", "max_tokens": 11, "residual_policy": "none"}),
    ("/v1/completions", {"prompt": "0123", "max_tokens": 16, "stream": True, "stop": ["4"]}),
]


def _text(path, body, r):
    if body.get("stream"):
        events = sse(r.text.splitlines())
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        if "chat" in path:
            return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks), \
                chunks[-1]["choices"][0]["finish_reason"]
        return "".join(c["choices"][0]["text"] for c in chunks), chunks[-1]["choices"][0]["finish_reason"]
    choice = r.json()["choices"][0]
    return choice["message"]["content"] if "chat" in path else choice["text"], choice["finish_reason"]


def test_server_concurrent_greedy_requests_equal_alone_and_bad_ones_disturb_nothing(gguf):
    """Six greedy requests at once on three slots (the others queue), completions and chats,
    streamed and not, one with its own residual policy, while every bad request of test_server is
    sent: each good one gets what it gets alone, each bad one its 4xx. The queue holds every
    request sent at once: a bad request takes a place while it is parsed (the server admits before
    any work on a prompt), so a smaller queue may rightly answer some of them 503."""
    want = []
    with rm.Model(gguf, n_ctx=256, n_threads=2) as ref:
        for path, body in CASES:
            ref.set_residual(body.get("residual_policy", "all"))
            kw = {"max_tokens": body["max_tokens"], "temperature": 0, "stop": body.get("stop")}
            if "chat" in path:
                c = ref.create_chat_completion(MESSAGES, **kw)["choices"][0]
                want.append((c["message"]["content"], c["finish_reason"]))
            else:
                c = ref.create_completion(body["prompt"], **kw)["choices"][0]
                want.append((c["text"], c["finish_reason"]))

    async def good(client, path, body):
        r = await client.post(path, json={**body, "temperature": 0})
        assert r.status_code == 200, r.text
        return _text(path, body, r)

    async def bad(client, path, body, status):
        if isinstance(body, bytes):
            r = await client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = await client.post(path, json=body)
        return r.status_code, status

    queue = len(CASES) + len(BAD)
    with running(rm.Model(gguf, n_ctx=256, n_threads=2), parallel=3, queue=queue) as (url, state):
        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                goods = [good(client, p, b) for p, b in CASES]
                bads = [bad(client, p, b, s) for p, b, _, s, _ in BAD]
                return await asyncio.gather(*goods), await asyncio.gather(*bads)

        got, refused = asyncio.run(main())
        assert state.peak_batch >= 2
        health = httpx.get(url + "/health").json()
    assert got == want
    assert [got for got, _ in refused] == [status for _, status in refused]
    assert health["slots_idle"] == 3 and health["requests_waiting"] == 0


def test_server_disconnect_during_a_long_prompt_frees_the_slot(gguf):
    """A client that gives up while its 600-token prompt is read (in steps of 16, each slowed to
    50 ms here) stops it between two steps: the slot is free again long before the prompt would
    have been read, and serves the next request."""
    m = rm.Model(gguf, n_ctx=1024, n_threads=2, n_batch=16)
    m.tokenizer.eog_ids = frozenset()
    evaluate = m.eval

    def slow(toks):
        time.sleep(0.05)
        return evaluate(toks)

    m.eval = slow
    prompt = ids(600, 15)
    with running(m, parallel=1, queue=1) as (url, state):
        before = state.stats()
        t0 = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4},
                       timeout=httpx.Timeout(30, read=0.5))
        while httpx.get(url + "/health").json()["slots_idle"] != 1:
            assert time.monotonic() - t0 < 10, "the slot was not freed"
            time.sleep(0.02)
        assert 0 < m.n_past < 600
        assert state.stats()["cancelled"] == before["cancelled"] + 1
        m.eval = evaluate
        r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
