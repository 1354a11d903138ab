#!/usr/bin/env python3
"""An agent-like session against llama.cpp: time to first token per turn, each engine reusing the
prefix it has cached (ours: Model's prefix reuse, the hybrids through their state checkpoints;
llama.cpp: llama-cpp-python's own, Llama.generate's longest common prefix).

    python tools/bench_agent_session.py MODEL.gguf [--first 2000] [--turns 20] [--turn 700] [--reply 32]
                                        [--threads 2] [--rt] [--engines ours,llama.cpp]

The session starts with FIRST tokens (a system prompt and tool definitions) and takes TURNS turns;
each turn the engine answers REPLY tokens (greedy), then the conversation grows by a reply and a
new message of TURN tokens together (a scripted reply, the same for both engines, so both do the
same work: the cached prompt is reused, the reply and the message are evaluated). With the
defaults it grows to 16,000 tokens. Token ids are drawn from each vocabulary's plain range, as
tools/bench_vs_llamacpp.py's script does. Each engine runs in a process of its own (llama.cpp in
the venv tools/bench_vs_llamacpp.py --install-only makes), one after the other; the tool prints
each turn's prompt length, the tokens evaluated (ours: what it reused) and the time to first token
of both, and the ratio of their sums.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_llamacpp as bv  # noqa: E402   (the llama.cpp venv, the worker's environment, --rt)


def script(n_vocab: int, n: int, seed: int) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(300, min(n_vocab, 8000), n)]


def worker(engine: str, path: str, a) -> dict:
    n_ctx = a.first + a.turns * (a.turn + a.reply) + a.reply + 16
    t0 = time.perf_counter()
    if engine == "ours":
        from rapidmoe_gguf import Model
        from rapidmoe_gguf.sampling import SamplingParams

        m = Model(path, n_ctx=n_ctx, n_threads=a.threads, n_batch=a.batch, residual=None)
        n_vocab = m.n_vocab
        greedy = SamplingParams(temperature=0)

        def generate(prompt):
            return m.generate_tokens(prompt, a.reply, greedy, stop_ids=set())

        def reused():
            return m.last_timings["prompt_reused"]
    else:
        import llama_cpp

        llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=a.threads, n_threads_batch=a.threads, n_batch=a.batch,
                              n_ubatch=a.batch, verbose=False)
        n_vocab = llm.n_vocab()

        def generate(prompt):
            gen = llm.generate(prompt, temp=0.0, top_k=1, reset=True)
            for i, t in enumerate(gen):
                yield t
                if i + 1 >= a.reply:
                    break

        def reused():
            return None
    load_s = time.perf_counter() - t0
    history = script(n_vocab, a.first, 0)
    warm = list(generate(history[:64]))            # pages the weights in
    del warm
    turns = []
    for k in range(a.turns):
        t = time.perf_counter()
        first = None
        n_out = 0
        for _ in generate(history):
            if first is None:
                first = time.perf_counter() - t
            n_out += 1
        total = time.perf_counter() - t
        turns.append({"prompt": len(history), "reused": reused(), "ttft_s": first, "turn_s": total, "generated": n_out})
        history = history + script(n_vocab, a.reply + a.turn, 1000 + k)
    return {"engine": engine, "load_s": load_s, "turns": turns, "peak_rss_mib": bv.peak_rss_mib()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--first", type=int, default=2000, help="tokens before the first turn")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--turn", type=int, default=700, help="new tokens of each message")
    ap.add_argument("--reply", type=int, default=32, help="tokens each turn generates")
    ap.add_argument("--batch", type=int, default=512, help="n_batch of both engines")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--engines", default="ours,llama.cpp")
    ap.add_argument("--llama-venv", help="llama-cpp-python's environment (default: tools/bench_vs_llamacpp.py's)")
    ap.add_argument("--rt", action="store_true", help="run the engines at real-time priority (chrt -f 1)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", choices=["ours", "llama.cpp"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, a)))
        return 0
    prefix = bv.rt_prefix(a.rt)
    results = {}
    for engine in a.engines.split(","):
        python = sys.executable if engine == "ours" else bv.llama_python(a.llama_venv or bv.default_venv("best"))
        cmd = prefix + [python, os.path.abspath(__file__), a.model, "--worker", engine, "--first", str(a.first),
                        "--turns", str(a.turns), "--turn", str(a.turn), "--reply", str(a.reply), "--batch",
                        str(a.batch), "--threads", str(a.threads)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=bv.worker_env(engine, None), timeout=7200)
        if p.returncode != 0:
            raise SystemExit(f"{engine} failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
        results[engine] = json.loads(p.stdout.strip().splitlines()[-1])
    engines = list(results)
    print(f"{os.path.basename(a.model)}: {a.first} tokens, then {a.turns} turns of {a.reply} generated + "
          f"{a.turn} new tokens, {a.threads} threads")
    print("| turn | prompt | " + " | ".join(f"{e} TTFT s" for e in engines) + " | ours reused |")
    print("|---|---|" + "---|" * len(engines) + "---|")
    for k in range(a.turns):
        row = [results[e]["turns"][k] for e in engines]
        reused = results["ours"]["turns"][k]["reused"] if "ours" in results else ""
        print(f"| {k + 1} | {row[0]['prompt']} | " + " | ".join(f"{r['ttft_s']:.2f}" for r in row) + f" | {reused} |")
    sums = {e: sum(t["ttft_s"] for t in results[e]["turns"]) for e in engines}
    print("total TTFT: " + ", ".join(f"{e} {sums[e]:.1f} s" for e in engines))
    if "ours" in sums and "llama.cpp" in sums:
        print(f"llama.cpp / ours: {sums['llama.cpp'] / sums['ours']:.2f}x the waiting")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
