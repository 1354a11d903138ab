#!/usr/bin/env python3
"""Serving throughput and latency: `rapidmoe serve` with N concurrent streams against llama.cpp's
batched decode of N sequences, on the same GGUF file.

    python tools/bench_serving.py MODEL.gguf [--threads 2] [--streams 1,2,4,8] [--json out.json]
    python tools/bench_serving.py MODEL.gguf --skip-llamacpp       # ours alone

Ours. The server runs in a child process (`rapidmoe_gguf.server.serve`, --parallel max(N) + 1
slots, --prefill-chunk as given, the base file without its residual sidecar, end-of-generation
tokens ignored so every reply runs to its length). For each N, N clients at once stream a
completion of --prompt random token ids (each its own) and --decode new tokens, sampled at
temperature 1 (on random weights a greedy reply repeats one token, and every step would read the
same experts), with `logprobs` 0 so that each chunk names the tokens it carries. A chunk carries
the tokens whose text it completes: one, or several where tokens give no text of their own (a
character split across byte tokens; most of the benchmark model's vocabulary, whose pieces are
empty). Per stream: time to first token (request sent to first chunk), then the inter-token
gaps, each chunk's gap since the one before spread evenly over the tokens it carries. Aggregate
decode tok/s = the sum over the streams of each one's decode rate (the tokens its chunks after
the first carry, over the time from its first chunk to its last): the rate at which the steps
they share produce tokens, as llama.cpp's figure below (the streams start one prompt per step,
so a first-to-last span would count their staggered starts against the decode rate).

llama.cpp. llama-cpp-python 0.3.36 in its own environment (tools/bench_vs_llamacpp.py installs
it; --llama-python names another), through its low-level API: one context with n_seq_max = N,
the N prompts prefilled in one llama_decode, then --decode steps of one llama_decode each with
one token per sequence (a fixed random script), logits of every sequence read and its argmax
taken. Time to first token = the prefill step; inter-token latency = the step times; aggregate =
N tokens per step over the steps' time. That is what llama.cpp's server does with N slots.

A long prompt among streams: 4 streams decode; once each has 16 tokens a --long-token prompt
arrives. Reported: the streams' p50 gap before it arrived, and their p99 gap while it was read
(until its answer came). Ours reads it in chunks of at most --prefill-chunk tokens between the
streams' tokens, fewer where --step-latency needs; llama.cpp (as its server does, n_batch 2048,
n_ubatch 512) puts up to --llama-batch of its tokens into each step beside the 4 tokens.

Numbers from a machine shared with other work are noise (llama.cpp's threads wait for each other
by spinning, so with more threads than free cores its steps take many times longer); run it on a
quiet one, or with --rt (the server and llama.cpp at real-time priority 1, this process, whose
clients time our streams, at 2; the server's event loop then waits behind its compute threads,
which adds to the long-prompt p99: 3.4x the p50 where a quiet machine without --rt gave 2.7-2.8x,
docs/PERFORMANCE.md). Medians of one
run each; the table is printed and, with --json, written with the raw per-N data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LLAMA_PYTHON = (os.environ.get("LLAMA_CPP_PYTHON")
                        or os.path.expanduser("~/.cache/rapidmoe/llamacpp-venv/bin/python"))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))]


def rt_prefix(want: bool) -> list[str]:
    """chrt -f 1 where allowed (bench_vs_llamacpp.py's --rt)."""
    if not want:
        return []
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_vs_llamacpp", os.path.join(HERE, "bench_vs_llamacpp.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.rt_prefix(True)


def script(n_vocab: int, n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, n_vocab) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# llama.cpp (runs in llama-cpp-python's environment: this file with --llama-worker)
# ---------------------------------------------------------------------------------------------

def llama_worker(a) -> dict:
    import ctypes

    import llama_cpp as L
    import numpy as np

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp could not load {a.model}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out = {}

    def context(n_seq: int, per_seq: int):
        cp = L.llama_context_default_params()
        cp.n_ctx = n_seq * per_seq
        cp.n_seq_max = n_seq
        cp.n_batch = max(a.llama_batch, n_seq * a.prompt)
        cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = a.threads
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit("llama.cpp could not make a context")
        return ctx, L.llama_batch_init(cp.n_batch, 0, 1)

    def decode(ctx, batch, items) -> list[np.ndarray]:
        """items: (token, pos, seq, logits?); returns the argmax-ready logits of those that want them."""
        batch.n_tokens = len(items)
        for i, (t, p, s, w) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p, 1, w
            batch.seq_id[i][0] = s
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise SystemExit(f"llama_decode failed: {rc}")
        return [int(np.argmax(np.ctypeslib.as_array(ctypes.cast(L.llama_get_logits_ith(ctx, i),
                                                                 ctypes.POINTER(ctypes.c_float)), (n_vocab,))))
                for i, item in enumerate(items) if item[3]]

    def prompt_items(prompts, start=0):
        return [(t, start + p, s, p == len(pr) - 1) for s, pr in enumerate(prompts) for p, t in enumerate(pr)]

    for n in a.streams:
        ctx, batch = context(n, a.prompt + a.decode + 8)
        prompts = [script(n_vocab, a.prompt, 100 + s) for s in range(n)]
        feeds = [script(n_vocab, a.decode, 200 + s) for s in range(n)]
        decode(ctx, batch, prompt_items([p[:8] for p in prompts]))            # warm-up, then clear
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        decode(ctx, batch, prompt_items(prompts))
        ttft = time.perf_counter() - t0
        steps = []
        for k in range(a.decode - 1):
            t = time.perf_counter()
            decode(ctx, batch, [(feeds[s][k], a.prompt + k, s, True) for s in range(n)])
            steps.append(time.perf_counter() - t)
        out[n] = {"ttft_s": ttft, "itl_p50_s": pct(steps, 50), "itl_p99_s": pct(steps, 99),
                  "decode_tok_s": n * len(steps) / sum(steps)}
        L.llama_batch_free(batch)
        L.llama_free(ctx)

    # the long prompt among 4 streams
    n, warm = 4, 16
    ctx, batch = context(n + 1, a.long + a.decode + 16)
    prompts = [script(n_vocab, a.prompt, 300 + s) for s in range(n)]
    long_ids = script(n_vocab, a.long, 400)
    decode(ctx, batch, prompt_items(prompts))
    before, during, pos, k = [], [], a.prompt, 0
    fed = 0
    while fed < len(long_ids):
        items = [(3 + (k * 7 + s) % (n_vocab - 3), pos, s, True) for s in range(n)]
        if k >= warm:
            chunk = long_ids[fed:fed + a.llama_batch - n]
            items += [(t, fed + i, n, fed + i == len(long_ids) - 1) for i, t in enumerate(chunk)]
            fed += len(chunk)
        t = time.perf_counter()
        decode(ctx, batch, items)
        (during if k >= warm else before).append(time.perf_counter() - t)
        pos, k = pos + 1, k + 1
    out["long"] = {"itl_p50_before_s": pct(before, 50), "itl_p99_during_s": pct(during, 99),
                   "steps_during": len(during)}
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return out


# ---------------------------------------------------------------------------------------------
# ours, through the server
# ---------------------------------------------------------------------------------------------

SERVER = textwrap.dedent("""
    import sys
    import rapidmoe_gguf as rm
    from rapidmoe_gguf import server as srv

    path, port, threads, parallel, ctx, chunk = sys.argv[1], *map(int, sys.argv[2:7])
    latency = float(sys.argv[7]) or None
    m = rm.Model(path, n_ctx=ctx, n_threads=threads, residual=None)
    m.tokenizer.eog_ids = frozenset()       # every reply runs to max_tokens
    print(m.n_vocab, flush=True)
    srv.serve(m, srv.ServerConfig(port=port, parallel=parallel, queue=16, prefill_chunk=chunk,
                                               step_latency=latency), log_level="warning")
    m.close()
""")


class Stream:
    def __init__(self):
        self.sent = self.first = None
        self.times: list[float] = []   # chunk arrivals
        self.counts: list[int] = []    # the tokens each chunk carries
        self.tokens = 0

    def gaps(self, lo=float("-inf"), hi=float("inf")) -> list[float]:
        """Per token: a chunk's gap since the one before, over the tokens it carries."""
        return [(b - a) / k for a, b, k in zip(self.times, self.times[1:], self.counts[1:]) if lo <= b <= hi
                for _ in range(k)]

    def decode_rate(self) -> float:
        return sum(self.counts[1:]) / (self.times[-1] - self.times[0])


async def stream_one(client, ids, max_tokens, seed, st: Stream, stop: asyncio.Event | None = None) -> None:
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}, "logprobs": 0}
    st.sent = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"the server answered {r.status_code}: {await r.aread()!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                st.tokens = ev["usage"]["completion_tokens"]
            elif (ev["choices"][0]["logprobs"] or {}).get("tokens"):
                now = time.perf_counter()
                st.first = st.first or now
                st.times.append(now)
                st.counts.append(len(ev["choices"][0]["logprobs"]["tokens"]))
            if stop is not None and stop.is_set():
                return                                  # hang up: the server cancels the rest


