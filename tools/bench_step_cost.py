#!/usr/bin/env python3
"""What one scheduler step costs: 4 sequences decoding one token each, alone and beside P prompt
tokens of a prompt whose context is C, in one evaluation (`eval_batch`), as the server's steps
are; with the profile's attention part of the step with prompt tokens.

    python tools/bench_step_cost.py MODEL.gguf [--context 100,1900] [--prompt 16,64] [--runs 5]

Medians of --runs steps, the caches cut back to the same contexts before each. Wall times move with other work on the machine; run it on a quiet one,
or compare CPU time (perf) between builds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", default="100,1900", help="prompt contexts C, comma-separated (default: %(default)s)")
    ap.add_argument("--prompt", default="16,64", help="prompt tokens P per step, comma-separated (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decoding-context", type=int, default=64, help="the decoding sequences' context (default: %(default)s)")
    a = ap.parse_args(argv)
    try:
        contexts = [int(x) for x in a.context.split(",")]
        prompts = [int(x) for x in a.prompt.split(",")]
    except ValueError:
        ap.error("--context and --prompt take comma-separated whole numbers")
    if min(contexts) < 1 or min(prompts) < 1 or a.runs < 1 or a.threads < 1 or a.decoding_context < 1:
        ap.error("--context, --prompt, --runs, --threads and --decoding-context must be >= 1")
    from rapidmoe_gguf import Model, eval_batch

    n_ctx = max(max(contexts) + max(prompts), a.decoding_context + 1)
    rng = np.random.default_rng(0)
    print("| context C | prompt tokens P | 4 decoding alone ms | with P prompt tokens ms | its attention ms |")
    print("|---|---|---|---|---|")
    with Model(a.model, n_ctx=n_ctx, n_threads=a.threads, residual=None) as m:
        V = m.n_vocab
        decoding = [m.fork_session() for _ in range(4)]
        for d in decoding:
            d.eval(rng.integers(0, V, a.decoding_context).tolist())
        for c in contexts:
            for p in prompts:
                with m.fork_session() as prompt:
                    ids = rng.integers(0, V, c).tolist()
                    for i in range(0, c, 256):
                        prompt.eval(ids[i:i + 256])
                    alone, both, attn = [], [], []
                    for _ in range(a.runs):
                        for d in decoding:               # the same contexts every run
                            d.truncate(a.decoding_context)
                        prompt.truncate(c)
                        t0 = time.perf_counter()
                        eval_batch([(d, [int(rng.integers(0, V))]) for d in decoding])
                        alone.append(time.perf_counter() - t0)
                        for d in decoding:
                            d.truncate(a.decoding_context)
                        decoding[0].clear_stats()       # the batch runs on the first sequence's session
                        t0 = time.perf_counter()
                        eval_batch([(d, [int(rng.integers(0, V))]) for d in decoding]
                                   + [(prompt, rng.integers(0, V, p).tolist())])
                        both.append(time.perf_counter() - t0)
                        attn.append(decoding[0].profile()["prefill"]["attn"])
                med = statistics.median
                print(f"| {c} | {p} | {med(alone) * 1e3:.1f} | {med(both) * 1e3:.1f} | {med(attn) * 1e3:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
