"""``rapidmoe bench``: prefill and decode speed of one model on this machine, and where the time
goes (``--profile``).

Token ids are drawn at random from the vocabulary (seeded), so no tokenizer or text is involved
and every run of a given size feeds the same ids. Decode evaluates one token at a time after a
short prompt and reports tokens/s and the per-token latency's median and 99th percentile;
prefill evaluates one prompt in batches of ``n_batch``. Each figure is the median over ``runs``
runs. For a comparison with llama.cpp on the same file, see tools/bench_vs_llamacpp.py."""

from __future__ import annotations

import time

import numpy as np

from .kernels import cpu_isa, cpu_isa_reason

PARTS_DOC = {
    "embed": "token rows looked up",
    "attn_in": "attention norm, Q/K/V products",
    "attn": "RoPE, KV cache, attention",
    "attn_out": "attention output product",
    "router": "MoE norm, router, top-k, residual choice",
    "experts_in": "experts: gate and up products",
    "experts_out": "experts: down products",
    "experts_other": "experts: gathers, SwiGLU, sums",
    "shared": "shared expert, residual add",
    "output": "final norm, output head",
}


def _median(xs):
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def run(model, *, prompt: int = 16, decode: int = 64, prefill: int = 512, runs: int = 3, seed: int = 0,
        profile: bool = False) -> dict:
    """Measures ``model`` (a rapidmoe_gguf.Model); returns the figures as a dict."""
    if min(prompt, decode, prefill, runs) < 1:
        raise ValueError("prompt, decode, prefill and runs must be >= 1")
    if max(prompt + decode, prefill) > model.n_ctx:
        raise ValueError(f"a context of {model.n_ctx} tokens cannot hold the {max(prompt + decode, prefill)} "
                         "this benchmark evaluates: raise --ctx")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.n_vocab, size=max(prompt + decode, prefill), dtype=np.int32)
    dec_rates, p50s, p99s, pre_rates = [], [], [], []
    prof_dec, prof_pre = [], []
    for _ in range(runs):
        model.reset()
        model.eval(ids[:prompt])
        model.clear_stats()
        lat = np.empty(decode)
        for i in range(decode):
            t0 = time.perf_counter()
            model.eval(ids[prompt + i:prompt + i + 1])
            lat[i] = time.perf_counter() - t0
        dec_rates.append(decode / lat.sum())
        p50s.append(float(np.percentile(lat, 50)))
        p99s.append(float(np.percentile(lat, 99)))
        prof_dec.append(model.profile())
        model.reset()
        model.clear_stats()
        t0 = time.perf_counter()
        model.eval(ids[:prefill])
        pre_rates.append(prefill / (time.perf_counter() - t0))
        prof_pre.append(model.profile())
    out = {"model": model.path, "n_threads": model.info["n_threads"], "backend": model.backend,
           "cpu_kernels": cpu_isa(), "cpu_kernels_reason": cpu_isa_reason(),
           "residual_policy": model.residual_policy if model.residual_path else None,
           "residual_budget": model.residual_budget if model.residual_path else None,
           "runs": runs, "prompt": prompt, "decode_tokens": decode, "prefill_tokens": prefill,
           "decode_tok_s": _median(dec_rates), "decode_p50_ms": 1e3 * _median(p50s),
           "decode_p99_ms": 1e3 * _median(p99s), "prefill_tok_s": _median(pre_rates),
           "decode_tok_s_all": dec_rates, "prefill_tok_s_all": pre_rates}
    if profile:
        out["profile"] = {
            "decode_ms_per_token": {k: 1e3 * _median([p["decode"][k] / p["tokens"]["decode"] for p in prof_dec])
                                    for k in PARTS_DOC},
            "prefill_ms_per_token": {k: 1e3 * _median([p["prefill"][k] / p["tokens"]["prefill"] for p in prof_pre])
                                     for k in PARTS_DOC},
        }
    return out


def format_report(r: dict) -> str:
    lines = [f"{r['model']}: {r['backend']} ({r['cpu_kernels']} kernels), {r['n_threads']} threads"
             + (f", residual {r['residual_policy']} at {r['residual_budget']}" if r["residual_policy"] else ""),
             f"  kernels: {r['cpu_kernels']}, {r.get('cpu_kernels_reason', '')}",
             f"  decode  {r['decode_tok_s']:8.2f} tok/s   per token p50 {r['decode_p50_ms']:.2f} ms, "
             f"p99 {r['decode_p99_ms']:.2f} ms   ({r['decode_tokens']} tokens after {r['prompt']}, "
             f"median of {r['runs']})",
             f"  prefill {r['prefill_tok_s']:8.2f} tok/s   ({r['prefill_tokens']} tokens, median of {r['runs']})"]
    prof = r.get("profile")
    if prof:
        dec, pre = prof["decode_ms_per_token"], prof["prefill_ms_per_token"]
        td, tp = sum(dec.values()) or 1.0, sum(pre.values()) or 1.0
        lines.append("")
        lines.append(f"  {'part':<14} {'decode ms/tok':>14} {'%':>6} {'prefill ms/tok':>15} {'%':>6}   what")
        for k, doc in PARTS_DOC.items():
            lines.append(f"  {k:<14} {dec[k]:14.3f} {100 * dec[k] / td:6.1f} {pre[k]:15.3f} {100 * pre[k] / tp:6.1f}   {doc}")
        lines.append(f"  {'total':<14} {td:14.3f} {100.0:6.1f} {tp:15.3f} {100.0:6.1f}")
    return "\n".join(lines)