async def ours_streams(url, n, a, n_vocab) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await stream_one(client, script(n_vocab, 8, 1), 4, 0, Stream())        # warm-up
        streams = [Stream() for _ in range(n)]
        await asyncio.gather(*(stream_one(client, script(n_vocab, a.prompt, 100 + s), a.decode, s, st)
                               for s, st in enumerate(streams)))
    if any(len(st.times) < 2 for st in streams):
        raise SystemExit("a stream gave fewer than two chunks of text: give --decode more tokens")
    gaps = [g for st in streams for g in st.gaps()]
    return {"ttft_s": statistics.median(st.first - st.sent for st in streams),
            "itl_p50_s": pct(gaps, 50), "itl_p99_s": pct(gaps, 99),
            "decode_tok_s": sum(st.decode_rate() for st in streams)}


async def ours_long(url, a, n_vocab) -> dict:
    import httpx

    n, warm = 4, 16
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        streams, stop = [Stream() for _ in range(n)], asyncio.Event()
        tasks = [asyncio.create_task(stream_one(client, script(n_vocab, a.prompt, 300 + s), a.long + 4 * a.decode,
                                                s, st, stop)) for s, st in enumerate(streams)]
        while any(len(st.times) < warm and not t.done() for st, t in zip(streams, tasks)):
            await asyncio.sleep(0.01)
        t_long = time.perf_counter()
        r = await client.post("/v1/completions", json={"prompt": script(n_vocab, a.long, 400), "max_tokens": 1})
        t_done = time.perf_counter()
        if r.status_code != 200:
            raise SystemExit(f"the long prompt got {r.status_code}: {r.text[:300]}")
        stop.set()
        await asyncio.gather(*tasks)
    before = [g for st in streams for g in st.gaps(hi=t_long)]
    during = [g for st in streams for g in st.gaps(lo=t_long, hi=t_done)]
    return {"itl_p50_before_s": pct(before, 50), "itl_p99_during_s": pct(during, 99), "gaps_during": len(during),
            "long_prompt_s": t_done - t_long}


