"""The CUDA backend through the Python API, on a machine with a usable GPU (skipped elsewhere;
tools/device_check.sh runs it). Oracle: the same model on the CPU backend. The GPU keeps
activations in fp32 where the CPU rounds them to Q8 blocks, so logits agree within a mean KL
divergence of 1e-3, not bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import evaluate, planner
from conftest import _CORPUS

IDS = list(range(5, 53))
N_DECODE = 16


@pytest.fixture(scope="module")
def pair(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-device") / "m.gguf"
    rm.convert(tiny_hf("qwen3_moe", weight_std=0.02, head_std=0.1), out, recipe="q3k-q8", progress=False)
    evaluate.calibrate(str(out), " ".join(_CORPUS), n_ctx=64, max_tokens=256, n_threads=2)
    with rm.Model(out, n_ctx=32, gpu_memory="4GiB") as m:
        if m.backend != "cuda":
            pytest.skip(f"no usable GPU: {m.gpu_info['note']}")
    return out


def _run(path, **kw):
    with rm.Model(path, n_ctx=128, n_threads=4, **kw) as m:
        first = m.eval_logits(IDS[:32])
        m.clear_stats()
        rest = [m.eval([t]) for t in IDS[32:32 + N_DECODE]]
        return np.concatenate([first, np.stack(rest)]), m.backend_stats(), m.gpu_info, m.backend


def _kl(p_logits, q_logits):
    lp = evaluate._log_softmax(p_logits.astype(np.float64))
    lq = evaluate._log_softmax(q_logits.astype(np.float64))
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


@pytest.mark.parametrize("policy,budget", [("none", 0.0), ("all", 0.0), ("random", 0.3), ("umia", 0.2)])
def test_gpu_device_logits_match_cpu(pair, policy, budget):
    ref, _, _, backend = _run(pair, residual_policy=policy, residual_budget=budget)
    assert backend == "cpu"
    got, st, info, backend = _run(pair, residual_policy=policy, residual_budget=budget, gpu_memory="4GiB")
    assert backend == "cuda" and info["active"]
    assert np.isfinite(got).all()
    assert _kl(ref, got) <= 1e-3
    assert st["h2d_weight_bytes"] == 0


def test_gpu_device_decode_moves_only_activations(pair):
    _, st, info, _ = _run(pair, residual_policy="all", gpu_memory="4GiB")
    s = planner.ModelSizes.from_files(pair)
    assert st["backend"] == "cuda" and st["n_tokens"] == N_DECODE
    assert st["h2d_weight_bytes"] == 0
    # per token and layer at most: routing, tables, the block input, and per slot the fix rows'
    # gate/up down, h' and the result up; plus the token's embedding up and its logits down
    K, E, F = s.n_expert_used, s.n_embd, s.n_ff_exp
    per_layer = 16 * K + 56 * K + 160 + 4 * E + K * 4 * (3 * F + E)
    bound = s.n_layer * per_layer + 4 * E + 4 * s.n_vocab
    assert (st["h2d_bytes"] + st["d2h_bytes"]) / N_DECODE <= bound
    assert st["n_layer_steps"] > 0
    assert info["used_bytes"] <= info["budget_bytes"]


def test_gpu_device_experts_kept_on_the_cpu(pair):
    sizes = planner.ModelSizes.from_files(pair)
    full = planner.plan(sizes, "4GiB", 128)
    budget = full.gpu_bytes - full.gpu_parts["expert_bases"] // 2
    ref, _, _, _ = _run(pair, residual_policy="all")
    got, st, info, backend = _run(pair, residual_policy="all", gpu_memory=budget)
    assert backend == "cuda"
    assert 0 < info["n_experts_on_gpu"] < info["n_experts_total"]
    assert info["used_bytes"] <= info["budget_bytes"] <= budget
    assert _kl(ref, got) <= 1e-3
    assert st["h2d_weight_bytes"] == 0


def test_gpu_device_auto_budget_moves(pair):
    with rm.Model(pair, n_ctx=128, n_threads=4, residual_policy="umia", residual_budget="auto",
                  gpu_memory="4GiB") as m:
        m.eval(IDS[:8])
        for t in IDS[8:40]:
            m.eval([t])
        st = m.backend_stats()
        assert 0.0 <= st["auto_budget"] <= rm.model.AUTO_BUDGET["max_budget"]
        assert st["auto_budget"] != pytest.approx(rm.model.AUTO_BUDGET["start"])
        assert st["device_ms"] > 0 and st["host_ms"] > 0


def test_gpu_device_calibration_needs_the_cpu(pair):
    from rapidmoe_gguf import _native
    from rapidmoe_gguf._native import lib

    with rm.Model(pair, n_ctx=64, gpu_memory="4GiB") as m:
        with pytest.raises(rm.NeedsCPUError, match="calibration runs on the CPU"):
            _native.check(lib.rm_session_set_calibration(m._live(), 1))


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_5_moe", "qwen3_next"])
def test_gpu_device_latent_and_linear_attention_match_cpu(pair, tmp_path, family):
    """Multi-head latent attention (cuda/mla.cu) and the Gated DeltaNet layers (cuda/gdn.cu, the
    recurrent states on the device) against the CPU: a prompt, tokens one at a time, and a batch
    of sequences."""
    if family == "deepseek_v3":
        from test_arch_deepseek import make_checkpoint as make
    else:
        from test_arch_qwen35 import make_tiny_hybrid as make
    make(tmp_path / "hf", family)
    path = tmp_path / "m.gguf"
    rm.convert(tmp_path / "hf", path, recipe="f32", progress=False)
    ids = list(range(3, 40))
    out = {}
    for kind, kw in (("cpu", {}), ("cuda", {"gpu_memory": "4GiB"})):
        with rm.Model(path, n_ctx=64, n_threads=4, **kw) as m:
            assert m.backend == kind
            first = m.eval_logits(ids[:24])
            rest = [m.eval([t]) for t in ids[24:]]
            out[kind] = np.concatenate([first, np.stack(rest)])
            out[kind + "-batch"] = m.generate_many([ids[:5], ids[3:11], ids[:2]], max_tokens=6, temperature=0)
    assert np.isfinite(out["cuda"]).all()
    assert _kl(out["cpu"], out["cuda"]) <= 1e-3
    assert out["cuda-batch"] == out["cpu-batch"]
