"""The placement planner, by accounting: random budgets never overrun, every expert is placed
exactly once, the least-used experts leave the GPU first, a budget too small for the dense part
is a clear error; sizes read from real files agree with the loader's; the CLI prints the plan."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import cli, evaluate, planner
from rapidmoe_gguf.planner import Hardware, ModelSizes, PlanError, parse_bytes
from conftest import _CORPUS

HW = Hardware(host_bw_gbps=50.0)   # fixed, so no test measures the machine


def _sizes(seed=0, n_layer=48, n_expert=128, calibrated=True):
    """A Qwen3-30B-A3B-shaped model: Q3_K bases, Q8_0 residuals."""
    rng = np.random.default_rng(seed)
    E, F = 2048, 768
    base = planner._align(E * F * 110 // 256) * 3
    res = E * F * 34 // 32 * 3
    freq = rng.gamma(0.5, size=(n_layer, n_expert)) if calibrated else np.ones((n_layer, n_expert))
    freq /= freq.sum(1, keepdims=True)
    return ModelSizes(n_layer=n_layer, n_expert=n_expert, n_expert_used=8, n_embd=E, n_ff_exp=F, n_ff_shexp=0,
                      n_head=32, n_head_kv=4, head_dim=128, n_vocab=151936, dense_gpu=1_300_000_000, dense_host=0,
                      dense_read=1_300_000_000, expert_base=np.full((n_layer, n_expert), base, dtype=np.int64),
                      expert_residual=np.full((n_layer, n_expert), res, dtype=np.int64), frequency=freq,
                      calibrated=calibrated)


@pytest.mark.parametrize("seed", range(8))
def test_planner_random_budgets_never_overrun(seed):
    rng = np.random.default_rng(100 + seed)
    s = _sizes(seed)
    total = s.dense_gpu + int(s.expert_base.sum())
    for _ in range(6):
        budget = int(rng.uniform(2.5e9, 1.3 * total))
        n_ctx = int(rng.choice([512, 4096, 32768]))
        try:
            p = planner.plan(s, budget, n_ctx, n_batch=int(rng.choice([32, 256, 512])), hardware=HW)
        except PlanError:
            continue
        assert p.gpu_bytes <= p.budget
        assert p.gpu_bytes - p.gpu_parts["context_reserve"] <= p.cap
        mask = p.native_mask()
        assert mask.shape == (s.n_layer * s.n_expert,) and set(np.unique(mask)) <= {0, 1}
        assert p.n_experts_gpu + int((~p.expert_on_gpu).sum()) == s.n_layer * s.n_expert
        assert p.gpu_parts["expert_bases"] == int(s.expert_base[p.expert_on_gpu].sum())
        # nothing left out that would have fit
        left = p.cap - (p.gpu_bytes - p.gpu_parts["context_reserve"])
        if (~p.expert_on_gpu).any():
            assert left < s.expert_base[~p.expert_on_gpu].min()


def test_planner_least_used_experts_go_to_the_cpu_first():
    s = _sizes(3)
    full = planner.plan(s, "1TiB", 4096, hardware=HW)
    assert full.n_experts_gpu == full.n_experts
    assert any("every expert base fits" in m for m in full.messages)
    half = s.dense_gpu + int(s.expert_base.sum()) // 2 + 3 * 2**30
    p = planner.plan(s, half, 4096, hardware=HW)
    assert 0 < p.n_experts_gpu < p.n_experts
    assert s.frequency[~p.expert_on_gpu].max() <= s.frequency[p.expert_on_gpu].min()
    assert any("stay on the CPU at base precision" in m and "from calibration" in m for m in p.messages)
    # the CPU reads more and the GPU less as the budget shrinks
    assert p.per_token["cpu_read"] > full.per_token["cpu_read"]
    assert p.per_token["gpu_read"] < full.per_token["gpu_read"]


def test_planner_uniform_usage_without_calibration():
    s = _sizes(calibrated=False)
    p = planner.plan(s, s.dense_gpu + int(s.expert_base.sum()) // 3 + 3 * 2**30, 4096, hardware=HW)
    assert any("uniform usage assumed" in m for m in p.messages)
    # ties break in layer order: the GPU gets whole leading layers first
    on = p.expert_on_gpu.ravel()
    assert on[: p.n_experts_gpu].all() and not on[p.n_experts_gpu:].any()


def test_planner_budget_too_small_for_the_dense_part_is_an_error():
    s = _sizes()
    with pytest.raises(PlanError, match="cannot hold the dense part"):
        planner.plan(s, "1GiB", 4096, hardware=HW)
    with pytest.raises(PlanError, match="KV cache for 262144 positions"):
        planner.plan(s, "8GiB", 262144, hardware=HW)


def test_planner_parse_bytes():
    assert parse_bytes("8GiB") == parse_bytes("8G") == parse_bytes("8 gib") == 8 * 2**30
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("1.5K") == 1536
    assert parse_bytes(12345) == 12345
    for bad in ("", "8XB", "-1G", "iB", "G"):
        with pytest.raises(rm.InvalidArgumentError):
            parse_bytes(bad)


def test_planner_crossover_follows_the_cost_model():
    s = _sizes()
    slow_bus = planner.crossover_tokens(s, Hardware(pcie_gbps=4.0, cpu_gflops=200.0), 50.0)
    fast_bus = planner.crossover_tokens(s, Hardware(pcie_gbps=50.0, cpu_gflops=200.0), 50.0)
    assert fast_bus <= slow_bus and fast_bus > 0
    # the copy wins exactly where the model says so
    n = fast_bus
    hw = Hardware(pcie_gbps=50.0, cpu_gflops=200.0)
    r = float(s.expert_residual.max())
    cpu = lambda k: max(r / 50e9, 2 * k * s.expert_params / (hw.cpu_gflops * 1e9))  # noqa: E731
    gpu = lambda k: r / (hw.pcie_gbps * 1e9) + hw.pcie_latency_us * 1e-6 + 2 * k * s.expert_params / (hw.gpu_tflops * 1e12)  # noqa: E731
    assert gpu(n) < cpu(n) and (n == 1 or gpu(n - 1) >= cpu(n - 1))
    s.expert_residual[:] = 0
    assert planner.crossover_tokens(s, hw, 50.0) == 0


@pytest.fixture(scope="module")
def tiny_pair(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("planner") / "m.gguf"
    rm.convert(tiny_hf("qwen3_moe"), out, recipe="q4_0-q4_0", progress=False)
    return out


def test_planner_sizes_from_files_match_the_loader(tiny_pair):
    s = ModelSizes.from_files(tiny_pair)
    with rm.Model(tiny_pair, n_ctx=32, n_threads=1) as m:
        info = m.info
    assert (s.n_layer, s.n_expert, s.n_embd, s.n_vocab) == (info["n_layer"], info["n_expert"], info["n_embd"], info["n_vocab"])
    assert int(s.expert_residual.sum()) == info["residual_expert_bytes"]
    assert info["base_expert_bytes"] <= int(s.expert_base.sum()) < info["base_expert_bytes"] + 256 * s.expert_base.size * 3
    assert s.dense_read == info["dense_bytes"]
    assert not s.calibrated and np.allclose(s.frequency, 1.0 / s.n_expert)


def test_planner_reads_calibrated_frequencies(tiny_pair, tmp_path):
    import shutil

    base = tmp_path / "c.gguf"
    shutil.copy(tiny_pair, base)
    shutil.copy(str(tiny_pair).replace(".gguf", ".residual.gguf"), tmp_path / "c.residual.gguf")
    evaluate.calibrate(str(base), " ".join(_CORPUS), n_ctx=32, max_tokens=64, n_threads=2)
    s = ModelSizes.from_files(base)
    assert s.calibrated
    np.testing.assert_allclose(s.frequency.sum(1), 1.0, rtol=1e-6)


def test_planner_cli_plan_json(tiny_pair, capsys):
    assert cli.main(["plan", str(tiny_pair), "--gpu-mem", "1GiB", "--ctx", "64", "--json", "--host-bw", "40"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu_bytes"] <= out["budget_bytes"] == 2**30
    assert out["n_experts_gpu"] == out["n_experts"] == 2 * 4
    assert out["per_token_bytes"]["bus"] > 0
    assert cli.main(["plan", str(tiny_pair), "--gpu-mem", "1GiB", "--ctx", "64", "--host-bw", "40"]) == 0
    text = capsys.readouterr().out
    assert "expert bases on the GPU: 8 of 8" in text and "prefill crossover" in text
    assert cli.main(["plan", str(tiny_pair), "--gpu-mem", "100MiB", "--ctx", "64", "--host-bw", "40"]) == 1
    assert "cannot hold the dense part" in capsys.readouterr().err


def test_planner_counts_every_session():
    s = _sizes()
    one = planner.plan(s, "24GiB", 4096, hardware=HW)
    three = planner.plan(s, "24GiB", 4096, hardware=HW, n_sessions=3)
    for k in ("kv_cache", "activations", "split_scratch"):
        assert three.gpu_parts[k] == 3 * one.gpu_parts[k]
    assert three.gpu_bytes <= three.budget and three.n_experts_gpu <= one.n_experts_gpu


def test_planner_session_sizes_are_the_librarys(tiny_pair):
    """The planner's session bytes are rm_session_sizes_get's, whose parts a stand-in session
    allocates exactly: a fork's device bytes are its KV cache, activations and split buffers."""
    s = ModelSizes.from_files(tiny_pair)
    parts = planner.session_device_bytes(s, 32, 8, upload_residuals=False)
    assert parts["kv_cache"] == 2 * 4 * s.n_layer * s.n_head_kv * s.head_dim * 32
    assert s.kv_bytes_per_pos * 32 == parts["kv_cache"]
    with rm.Model(tiny_pair, n_ctx=32, n_batch=8, n_threads=1, gpu_memory="1GiB", gpu_backend="standin",
                  hardware=Hardware(host_bw_gbps=50.0, pcie_gbps=1e-6), gpu_sessions=2) as m:
        assert m.plan.crossover_tokens == 0            # no staging buffer
        before = m.gpu_info["used_bytes"]
        with m.fork_session():
            assert m.gpu_info["used_bytes"] - before == sum(parts.values())
    with pytest.raises(rm.InvalidArgumentError, match="n_ctx is 0"):
        planner.session_device_bytes(s, 0, 8, upload_residuals=False)


def test_planner_model_load_parses_each_header_once(tiny_pair, monkeypatch):
    from rapidmoe_gguf import gguf_file, gguf_header

    opened = []
    real_init, real_read = gguf_file.GGUFFile.__init__, gguf_header.read_header
    monkeypatch.setattr(gguf_file.GGUFFile, "__init__", lambda self, p: (opened.append(os.fspath(p)), real_init(self, p))[1])
    monkeypatch.setattr(gguf_header, "read_header", lambda p, **kw: (opened.append(os.fspath(p)), real_read(p, **kw))[1])
    with rm.Model(tiny_pair, n_ctx=32, n_threads=1, gpu_memory="1GiB", gpu_backend="standin",
                  hardware=Hardware(host_bw_gbps=50.0)) as m:
        assert m.residual_path is not None and m.plan is not None
    assert sorted(opened) == sorted([str(tiny_pair), m.residual_path])
