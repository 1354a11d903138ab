"""Asking for a GPU where none can be used: the model says why and runs on the CPU, with the
same logits as a CPU-only load. On a CPU-only build the reason is "built without CUDA"; on a CUDA
build without a usable device, that no device can be used. Also the ABI 1 size of
rm_model_params, the backend counters on the CPU, and residual_budget="auto" without a GPU."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import _native
from rapidmoe_gguf._native import ffi, lib

CUDA_BUILD = "cuda on" in _native.build_info()


@pytest.fixture(scope="module")
def tiny_pair(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-fallback") / "m.gguf"
    rm.convert(tiny_hf("qwen3_moe"), out, recipe="q4_0-q4_0", progress=False)
    return out


IDS = list(range(5, 37))


def _logits(path, **kw):
    with rm.Model(path, n_ctx=64, n_threads=2, **kw) as m:
        return m.eval_logits(IDS), m.backend, m.gpu_info


def test_gpu_fallback_runs_on_cpu_with_a_clear_warning(tiny_pair, caplog):
    ref, backend, info = _logits(tiny_pair)
    assert backend == "cpu" and not info["requested"] and info["note"] == ""
    with caplog.at_level(logging.WARNING, logger="rapidmoe"):
        with rm.Model(tiny_pair, n_ctx=64, n_threads=2, gpu_memory="1GiB") as m:
            got = m.eval_logits(IDS)
            assert m.backend == "cpu"
            assert m.gpu_info["requested"] and not m.gpu_info["active"]
            note = m.gpu_info["note"]
            assert m.plan is not None and m.plan.gpu_bytes <= m.plan.budget
    if CUDA_BUILD:
        if "no CUDA device can be used" not in note:
            pytest.skip("a GPU is present: the fallback is not exercised here")
    else:
        assert "built without CUDA" in note
    assert "running on the CPU" in note
    assert note in caplog.text
    np.testing.assert_array_equal(got, ref)


@pytest.mark.skipif(CUDA_BUILD, reason="checks the CPU-only build")
def test_gpu_fallback_cpu_build_info_says_cuda_off():
    assert "cuda off" in _native.build_info()


def test_gpu_fallback_abi1_params_size_still_loads(tiny_pair):
    """A caller built against ABI 1 passes the struct size before the GPU fields."""
    params = ffi.new("rm_model_params *")
    params.struct_size = ffi.offsetof("rm_model_params", "use_gpu")
    params.n_threads = 1
    params.use_gpu = 1        # beyond the size given: must be ignored
    out = ffi.new("rm_model **")
    _native.check(lib.rm_model_load(str(tiny_pair).encode(), params, out))
    try:
        gi = ffi.new("rm_gpu_info *")
        gi.struct_size = ffi.sizeof("rm_gpu_info")
        _native.check(lib.rm_model_gpu_info(out[0], gi))
        assert gi.requested == 0 and gi.active == 0
    finally:
        lib.rm_model_free(out[0])
    params.struct_size = ffi.offsetof("rm_model_params", "use_gpu") + 4
    with pytest.raises(rm.InvalidArgumentError, match="struct_size"):
        _native.check(lib.rm_model_load(str(tiny_pair).encode(), params, out))


def test_gpu_fallback_backend_stats_on_cpu(tiny_pair):
    with rm.Model(tiny_pair, n_ctx=64, n_threads=2) as m:
        m.eval(IDS[:8])
        m.eval([IDS[8]])
        st = m.backend_stats()
        assert st["backend"] == "cpu" and st["n_tokens"] == 9
        assert st["h2d_bytes"] == st["d2h_bytes"] == st["h2d_weight_bytes"] == 0
        assert st["auto_budget"] == -1.0
        m.clear_stats()
        assert m.backend_stats()["n_tokens"] == 0


def test_gpu_fallback_auto_budget_keeps_its_start_on_cpu(tiny_pair):
    with rm.Model(tiny_pair, n_ctx=64, n_threads=2, residual_policy="random", residual_budget="auto") as m:
        assert m.residual_budget == "auto"
        m.eval(IDS[:4])
        for t in IDS[4:8]:
            m.eval([t])
        st = m.backend_stats()
        assert st["auto_budget"] == pytest.approx(rm.model.AUTO_BUDGET["start"])
        assert m.stats()["budget"] == "auto"
    with pytest.raises(rm.InvalidArgumentError, match="auto"):
        rm.Model(tiny_pair, n_ctx=64, residual_policy="all", residual_budget="auto")
