#!/usr/bin/env python3
"""Single-thread microbenchmark of the CPU dot kernels: each kernel set against the scalar one.

For each weight type, times y = W x for one activation row over a matrix of random weights, once
small enough to stay in L2 (compute speed) and once much larger than the last-level cache
(streaming from memory, as decode does), and prints weight GB/s and the speedup over scalar.
With --tokens N (N > 1) it times the prefill form instead: N activation rows against an in-cache
matrix, as the CPU backend runs a product of many tokens, in picoseconds per weight and token.
Each figure is the best of repeated calls, so another process taking the core mostly shows as
spread between runs, not as a slower figure.

With --compare A,B (and --tokens) it times two sets on the same matrices instead, alternating
A and B call by call --repeats times, and prints each set's median, the ratio of the medians and
the largest difference of their results (relative to the largest result; 0: the same floats):
the form for a machine shared with other work, where a burst of load then hits both sets alike.

    python tools/bench_kernels.py [--types Q4_0,Q4_K] [--json out.json]
    python tools/bench_kernels.py --tokens 64 --types Q4_K,Q5_K,Q6_K
    python tools/bench_kernels.py --stored --types Q4_0,Q4_K,Q5_K   # as a CPU-only model keeps them
    python tools/bench_kernels.py --tokens 128 --compare avx512,amx --types Q8_0,Q4_0 --n 2048,768
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source tree
from rapidmoe_gguf import kernels, quants  # noqa: E402
from rapidmoe_gguf.errors import InvalidArgumentError  # noqa: E402

DEFAULT_TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def random_blocks(name: str, n: int, n_rows: int, r) -> bytes:
    """Random blocks for a type without a quantizer (the IQ types): random bytes with a finite
    fp16 scale in the first field (IQ1_M, whose scale is spread over its scale words, is left out)."""
    t = quants.TYPES[name]
    if name == "IQ1_M":
        sys.exit("bench_kernels: IQ1_M has no quantizer and no simple random form here")
    raw = r.integers(0, 256, (n_rows * n // t.block_elems, t.block_bytes), dtype=np.uint8)
    raw[:, 0:2] = (r.uniform(0.5, 2, (len(raw), 1)) * 0.01).astype(np.float16).view(np.uint8)
    return raw.tobytes()


def make(name: str, n: int, n_rows: int, seed: int = 0, n_tok: int = 1):
    r = np.random.default_rng(seed)
    if name.startswith("IQ"):
        w = random_blocks(name, n, n_rows, r)
    else:
        w = quants.quantize(name, r.standard_normal((n_rows, n)).astype(np.float32))
    x = r.standard_normal((n_tok, n) if n_tok > 1 else n).astype(np.float32)
    act = quants.TYPES[name].vec_dot_type
    x_q = x.tobytes() if act == "F32" else quants.quantize(act, x)
    return w, x_q


def layouts(name: str, w: bytes, n: int, isas, stored: bool) -> dict:
    """Per set: the rows to time and whether they are in its stored layout (with ``stored``, where
    the set keeps such rows for the type and row length)."""
    out = {}
    for isa in isas:
        out[isa] = (w, False)
        if stored:
            try:
                out[isa] = (kernels.repack_rows(name, w, n, isa=isa), True)
            except InvalidArgumentError:
                pass
    return out


def whole_tiles(n_rows: int, stored: bool) -> int:
    """With ``stored``, rows in whole tiles of 16 (the sets keep some types' matrices so only)."""
    return max(16, n_rows // 16 * 16) if stored else n_rows


def dot(name: str, rows: tuple, x_q: bytes, n: int, isa: str):
    return kernels.vec_dot_rows(name, rows[0], x_q, n, isa=isa, repacked=rows[1])


def time_it(fn, min_s: float) -> float:
    """The best time of repeated calls, each batch of calls running for at least min_s."""
    fn()
    best = float("inf")
    for _ in range(3):
        k, t0 = 0, time.perf_counter()
        while True:
            fn()
            k += 1
            dt = time.perf_counter() - t0
            if dt >= min_s:
                break
        best = min(best, dt / k)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES))
    ap.add_argument("--n", default="2048", help="row length (elements); with --compare, a list: 2048,768")
    ap.add_argument("--cache-kib", type=int, default=256, help="weight bytes of the in-cache case")
    ap.add_argument("--mem-mib", type=int, default=256, help="weight bytes of the streaming case")
    ap.add_argument("--min-s", type=float, default=0.2)
    ap.add_argument("--tokens", type=int, default=1, help="activation rows: > 1 times the prefill form")
    ap.add_argument("--compare", help="two kernel sets, A,B: alternate them (with --tokens)")
    ap.add_argument("--repeats", type=int, default=21, help="calls of each set with --compare")
    ap.add_argument("--stored", action="store_true",
                    help="the rows in each set's stored layout, as a CPU-only model keeps them from load "
                         "(types and sets that have one; the others as the file has them)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    if args.compare:
        return compare(args)
    args.n = int(args.n)
    if args.tokens > 1:
        return prefill(args)

    isas = kernels.supported_isas()
    results = []
    print(f"kernel sets: {', '.join(isas)} (in use: {kernels.cpu_isa()}); one thread, row length {args.n}")
    print(f"{'type':6} {'case':6} " + " ".join(f"{isa + ' GB/s':>12}" for isa in isas) + "   speedup vs scalar")
    for name in args.types.split(","):
        row = quants.row_bytes(name, args.n)
        for case, nbytes in [("cache", args.cache_kib << 10), ("memory", args.mem_mib << 20)]:
            n_rows = whole_tiles(max(1, nbytes // row), args.stored)
            w, x_q = make(name, args.n, n_rows)
            rows = layouts(name, w, args.n, isas, args.stored)
            gbs = {}
            for isa in isas:
                min_s = args.min_s if isa != "scalar" or case == "cache" else args.min_s / 2
                dt = time_it(lambda: dot(name, rows[isa], x_q, args.n, isa), min_s)
                gbs[isa] = len(w) / dt / 1e9
            speed = {isa: gbs[isa] / gbs["scalar"] for isa in isas}
            results.append({"type": name, "case": case, "n": args.n, "rows": n_rows, "weight_bytes": len(w),
                            "stored": [isa for isa in isas if rows[isa][1]], "gb_per_s": gbs, "speedup_vs_scalar": speed})
            print(f"{name:6} {case:6} " + " ".join(f"{gbs[isa]:12.2f}" for isa in isas) + "   "
                  + " ".join(f"{isa} x{speed[isa]:.1f}" for isa in isas if isa != "scalar"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"isas": isas, "results": results}, f, indent=1)


def best_call(fn, calls: int = 50) -> float:
    fn()
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def prefill(args) -> None:
    isas = [isa for isa in kernels.supported_isas() if isa != "scalar"] or ["scalar"]
    results = []
    print(f"kernel sets: {', '.join(isas)}; one thread, {args.tokens} tokens, row length {args.n}, "
          f"{args.cache_kib} KiB of weights")
    print(f"{'type':6} " + " ".join(f"{isa + ' ps/w/tok':>16}" for isa in isas))
    for name in args.types.split(","):
        n_rows = whole_tiles(max(1, (args.cache_kib << 10) // quants.row_bytes(name, args.n)), args.stored)
        w, x_q = make(name, args.n, n_rows, n_tok=args.tokens)
        rows = layouts(name, w, args.n, isas, args.stored)
        ps = {isa: 1e12 * best_call(lambda: dot(name, rows[isa], x_q, args.n, isa))
              / (n_rows * args.n * args.tokens) for isa in isas}
        results.append({"type": name, "tokens": args.tokens, "n": args.n, "rows": n_rows,
                        "stored": [isa for isa in isas if rows[isa][1]], "ps_per_weight_token": ps})
        print(f"{name:6} " + " ".join(f"{ps[isa]:16.2f}" for isa in isas))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"isas": isas, "results": results}, f, indent=1)


def compare(args) -> None:
    a, b = args.compare.split(",")
    for isa in (a, b):
        if isa not in kernels.supported_isas():
            sys.exit(f"bench_kernels: kernel set {isa} is not available here ({', '.join(kernels.supported_isas())})")
    results = []
    print(f"{a} against {b}, alternating, median of {args.repeats} calls each; one thread, {args.tokens} tokens, "
          f"{args.cache_kib} KiB of weights")
    print(f"{'type':6} {'n':>6} {a + ' ps/w/tok':>16} {b + ' ps/w/tok':>16} {a + '/' + b:>12} {'max rel diff':>14}")
    for name in args.types.split(","):
        for n in (int(v) for v in args.n.split(",")):
            n_rows = whole_tiles(max(16, (args.cache_kib << 10) // quants.row_bytes(name, n)), args.stored)
            w, x_q = make(name, n, n_rows, n_tok=args.tokens)
            rows = layouts(name, w, n, (a, b), args.stored)
            ya, yb = (dot(name, rows[isa], x_q, n, isa).astype(np.float64) for isa in (a, b))
            differ = float(np.abs(ya - yb).max() / np.abs(yb).max())   # 0: the same floats
            times = {a: [], b: []}
            for _ in range(args.repeats):
                for isa in (a, b):
                    t0 = time.perf_counter()
                    dot(name, rows[isa], x_q, n, isa)
                    times[isa].append(time.perf_counter() - t0)
            ps = {isa: 1e12 * float(np.median(times[isa])) / (n_rows * n * args.tokens) for isa in (a, b)}
            results.append({"type": name, "n": n, "rows": n_rows, "tokens": args.tokens, "ps_per_weight_token": ps,
                            "ratio": ps[a] / ps[b], "max_rel_difference": differ})
            print(f"{name:6} {n:6} {ps[a]:16.2f} {ps[b]:16.2f} {ps[a] / ps[b]:12.2f} {differ:14.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"compare": [a, b], "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
