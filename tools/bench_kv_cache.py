#!/usr/bin/env python3
"""The KV cache types (Model's cache_type_k / cache_type_v) on one model: each type's logits
against the F32 cache's, its bytes, and decode speed at depth.

    python tools/bench_kv_cache.py MODEL.gguf [--depth 2048] [--types f16,q8_0,q4_0] [--threads 2]

For each type (K and V alike): a prompt of --depth tokens (a fixed random script, the same for
every type) is prefilled, then --decode tokens are decoded one at a time, each the next token of
the script. Reported: KL(F32 cache || this type) of the next-token distributions, mean and max
over the decoded positions, and how often the top token agrees; the cache's bytes for n_ctx =
depth + decode (what the session allocates); prefill and decode tok/s (median of --runs runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source tree
import rapidmoe_gguf as rm  # noqa: E402
from rapidmoe_gguf import planner  # noqa: E402
from rapidmoe_gguf.gguf_file import open_gguf  # noqa: E402


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def run(path: str, cache: str, script: list[int], depth: int, threads: int) -> tuple[np.ndarray, float, float]:
    """The decoded positions' logits, prefill tok/s and decode tok/s for one cache type."""
    with rm.Model(path, n_ctx=len(script) + 1, n_threads=threads, n_batch=512, residual=None,
                  cache_type_k=cache, cache_type_v=cache) as m:
        t0 = time.perf_counter()
        rows = [m.eval(script[:depth])]
        t1 = time.perf_counter()
        for t in script[depth:]:
            rows.append(m.eval([t]))
        t2 = time.perf_counter()
    return np.stack(rows), depth / (t1 - t0), (len(script) - depth) / (t2 - t1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--types", default="f16,bf16,q8_0,q5_0,q4_0")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    with open_gguf(a.model) as g:
        sizes = planner.ModelSizes.from_gguf(g, None)
        n_vocab = len(g.metadata["tokenizer.ggml.tokens"])
    script = np.random.default_rng(0).integers(10, n_vocab, a.depth + a.decode).tolist()
    types = ["f32"] + [t for t in a.types.split(",") if t and t != "f32"]
    results = {}
    for r in range(a.runs):              # the types alternate run by run
        for t in types:
            logits, pre, dec = run(a.model, t, script, a.depth, a.threads)
            got = results.setdefault(t, {"logits": logits, "prefill": [], "decode": []})
            got["prefill"].append(pre)
            got["decode"].append(dec)
    ref = _log_softmax(results["f32"]["logits"])
    print(f"{os.path.basename(a.model)}: depth {a.depth}, {a.decode} decoded, {a.threads} threads, median of {a.runs}")
    print("| cache | KL mean | KL max | top-1 same | cache MiB | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|---|---|---|")
    for t in types:
        p = _log_softmax(results[t]["logits"])
        kl = (np.exp(ref) * (ref - p)).sum(-1)
        same = (ref.argmax(-1) == p.argmax(-1)).mean()
        mib = planner.kv_cache_bytes(sizes, len(script) + 1, t, t) / 2**20
        print(f"| {t} | {kl.mean():.2e} | {kl.max():.2e} | {same:.3f} | {mib:.1f} | "
              f"{statistics.median(results[t]['prefill']):.1f} | {statistics.median(results[t]['decode']):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
