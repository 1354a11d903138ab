"""The residual policy's one source of truth: kinds and scores come from C (policy.c), the budget
is checked by one function, and each state a call can find a session in has its own status,
exception and HTTP answer.

Error budget of the score comparison: umia.slot_log_scores computes in float64, rm_policy_log_scores
in float32 (logf); for scores within a few units of zero they agree to rtol 1e-5, atol 1e-5."""

from __future__ import annotations

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import _native, evaluate, planner, server, umia
from rapidmoe_gguf._native import ffi, lib
from conftest import _CORPUS

TEXT = " ".join(_CORPUS)


@pytest.fixture(scope="module")
def pair(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "p.gguf"
    rm.convert(tiny_hf("qwen3_moe"), out, recipe="q2k-q4", progress=False)
    return str(out)


def test_policy_kinds_come_from_the_library():
    assert umia.POLICIES == ("none", "all", "umia", "random", "gate", "expert", "layer")
    for name, kind in umia.KIND.items():
        assert kind == getattr(lib, "RM_POLICY_" + name.upper())
        assert ffi.string(lib.rm_policy_kind_name(kind)).decode() == name
    assert lib.rm_policy_kind_name(lib.RM_POLICY_COUNT) == ffi.NULL
    assert lib.rm_policy_kind_name(-1) == ffi.NULL


@pytest.mark.parametrize("policy", umia.SCORED)
@pytest.mark.parametrize("gate_power", [1.0, 0.5])
def test_policy_python_scores_equal_the_c_scores(policy, gate_power):
    rng = np.random.default_rng(7)
    L, X, n = 3, 8, 500
    tables = umia.Tables(L, X, rng.uniform(0.05, 20.0, (L, X)), rng.uniform(1e-4, 2.0, L),
                         np.full((L, X), 1.0 / X), {}, n)
    for layer in range(L):
        experts = rng.integers(0, X, n)
        gates = rng.uniform(0.0, 1.0, n)
        gates[:3] = [0.0, 1e-40, 1.0]            # the floor of 1e-30 on the gate, and its top
        py = umia.slot_log_scores(policy, tables, layer, experts, gates, gate_power)
        c = umia.native_log_scores(policy, gate_power, tables.expert_sensitivity[layer],
                                   float(tables.layer_sensitivity[layer]), experts, gates)
        np.testing.assert_allclose(c, py, rtol=1e-5, atol=1e-5)


def test_policy_log_scores_refuses_random_kinds_and_bad_experts():
    es = np.ones(4, np.float32)
    with pytest.raises(rm.InvalidArgumentError, match="not UMIA, GATE or EXPERT"):
        umia.native_log_scores("random", 1.0, es, 1.0, np.zeros(2), np.ones(2))
    with pytest.raises(rm.InvalidArgumentError, match=r"experts\[1\] = 4"):
        umia.native_log_scores("umia", 1.0, es, 1.0, np.array([0, 4]), np.ones(2))


@pytest.mark.parametrize("value,want", [(0, 0.0), (1, 1.0), (0.25, 0.25), (np.float32(0.5), 0.5), ("auto", "auto")])
def test_policy_budget_check_accepts(value, want):
    assert umia.check_budget(value) == want


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "0.3", None])
def test_policy_budget_check_refuses(value):
    with pytest.raises(rm.InvalidArgumentError, match="residual budget must be"):
        umia.check_budget(value)


def test_policy_budget_check_refuses_auto_where_a_number_is_needed():
    with pytest.raises(rm.InvalidArgumentError, match=r"a number in \[0, 1\], got 'auto'"):
        umia.check_budget("auto", allow_auto=False)


def test_policy_budget_defaults_are_one_constant():
    import inspect

    from rapidmoe_gguf import cli, planner

    assert inspect.signature(rm.Model).parameters["residual_budget"].default == umia.DEFAULT_BUDGET
    assert inspect.signature(planner.plan).parameters["residual_budget"].default == umia.PLAN_BUDGET
    assert inspect.signature(planner.plan_files).parameters["residual_budget"].default == umia.PLAN_BUDGET
    p = cli.build_parser()
    assert p.parse_args(["run"]).budget == umia.DEFAULT_BUDGET
    assert p.parse_args(["plan", "m.gguf", "--gpu-mem", "1GiB"]).budget == umia.PLAN_BUDGET


