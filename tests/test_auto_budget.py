"""residual_budget="auto": the controller (rm_auto_budget_step) on synthetic layer timings.

The rule: after a token, if any layer's host work outlasted the device's (a stall), the budget
is multiplied by `decrease`; if every layer with host work finished within (1 - margin) of the
device's time, `increase` is added; the result is clamped to [min_budget, max_budget]."""

from __future__ import annotations

import numpy as np
import pytest

from rapidmoe_gguf import _native
from rapidmoe_gguf._native import ffi, lib
from rapidmoe_gguf.errors import InvalidArgumentError


def _ctl(budget=0.05, lo=0.0, hi=0.5, inc=0.01, dec=0.5, margin=0.1):
    c = ffi.new("rm_auto_budget *")
    c.struct_size = ffi.sizeof("rm_auto_budget")
    c.budget, c.min_budget, c.max_budget = budget, lo, hi
    c.increase, c.decrease, c.margin, c.reference_budget = inc, dec, margin, max(budget, 1e-3)
    return c


def _step(c, host, dev):
    host = np.ascontiguousarray(host, dtype=np.float32)
    dev = np.ascontiguousarray(dev, dtype=np.float32)
    _native.check(lib.rm_auto_budget_step(c, ffi.from_buffer("float[]", host), ffi.from_buffer("float[]", dev),
                                          host.size))
    return c.budget


def test_auto_budget_rises_while_host_finishes_first():
    c = _ctl(budget=0.05, inc=0.01)
    b = [_step(c, [10, 20, 0], [100, 100, 100]) for _ in range(5)]
    assert b == pytest.approx([0.06, 0.07, 0.08, 0.09, 0.10])


def test_auto_budget_falls_when_a_layer_stalls():
    c = _ctl(budget=0.2, dec=0.5)
    assert _step(c, [10, 120, 10], [100, 100, 100]) == pytest.approx(0.1)   # one layer stalled
    assert _step(c, [10, 120, 10], [100, 100, 100]) == pytest.approx(0.05)


def test_auto_budget_holds_inside_the_margin():
    c = _ctl(budget=0.2, margin=0.1)
    assert _step(c, [95, 10], [100, 100]) == pytest.approx(0.2)   # no stall, but no room either


def test_auto_budget_ignores_layers_without_host_work():
    c = _ctl(budget=0.2, inc=0.01)
    assert _step(c, [0, 0, 0], [0, 0, 0]) == pytest.approx(0.21)


def test_auto_budget_stays_in_bounds():
    c = _ctl(budget=0.45, hi=0.5, inc=0.1)
    assert _step(c, [1], [100]) == pytest.approx(0.5)
    assert _step(c, [1], [100]) == pytest.approx(0.5)
    c = _ctl(budget=0.02, lo=0.01, dec=0.1)
    assert _step(c, [200], [100]) == pytest.approx(0.01)


def test_auto_budget_converges_below_the_stall_point():
    """A simulated split: the host's time in each layer grows with the budget (12 layers, host
    cost 1000 us per unit of budget, device 40 us). The budget must settle where the host just
    hides under the device (b* = 0.04): it may dip by the decrease factor after a stall but
    never runs away, and most tokens end without a stall."""
    rng = np.random.default_rng(0)
    c = _ctl(budget=0.0, lo=0.0, hi=1.0, inc=0.002, dec=0.7, margin=0.1)
    trace, stalls = [], 0
    for _ in range(2000):
        b = c.budget
        host = 1000.0 * b * (1 + 0.05 * rng.standard_normal(12))
        dev = np.full(12, 40.0)
        stalls += bool((host > dev).any())
        trace.append(_step(c, np.maximum(host, 1e-3), dev))
    tail = np.array(trace[500:])
    assert 0.7 * 0.03 < tail.mean() < 0.04
    assert tail.max() < 0.05
    assert stalls < 0.2 * len(trace)


@pytest.mark.parametrize("field,value", [("decrease", 1.0), ("decrease", 0.0), ("margin", 1.0),
                                         ("max_budget", 1.5), ("budget", -0.1), ("reference_budget", 0.0)])
def test_auto_budget_rejects_bad_fields(field, value):
    c = _ctl()
    setattr(c, field, value)
    with pytest.raises(InvalidArgumentError, match="rm_auto_budget_step"):
        _step(c, [1], [1])
