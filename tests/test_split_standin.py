"""The CPU/GPU split end to end without a GPU: the CPU stand-in device (gpu_backend="standin").

The stand-in is a second CPU backend posing as the device: its own buffers under its own memory
budget, the same placement as CUDA (devweights.c) and the same split of each MoE block (split.c),
and every copy across its "bus" counted. Its kernels are the CPU backend's and the split adds the
experts' results in the CPU backend's order, so its logits must equal a CPU-only run's exactly
(see _same); decode must move only activations, in
exactly the amounts docs/SPLIT.md gives; the budget is a hard cap that the planner's sums
predict; prefill copies a residual to the device only past the crossover."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import _native, evaluate, planner
from rapidmoe_gguf._native import ffi, lib
from rapidmoe_gguf.errors import RapidMoEError
from conftest import _CORPUS

HW = planner.Hardware(host_bw_gbps=50.0, context_reserve=0)   # fixed: no test measures the machine
TEXT = " ".join(_CORPUS)
N_CTX = 96


@pytest.fixture(scope="module")
def wide_pair(tiny_hf, tmp_path_factory):
    """A calibrated q2k-q4 pair of a tiny Qwen3-MoE with 16 experts, top-4: enough experts per
    token that placement splits them, and enough slots that sums run in different orders."""
    src = tiny_hf("qwen3_moe", num_experts=16, num_experts_per_tok=4)
    out = tmp_path_factory.mktemp("standin") / "wide.gguf"
    rm.convert(src, out, recipe="q2k-q4", progress=False)
    evaluate.calibrate(str(out), TEXT, n_ctx=64, max_tokens=256, n_threads=2)
    return out


def _budgets(path):
    """Device budgets that hold every expert base, about half of them, and none."""
    full = planner.plan_files(path, 1 << 34, N_CTX, n_batch=32, hardware=HW)
    fixed = full.gpu_bytes - full.gpu_parts["expert_bases"]
    bases = full.gpu_parts["expert_bases"]
    return {"all": fixed + bases, "half": fixed + bases // 2, "none": fixed}


def _model(path, **kw):
    return rm.Model(path, n_ctx=N_CTX, n_batch=32, n_threads=2, hardware=HW, **kw)


def _same(got, ref):
    """The same floats, bit for bit. The stand-in runs the CPU backend's kernels, which give each
    row the same floats however many rows a product has (tests/test_kernels.py: one token alone,
    several, and the AMX tiles alike), and the split adds a token's expert results in the CPU
    backend's order, one weighted add per slot with a fix slot's base and residual down products
    summed first (split.h, rm_split_layout), so no step is left to the order of float sums.

    A tolerance would test less than it seems to: these products quantize their activations to
    int8, so a last-bit difference in one layer can flip a rounding in the next and move the logits
    by far more than float rounding. With the old order (slot order, three separate combines) 13 of
    40 fixture seeds gave up to 1.3e-2 of the largest logit on the AMX kernel set (17 on AVX2, 10
    scalar), so a bound of 1e-4 passed or failed by the draw of the weights."""
    np.testing.assert_array_equal(got, ref)


POLICIES = [("none", 0.0), ("all", 1.0), ("umia", 0.25), ("random", 0.5)]


@pytest.mark.parametrize("placement", ["all", "half", "none"])
@pytest.mark.parametrize("policy,budget", POLICIES)
def test_standin_logits_equal_cpu(wide_pair, placement, policy, budget):
    ids = list(range(3, 40))
    with _model(wide_pair, residual_policy=policy, residual_budget=budget) as cpu, \
            _model(wide_pair, residual_policy=policy, residual_budget=budget,
                   gpu_memory=_budgets(wide_pair)[placement], gpu_backend="standin") as dev:
        assert dev.backend == "standin" and cpu.backend == "cpu"
        n_on = dev.gpu_info["n_experts_on_gpu"]
        total = dev.gpu_info["n_experts_total"]
        assert n_on == dev.plan.n_experts_gpu
        assert {"all": n_on == total, "half": 0 < n_on < total, "none": n_on == 0}[placement]
        _same(dev.eval_logits(ids), cpu.eval_logits(ids))     # prefill, 37 tokens in two batches
        for t in (5, 17, 29, 41, 53, 65):                      # decode
            _same(dev.eval([t]), cpu.eval([t]))
        if policy == "random":
            return          # the two sessions draw their own random numbers: same law, other slots
        np.testing.assert_array_equal(dev.stats()["residual"], cpu.stats()["residual"])


def _layout_bytes(n_slots: int) -> int:
    """The plan's tables for n_slots slots (rm_split_layout_for in native/src/devices/split.c)."""
    pad = lambda n: (n + 15) // 16 * 16
    return 2 * pad(12 * n_slots) + 6 * pad(4 * n_slots)


