#!/usr/bin/env python3
"""Causal changes tried against UMIA (docs/UMIA.md, "Tried and not kept").

    python tools/umia_gradient_scores.py [--calib-chunks 8] [--point 0] [--other /usr/share/common-licenses/GPL-3]
    python tools/umia_gradient_scores.py --oracle-layer-shares

Default: the downstream sensitivity of each (layer, expert) from gradients of the oracle's f32 twin.
With --oracle-layer-shares: UMIA's score within each layer, but each layer's share of the budget
taken from the oracle's selection on the calibration chunks (how much of the gap the split
across layers is).

d[l, e] = the twin's first-order KL gain of the expert's slots (-dKL/dm at m = --point, against
the twin's all-residual output), summed over calibration chunks and divided by those slots' summed
router weights; score = g * d[l, e], spent across layers with UMIA's global threshold (its
quantiles from the calibration slots). Calibration: held-out chunks of the bundled model after
the --chunks evaluated ones (disjoint from them). Evaluated against all residuals on the bundled
held-out text and on --other (text of another kind), beside UMIA with the shipped tables.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rapidmoe_gguf as rm  # noqa: E402
from rapidmoe_gguf import oracle, umia  # noqa: E402
from rapidmoe_gguf.bundled import bundled_heldout_path, bundled_model_path  # noqa: E402
from rapidmoe_gguf.evaluate import perplexity  # noqa: E402


def gradient_tables(m, ref, pair, ids, n_ctx: int, point: float) -> umia.Tables:
    L, X, K = m.info["n_layer"], m.info["n_expert"], m.info["n_expert_used"]
    problem = oracle.make_problem(ref, ids, n_ctx, None, L, K)
    C = len(problem.chunks)
    gain = -oracle.kl_gradient(pair, problem, np.full((C, n_ctx, L, K), point), oracle.twin_reference(pair, problem))
    m.set_residual("all")
    m.set_calibration(True)
    routes = []
    try:
        for c in problem.chunks:
            m.eval_logits(c)
            routes.append(m.route_log())
    finally:
        m.set_calibration(False)
    E = np.stack([r[0] for r in routes])   # (chunk, token, layer, slot)
    G = np.stack([r[1] for r in routes])
    d = np.full((L, X), np.nan)
    for layer in range(L):
        for e in range(X):
            on = E[:, :, layer] == e
            if on.any():
                d[layer, e] = gain[:, :, layer][on].sum() / max(G[:, :, layer][on].sum(), 1e-12)
        d[layer, np.isnan(d[layer])] = np.nanmean(d[layer])
    d = np.maximum(d, 1e-6 * np.abs(d).max())
    t = copy.deepcopy(m.umia_tables)
    t.expert_sensitivity, t.layer_sensitivity = d, np.ones(L)   # layer term 1: d carries the layer
    qs = np.linspace(0.0, 1.0, umia.N_QUANTILES)
    t.quantiles["umia"] = np.stack([np.quantile(np.log(G[:, :, layer].ravel())
                                                + np.log(d[layer][E[:, :, layer].ravel()]), qs)
                                    for layer in range(L)])
    return t


def oracle_layer_policy(m, ref, pair, ids, n_ctx: int, budget: float) -> tuple[umia.PolicyArrays, np.ndarray]:
    """UMIA's arrays at budget with each layer's share from the oracle's selection on ids."""
    L, K = m.info["n_layer"], m.info["n_expert_used"]
    problem = oracle.make_problem(ref, ids, n_ctx, None, L, K)
    res = oracle.search(m, pair, problem, budget, polish=100, relaxed=0, iterations=0)
    share = res.selection.mean(axis=(0, 1, 3))
    t = m.umia_tables
    lp = np.log(t.layer_sensitivity)
    q = t.quantiles["umia"] + ((umia.LAYER_POWER - 1.0) * lp)[:, None]
    p = np.linspace(0.0, 1.0, umia.N_QUANTILES)
    thr = np.array([np.interp(1.0 - s, p, q[layer]) for layer, s in enumerate(share)])
    arr = umia.PolicyArrays(umia.KIND["umia"], share, thr, expert_score=t.expert_sensitivity.astype(np.float32),
                            layer_score=np.exp(umia.LAYER_POWER * lp).astype(np.float32))
    return arr, share


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=24, help="evaluated chunks of each text")
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--point", type=float, default=0.0, help="the m at which the gradient is taken")
    ap.add_argument("--other", default="/usr/share/common-licenses/GPL-3", help="text of another kind")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--oracle-layer-shares", action="store_true", help="try the oracle's split across layers instead")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    path = bundled_model_path()
    with rm.Model(path, n_ctx=args.ctx, n_threads=1) as m, rm.Model(path, n_ctx=args.ctx, n_threads=1) as ref:
        pair = oracle.TorchPair(path, m.residual_path)
        ref.set_residual("all")
        held = m.tokenize(Path(bundled_heldout_path()).read_text(encoding="utf-8"), add_special=False)
        other = m.tokenize(Path(args.other).read_text(encoding="utf-8"), add_special=False)
        start = args.chunks * args.ctx
        calib = held[start:start + args.calib_chunks * args.ctx]
        shipped = m.umia_tables
        texts = (("held-out", held), (Path(args.other).name, other))
        if args.oracle_layer_shares:
            for b in (0.05, 0.1, 0.25):
                arr, share = oracle_layer_policy(m, ref, pair, calib, args.ctx, b)
                for name, ids in texts:
                    n = min(args.chunks, len(ids) // args.ctx)
                    kl = {}
                    for label in ("none", "umia", "oracle shares"):
                        m.set_residual(label if label != "oracle shares" else "umia", b)
                        if label == "oracle shares":
                            m._apply_policy(arr)
                        kl[label] = perplexity(m, ids, args.ctx, reference=ref, max_chunks=n).kld_mean
                    print(f"{name} ({n} chunks) b={b:g}: oracle's layer shares {share.round(3).tolist()}: closed "
                          f"{1 - kl['oracle shares'] / kl['none']:.0%}; umia {1 - kl['umia'] / kl['none']:.0%}", flush=True)
            return 0
        grad = gradient_tables(m, ref, pair, calib, args.ctx, args.point)
        for name, ids in texts:
            n = min(args.chunks, len(ids) // args.ctx)
            m.set_residual("none")
            none = perplexity(m, ids, args.ctx, reference=ref, max_chunks=n).kld_mean
            for b in (0.05, 0.1, 0.25):
                out = []
                for label, tables in (("umia", shipped), ("gradient", grad)):
                    m.umia_tables = tables
                    m.set_residual("umia", b)
                    r = perplexity(m, ids, args.ctx, reference=ref, max_chunks=n)
                    out.append(f"{label} KLD {r.kld_mean:.6f} closed {1 - r.kld_mean / none:.0%} rate {r.residual_rate:.3f}")
                m.umia_tables = shipped
                print(f"{name} ({n} chunks) b={b:g}: none {none:.6f} | " + " | ".join(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
