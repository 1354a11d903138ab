"""Models larger than the memory (RM_LOAD_STREAM, ``Model(ram_budget=...)``): all but the routed
experts stay in memory and each expert's matrices are read from the file into a cache of slots
within the budget. The arithmetic is the same as with the whole file in memory, so the logits are
too, bit for bit, whatever the budget, with and without reading ahead, with a residual sidecar;
the cache stays in its budget; a file cut short after the load fails the evaluation that needs
the missing bytes, with a message naming the file, and the model serves again once the file is
whole."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf.bundled import MODEL_DIR
from rapidmoe_gguf.gguf_file import open_gguf

IDS = list(range(3, 43))
N_PROMPT = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> str:
    """A copy of the bundled base/residual pair under a path of its own (a test cuts it)."""
    d = tmp_path_factory.mktemp("stream")
    for name in ("tiny-moe.gguf", "tiny-moe.residual.gguf"):
        shutil.copy(os.path.join(MODEL_DIR, name), d)
    return str(d / "tiny-moe.gguf")


def _run(path, **kw) -> tuple[np.ndarray, dict]:
    """Logits of every position (the prompt in batches of 16, then one token at a time) and the
    expert cache's counters after them."""
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=16, **kw) as m:
        first = m.eval_logits(IDS[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in IDS[N_PROMPT:]])
        return np.concatenate([first, rest]), m.expert_cache


def _cut_point(path) -> int:
    """A file size that cuts the expert tensor stored last in two (all after it is resident)."""
    with open_gguf(path) as g:
        last = max((t for t in g.tensors.values() if "_exps." in t.name), key=lambda t: t.offset)
        return g.data_offset + last.offset + last.nbytes // 2


@pytest.mark.parametrize("residual", [None, "all", "umia"])
def test_streamed_logits_equal_the_read_file(pair, residual):
    """Budgets from a few slots (most experts read again and again) to the whole model, with and
    without the reader thread: the logits of the file read whole, bit for bit."""
    kw = {"residual": None} if residual is None else {"residual_policy": residual}
    ref, st = _run(pair, use_mmap=False, **kw)
    assert not st["streaming"] and st["bytes_read"] == 0
    assert np.isfinite(ref).all()
    for budget in ("6MiB", "64MiB"):
        for prefetch in ("none", "known", "predict"):
            got, st = _run(pair, ram_budget=budget, prefetch=prefetch, **kw)
            assert st["streaming"]
            assert got.tobytes() == ref.tobytes(), (budget, prefetch, np.abs(got - ref).max())
            assert st["misses"] > 0 and st["bytes_read"] > 0
            if prefetch == "none":
                assert st["prefetched"] == 0
            if budget == "6MiB":   # fewer slots than units: units leave and are read again
                assert st["evictions"] > 0 and st["bytes_read"] > st["cache_bytes"]


def test_the_cache_stays_in_its_budget(pair):
    budget = 6 << 20
    _, st = _run(pair, ram_budget=budget, residual_policy="all")
    assert st["budget_bytes"] == budget
    assert st["resident_bytes"] > 0
    assert st["cache_bytes"] == st["slots"] * st["slot_bytes"]
    assert st["resident_bytes"] + st["cache_bytes"] <= budget
    assert 0 < st["slots_used"] <= st["slots"]
    assert st["evictions"] > 0
    assert st["hits"] + st["prefetch_used"] > 0
    assert 0.0 < st["hit_rate"] < 1.0


def test_a_budget_below_the_resident_weights_is_refused(pair):
    with pytest.raises(rm.InvalidArgumentError, match="RAM budget of 1048576 bytes"):
        rm.Model(pair, n_ctx=64, ram_budget="1MiB")
    with pytest.raises(rm.InvalidArgumentError, match="ram_budget"):
        rm.Model(pair, n_ctx=64, ram_budget="lots")
    with pytest.raises(rm.InvalidArgumentError, match="not both"):
        rm.Model(pair, n_ctx=64, ram_budget="8MiB", use_mmap=True)
    with pytest.raises(rm.InvalidArgumentError, match="not both"):
        rm.Model(pair, n_ctx=64, ram_budget="8MiB", gpu_memory="1GiB", gpu_backend="standin")