@pytest.mark.parametrize("placement", ["all", "half", "none"])
def test_standin_decode_moves_only_activations(wide_pair, placement):
    """Per decoded token, exactly: the embedding row up; per layer the routes down (16 bytes a
    slot) and the plan's tables up; in a layer with host work, the block input down, each fix
    slot's base gate/up down and its h' up, and one result row per host row up; the logits down.
    No weight byte."""
    with _model(wide_pair, residual_policy="umia", residual_budget=0.3,
                gpu_memory=_budgets(wide_pair)[placement], gpu_backend="standin") as dev:
        i = dev.info
        L, K, E, F, V = i["n_layer"], i["n_expert_used"], i["n_embd"], i["n_ff_exp"], i["n_vocab"]
        on = dev.plan.expert_on_gpu
        dev.eval(list(range(3, 20)))
        saw_fix = saw_host = 0
        for t in range(30, 50):
            dev.clear_stats()
            dev.eval([t])
            st, bs = dev.stats(), dev.backend_stats()
            fix = (st["residual"] * on).sum(axis=1)               # residual slots of device experts
            host = (st["active"] * ~on).sum(axis=1)               # slots of experts kept on the host
            work = (fix + host) > 0
            assert bs["h2d_weight_bytes"] == 0
            assert bs["d2h_bytes"] == 4 * V + L * 16 * K + int((work * 4 * E + fix * 8 * F).sum())
            assert bs["h2d_bytes"] == 4 * E + L * _layout_bytes(K) + int((work * 4 * (fix * F + (fix + host) * E)).sum())
            assert bs["n_layer_steps"] == int(work.sum())
            saw_fix += int(fix.sum())
            saw_host += int(host.sum())
        assert (saw_fix > 0) == (placement != "none")     # fix slots need a device base
        assert (saw_host > 0) == (placement != "all")


@pytest.mark.parametrize("placement", ["all", "half", "none"])
def test_standin_memory_is_what_the_planner_predicts(wide_pair, placement):
    budget = _budgets(wide_pair)[placement]
    with _model(wide_pair, gpu_memory=budget, gpu_backend="standin") as dev:
        gi, p = dev.gpu_info, dev.plan
        assert gi["budget_bytes"] == p.cap == budget
        assert gi["weight_bytes"] == p.gpu_parts["dense_weights"] + p.gpu_parts["expert_bases"]
        used = gi["used_bytes"]
        assert used <= p.gpu_bytes <= budget
        assert p.gpu_bytes - used < 0.01 * p.gpu_bytes      # the plan's sums are the library's, tables rounded up
        # a second session does not fit the budget made for one: a clear error, nothing leaks
        with pytest.raises(MemoryError, match=r"session buffers: [0-9.]+ [KMG]iB more device memory would exceed the budget"):
            dev.fork_session()
        assert dev.gpu_info["used_bytes"] == used
        dev.eval([5, 6, 7])


def test_standin_budget_is_enforced_by_the_library(wide_pair):
    """The library refuses past the budget on its own (not only through the planner)."""
    w = _budgets(wide_pair)
    params = ffi.new("rm_model_params *")
    params.struct_size = ffi.sizeof("rm_model_params")
    params.n_threads = 2
    params.use_gpu = 2
    out = ffi.new("rm_model **")
    params.gpu_memory_bytes = w["none"] // 4      # not even the dense weights fit
    assert lib.rm_model_load(str(wide_pair).encode(), params, out) == lib.RM_E_OOM
    msg = ffi.string(lib.rm_last_error()).decode()
    assert "the weights placed on the GPU" in msg and "exceed the budget" in msg
    params.use_gpu = 7
    assert lib.rm_model_load(str(wide_pair).encode(), params, out) == lib.RM_E_INVALID_ARG
    assert "use_gpu 7" in ffi.string(lib.rm_last_error()).decode()