def run_ours(a) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="bench_serving_", suffix=".log", delete=False)
    import rapidmoe_gguf   # the server runs the package this process imports (installed, or the tree on PYTHONPATH)

    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(rapidmoe_gguf.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [pkg_root, os.environ.get("PYTHONPATH")] if p)}
    ctx = a.long + 4 * a.decode + a.prompt + 16
    # run from elsewhere: `python -c` puts its working folder first on sys.path, which in a source tree
    # would shadow the installed package with the unbuilt one
    proc = subprocess.Popen([*rt_prefix(a.rt), sys.executable, "-c", SERVER, os.path.abspath(a.model), str(port),
                             str(a.threads), str(max(max(a.streams), 4) + 1), str(ctx), str(a.prefill_chunk),
                             str(a.step_latency)],
                            env=env, stdout=subprocess.PIPE, stderr=log, text=True, cwd=tempfile.gettempdir())
    try:
        n_vocab = int(proc.stdout.readline())
        import httpx

        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start; its log: {log.name}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        out = {}
        for n in a.streams:
            out[n] = asyncio.run(ours_streams(url, n, a, n_vocab))
            print(f"  ours, {n} streams: {out[n]['decode_tok_s']:.1f} tok/s", file=sys.stderr)
        out["long"] = asyncio.run(ours_long(url, a, n_vocab))
        m = httpx.get(url + "/metrics")
        out["metrics"] = m.text if m.status_code == 200 else None     # without prometheus_client: 501
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_llama(a) -> dict:
    args = [*rt_prefix(a.rt), a.llama_python, os.path.abspath(__file__), "--llama-worker", a.model, "--threads", str(a.threads),
            "--streams", ",".join(map(str, a.streams)), "--prompt", str(a.prompt), "--decode", str(a.decode),
            "--long", str(a.long), "--llama-batch", str(a.llama_batch)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the llama.cpp worker failed:\n{r.stderr[-3000:]}")
    return {int(k) if k.isdigit() else k: v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def table(ours: dict, llama: dict | None, a) -> str:
    rows = [f"| N | ours tok/s | llama.cpp tok/s | ratio | ours TTFT ms | llama.cpp TTFT ms | "
            f"ours ITL p50/p99 ms | llama.cpp ITL p50/p99 ms |", "|---|---|---|---|---|---|---|---|"]
    for n in a.streams:
        o, l = ours[n], (llama or {}).get(n)
        ratio = f"{o['decode_tok_s'] / l['decode_tok_s']:.2f}" if l else "-"
        rows.append(f"| {n} | {o['decode_tok_s']:.1f} | {l['decode_tok_s']:.1f} | {ratio} | {o['ttft_s'] * 1e3:.0f} | "
                    f"{l['ttft_s'] * 1e3:.0f} | {o['itl_p50_s'] * 1e3:.1f} / {o['itl_p99_s'] * 1e3:.1f} | "
                    f"{l['itl_p50_s'] * 1e3:.1f} / {l['itl_p99_s'] * 1e3:.1f} |" if l else
                    f"| {n} | {o['decode_tok_s']:.1f} | - | - | {o['ttft_s'] * 1e3:.0f} | - | "
                    f"{o['itl_p50_s'] * 1e3:.1f} / {o['itl_p99_s'] * 1e3:.1f} | - |")
    lo = ours["long"]
    rows.append("")
    rows.append(f"4 streams while a {a.long}-token prompt arrives: ours ITL p50 before "
                f"{lo['itl_p50_before_s'] * 1e3:.1f} ms, p99 during {lo['itl_p99_during_s'] * 1e3:.1f} ms "
                f"({lo['itl_p99_during_s'] / lo['itl_p50_before_s']:.1f}x; "
                f"prefill chunk {a.prefill_chunk}, step latency {a.step_latency or 'off'}, the prompt answered in {lo['long_prompt_s']:.2f} s)")
    if llama:
        ll = llama["long"]
        rows.append(f"  llama.cpp (up to {a.llama_batch} prompt tokens a step): p50 before "
                    f"{ll['itl_p50_before_s'] * 1e3:.1f} ms, "
                    f"p99 during {ll['itl_p99_during_s'] * 1e3:.1f} ms "
                    f"({ll['itl_p99_during_s'] / ll['itl_p50_before_s']:.1f}x)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,2,4,8", help="concurrent streams, comma-separated (default: %(default)s)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens per stream (default: %(default)s)")
    ap.add_argument("--decode", type=int, default=64, help="tokens generated per stream (default: %(default)s)")
    ap.add_argument("--long", type=int, default=2000, help="the long prompt's tokens (default: %(default)s)")
    ap.add_argument("--prefill-chunk", type=int, default=64, help="the server's --prefill-chunk (default: %(default)s)")
    ap.add_argument("--step-latency", type=float, default=2.5,
                    help="the server's --step-latency (default: %(default)s; 0: off)")
    ap.add_argument("--llama-batch", type=int, default=2048,
                    help="llama.cpp's n_batch (default: %(default)s, as its server's)")
    ap.add_argument("--llama-python", default=DEFAULT_LLAMA_PYTHON, help="python of llama-cpp-python's environment")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--rt", action="store_true", help="run the server and llama.cpp at real-time priority (chrt -f 1)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.streams = [int(x) for x in a.streams.split(",")]
    if a.llama_worker:
        print(json.dumps(llama_worker(a)))
        return 0
    if a.rt and rt_prefix(True):
        # The streams' clients take their timestamps in this process: above the server's priority,
        # so that the server's busy threads do not delay them (llama.cpp's worker times itself).
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(2))
        except (OSError, AttributeError) as e:
            print(f"--rt: the clients stay at normal priority ({e}); their timestamps may lag", file=sys.stderr)
    llama = None if a.skip_llamacpp else run_llama(a)
    ours = run_ours(a)
    text = table(ours, llama, a)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(a).items() if k != "llama_worker"}, "ours": ours,
                       "llama.cpp": llama, "table": text}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