def test_a_file_cut_after_the_load_fails_the_request_not_the_model(pair, tmp_path):
    """Half of the expert tensor stored last cut off the file while the model runs: the evaluation
    that needs those experts fails with a message naming the file; the session is left where it was and, once
    the file is whole again, evaluates as before."""
    d = tmp_path / "cut"
    d.mkdir()
    path = d / "tiny-moe.gguf"
    shutil.copy(pair, path)
    data = path.read_bytes()
    with rm.Model(pair, n_ctx=128, n_threads=2, n_batch=16, residual=None, use_mmap=False) as m:
        ref = [m.eval_logits(IDS[:4]), m.eval(IDS[4:N_PROMPT])]
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=16, residual=None, ram_budget="6MiB", prefetch="none") as m:
        np.testing.assert_array_equal(m.eval_logits(IDS[:4]), ref[0])
        with open(path, "r+b") as f:
            f.truncate(_cut_point(path))
        try:
            with pytest.raises(rm.RapidMoEError, match=r"tiny-moe\.gguf.*(truncated|ends at)"):
                m.eval(IDS[4:N_PROMPT])   # 20 tokens: most experts of every layer
            assert m.n_past == 4
            assert m.expert_cache["read_errors"] > 0
        finally:
            path.write_bytes(data)
        np.testing.assert_array_equal(m.eval(IDS[4:N_PROMPT]), ref[1])


def test_the_auto_budget_follows_the_residual_reads(pair):
    """residual_budget="auto" on a streamed model: after each decoded token the controller weighs
    each layer's wait on residual reads against the rest of its time and moves the budget; a model
    wholly in memory on the CPU has nothing to weigh and keeps the starting value."""
    budgets = {}
    for kw in ({"ram_budget": "6MiB", "prefetch": "none"}, {"use_mmap": False}):
        with rm.Model(pair, n_ctx=128, n_threads=2, n_batch=16, residual_budget="auto", **kw) as m:
            start = m.backend_stats()["auto_budget"]
            for t in IDS[:12]:
                m.eval([t])
            budgets[m.expert_cache["streaming"]] = (start, m.backend_stats()["auto_budget"])
    start, end = budgets[True]
    assert 0.0 < start < 1.0 and end != pytest.approx(start, abs=1e-6)
    assert budgets[False][1] == budgets[False][0]


def test_plan_for_a_ram_budget(pair, capsys):
    """rapidmoe plan --ram-budget: the resident bytes are the files' less their experts; a budget
    that holds every unit hits always and reads nothing; a smaller one reads what it cannot hold;
    one below the resident weights and one token's experts is refused."""
    from rapidmoe_gguf import cli, planner

    whole = planner.stream_plan(pair, "512MiB", residual_budget=0.25, disk_bw_gbps=2.0, host_bw_gbps=20.0)
    with rm.Model(pair, n_ctx=64, ram_budget="512MiB") as m:
        assert whole.resident == m.expert_cache["resident_bytes"]
    assert whole.slots == whole.units and whole.hit_rate == 1.0 and whole.disk_bytes == 0.0
    small = planner.stream_plan(pair, "6MiB", residual_budget=0.25, disk_bw_gbps=2.0, host_bw_gbps=20.0)
    with rm.Model(pair, n_ctx=64, ram_budget="6MiB") as m:
        assert small.slots == m.expert_cache["slots"]
    assert 0 < small.slots < small.units and 0.0 < small.hit_rate < 1.0 and small.disk_bytes > 0.0
    assert small.tok_s < small.tok_s_overlapped <= whole.tok_s_overlapped
    with pytest.raises(planner.PlanError, match="does not hold"):
        planner.stream_plan(pair, "2MiB")
    assert cli.main(["plan", pair, "--ram-budget", "6MiB", "--disk-bw", "2", "--host-bw", "20", "--budget", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "expert cache" in out and "disk reads" in out and f"{small.hit_rate:.3f}" in out


def test_a_failed_read_resets_a_hybrids_recurrent_states(tmp_path):
    """A hybrid's recurrent states run on through a pass whose read failed, so they no longer belong
    to any prefix: the session is emptied (n_past 0); the prompt evaluated again gives the resident
    model's logits."""
    from test_arch_qwen35 import make_tiny_hybrid

    make_tiny_hybrid(tmp_path / "hf", "qwen3_5_moe")
    path = tmp_path / "h.gguf"
    rm.convert(tmp_path / "hf", path, recipe="q8_0", progress=False)
    data = path.read_bytes()
    ids = IDS[:20]
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=16, use_mmap=False) as m:
        ref = [m.eval(ids[:4]), m.eval(ids[4:])]
    with rm.Model(path, n_ctx=128, n_threads=2, ram_budget=len(data)) as m:   # its sizes, for a budget of few slots
        c = m.expert_cache
        budget = c["resident_bytes"] + 4 * m.info["n_expert_used"] * c["slot_bytes"]
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=16, ram_budget=budget, prefetch="none") as m:
        assert m.expert_cache["slots"] < m.info["n_expert"] * m.info["n_layer"]
        np.testing.assert_array_equal(m.eval(ids[:4]), ref[0])
        with open(path, "r+b") as f:
            f.truncate(_cut_point(path))
        try:
            with pytest.raises(rm.RapidMoEError, match=r"h\.gguf"):
                m.eval(ids[4:])
            assert m.n_past == 0
        finally:
            path.write_bytes(data)
        np.testing.assert_array_equal(m.eval(ids[:4]), ref[0])
        np.testing.assert_array_equal(m.eval(ids[4:]), ref[1])