def test_standin_prefill_copies_residuals_past_the_crossover(wide_pair):
    ids = list(range(3, 35))
    budget = _budgets(wide_pair)["all"]
    never = dataclasses.replace(HW, pcie_gbps=1e-6)       # copies never pay: the host computes them
    with _model(wide_pair, residual_policy="all", residual_budget=1.0) as cpu, \
            _model(wide_pair, residual_policy="all", residual_budget=1.0, gpu_memory=budget,
                   gpu_backend="standin") as dev:
        cross = dev.plan.crossover_tokens
        assert 0 < cross < 32          # some expert of a 32-token batch can pass it
        ref = cpu.eval_logits(ids)
        dev.clear_stats()
        _same(dev.eval_logits(ids), ref)
        copied = dev.backend_stats()["h2d_weight_bytes"]
        res = dev.stats()["residual"]
        per = planner.ModelSizes.from_files(wide_pair).expert_residual
        # each (layer, expert) with at least `cross` residual rows in a batch of 32, at most 4 per layer
        want = sum(int(per[l, e]) for l in range(res.shape[0])
                   for e in sorted(np.nonzero(res[l] >= cross)[0])[:4])
        assert copied == want > 0
    with rm.Model(wide_pair, n_ctx=N_CTX, n_batch=64, n_threads=2, hardware=never, residual_policy="all",
                  residual_budget=1.0, gpu_memory=budget, gpu_backend="standin") as dev:
        assert dev.plan.crossover_tokens == 0
        _same(dev.eval_logits(ids), ref)
        assert dev.backend_stats()["h2d_weight_bytes"] == 0


def test_standin_auto_budget_follows_measured_times(wide_pair):
    with _model(wide_pair, residual_budget="auto", gpu_memory=_budgets(wide_pair)["all"],
                gpu_backend="standin") as dev:
        start = dev.backend_stats()["auto_budget"]
        assert start == pytest.approx(0.05)
        dev.eval(list(range(3, 10)))
        seen = set()
        for t in range(10, 40):
            dev.eval([t])
            seen.add(round(dev.backend_stats()["auto_budget"], 6))
        assert len(seen) > 1 and all(0.0 <= b <= 0.5 for b in seen)
        assert dev.backend_stats()["n_layer_steps"] > 0


def test_standin_refuses_calibration_and_bad_backend_names(wide_pair):
    with _model(wide_pair, gpu_memory=_budgets(wide_pair)["all"], gpu_backend="standin") as dev:
        with pytest.raises(RapidMoEError, match="calibration runs on the CPU backend"):
            _native.check(lib.rm_session_set_calibration(dev._live(), 1))
        dev.eval([5, 6])                    # the session is unharmed
    with pytest.raises(RapidMoEError, match="gpu_backend"):
        _model(wide_pair, gpu_memory="1GiB", gpu_backend="metal")


def test_standin_from_the_cli_generates_the_cpu_text(capsys, monkeypatch):
    """`rapidmoe run --gpu-mem ... --gpu-backend standin` on the bundled model runs on the stand-in
    and gives the same greedy text as the CPU."""
    from rapidmoe_gguf import cli, model

    backends = []
    close = model.Model.close

    def recording_close(self):
        if self._model is not None and self._parent is None:
            backends.append(self.backend)
        close(self)

    monkeypatch.setattr(model.Model, "close", recording_close)
    args = ["run", "-p", "Once upon a time", "-n", "24", "--temp", "0", "-t", "2", "--ctx", "128"]
    assert cli.main(args) == 0
    cpu_text = capsys.readouterr().out
    assert cli.main(args + ["--gpu-mem", "64MiB", "--gpu-backend", "standin"]) == 0
    assert capsys.readouterr().out == cpu_text and len(cpu_text) > len("Once upon a time")
    assert backends == ["cpu", "standin"]


def test_split_standin_state_round_trip(wide_pair, tmp_path):
    """On the stand-in device the KV cache lives in device memory: a state saved from there and
    loaded into another device session continues bit for bit, and so does one loaded into a CPU
    session (the bytes are the cache's, wherever it lived)."""
    budget = _budgets(wide_pair)["half"]
    state = tmp_path / "s.state"
    with _model(wide_pair, gpu_memory=budget, gpu_backend="standin") as m:
        assert m.backend == "standin"
        ids = m.tokenize(TEXT)[:40]
        m.eval(ids[:32])
        m.save_state(state)
        want = np.stack([m.eval([t]) for t in ids[32:]])
    with _model(wide_pair, gpu_memory=budget, gpu_backend="standin") as m2:
        m2.load_state(state)
        _same(np.stack([m2.eval([t]) for t in ids[32:]]), want)
    with _model(wide_pair) as m3:
        m3.load_state(state)
        _same(np.stack([m3.eval([t]) for t in ids[32:]]), want)