def _state_error(pair, call):
    """The exception `call(model)` raises, and the server's answer to it."""
    with rm.Model(pair, n_ctx=32, n_threads=1, residual=None) as m:
        with pytest.raises(rm.StateError) as info:
            call(m)
    return info.value, server.api_error(info.value)


def test_policy_on_a_model_without_sidecar_is_not_context_overflow(pair):
    exc, api = _state_error(pair, lambda m: m.set_layer_mask("all", np.ones(m.info["n_layer"])))
    assert isinstance(exc, rm.NoResidualError) and not isinstance(exc, rm.ContextFullError)
    assert exc.status == "RM_E_NO_RESIDUAL" and "sidecar" in str(exc)
    assert api.status == 400 and api.code != "context_length_exceeded" and api.param == "residual_policy"


def test_policy_calibration_without_sidecar_is_no_residual(pair):
    exc, api = _state_error(pair, lambda m: m.set_calibration(True))
    assert isinstance(exc, rm.NoResidualError)
    assert api.code != "context_length_exceeded"


def test_policy_route_log_while_not_calibrating(pair):
    exc, api = _state_error(pair, lambda m: m.route_log())
    assert isinstance(exc, rm.NotCalibratingError) and exc.status == "RM_E_NOT_CALIBRATING"
    assert api.status == 500 and api.code != "context_length_exceeded"


def test_policy_auto_budget_needs_a_scored_policy(pair):
    with rm.Model(pair, n_ctx=32, n_threads=1, residual_policy="all") as m:
        ab = ffi.new("rm_auto_budget *")
        ab.struct_size = ffi.sizeof("rm_auto_budget")
        ab.budget = ab.reference_budget = 0.1
        ab.max_budget, ab.decrease = 0.5, 0.7
        with pytest.raises(rm.NoBudgetError, match="has no budget") as info:
            _native.check(lib.rm_session_set_auto_budget(m._live(), ab))
    api = server.api_error(info.value)
    assert api.status == 400 and api.param == "residual_budget" and api.code != "context_length_exceeded"


def test_policy_calibration_on_the_standin_needs_the_cpu(pair):
    hw = planner.Hardware(host_bw_gbps=50.0, context_reserve=0)     # fixed: no test measures the machine
    with rm.Model(pair, n_ctx=32, n_threads=1, gpu_memory="1GiB", gpu_backend="standin", hardware=hw) as m:
        with pytest.raises(rm.NeedsCPUError, match="calibration runs on the CPU backend") as info:
            m.set_calibration(True)
        assert not isinstance(info.value, rm.ContextFullError)
        m.eval([5, 6])                       # the session is unharmed


def test_policy_context_full_is_still_context_full(pair):
    with rm.Model(pair, n_ctx=8, n_threads=1) as m:
        with pytest.raises(rm.ContextFullError, match="exceed the context of 8") as info:
            m.eval(list(range(1, 10)))
    assert info.value.status == "RM_E_CONTEXT_FULL"
    assert server.api_error(info.value).code == "context_length_exceeded"


def test_policy_calibration_goes_through_the_model(pair, tmp_path):
    """measure_tables reads the route log and sums through Model, and they fit together: every
    slot of the route log is counted in the activations."""
    with rm.Model(pair, n_ctx=32, n_threads=1, residual_policy="all") as m:
        m.clear_stats()
        m.set_calibration(True)
        try:
            ids = m.tokenize(TEXT, add_special=False)[:32]
            m.eval_logits(ids)
            experts, gates = m.route_log()
            delta, count = m.calibration()
        finally:
            m.set_calibration(False)
        L, X, K = m.info["n_layer"], m.info["n_expert"], m.info["n_expert_used"]
        assert experts.shape == gates.shape == (32, L, K) and delta.shape == count.shape == (L, X)
        active = m.stats()["active"]
        for layer in range(L):
            assert (np.bincount(experts[:, layer].ravel(), minlength=X) == active[layer]).all()
        assert (count == active).all()            # policy all: every slot has its residual
        assert (delta[count > 0] > 0).all()
    with rm.Model(pair, n_ctx=32, n_threads=1) as m:
        tables = evaluate.measure_tables(m, ids * 2, n_ctx=32, max_tokens=64)
    assert tables.expert_sensitivity.shape == (L, X)
