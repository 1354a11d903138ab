#!/usr/bin/env python3
"""Aggregate decode tok/s of N sequences: one evaluation per step for all of them (`eval_batch`,
rm_batch_eval) against each sequence's own evaluation in turn (`Model.eval`).

    python tools/bench_batch_decode.py MODEL.gguf [--streams 1,2,4] [--steps 40] [--threads 2]

Two sets of N sessions, each fed the same 16-token prompt; every step times one batched step of
the first set and one step of the second set one at a time, the order alternating step by step,
so load from other work on the machine falls on both alike. tok/s = N / the median step time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--streams", default="1,2,4", help="sequences N, comma-separated (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    try:
        ns = [int(x) for x in a.streams.split(",")]
    except ValueError:
        ap.error("--streams takes comma-separated whole numbers")
    if min(ns) < 1 or a.steps < 1 or a.threads < 1:
        ap.error("--streams, --steps and --threads must be >= 1")
    from rapidmoe_gguf import Model, eval_batch

    rng = np.random.default_rng(0)
    print("| N | batched tok/s | one at a time tok/s | ratio |")
    print("|---|---|---|---|")
    with Model(a.model, n_ctx=16 + a.steps + 1, n_threads=a.threads, residual=None) as m:
        pool = [m] + [m.fork_session() for _ in range(2 * max(ns) - 1)]
        for n in ns:
            batched, alone = pool[:n], pool[n:2 * n]
            prompts = [rng.integers(0, m.n_vocab, 16).tolist() for _ in range(n)]
            for s, p in zip(batched + alone, prompts + prompts):
                s.reset()
                s.eval(p)
            times: tuple[list[float], list[float]] = ([], [])
            for k in range(a.steps):
                toks = rng.integers(0, m.n_vocab, n).tolist()
                for mode in ((0, 1) if k % 2 == 0 else (1, 0)):
                    t0 = time.perf_counter()
                    if mode == 0:
                        eval_batch([(s, [t]) for s, t in zip(batched, toks)])
                    else:
                        for s, t in zip(alone, toks):
                            s.eval([t])
                    times[mode].append(time.perf_counter() - t0)
            b, o = (n / statistics.median(t) for t in times)
            print(f"| {n} | {b:.1f} | {o:.1f} | {b / o:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
