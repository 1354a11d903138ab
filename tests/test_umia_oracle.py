"""The residual oracle (rapidmoe_gguf/oracle.py) against exhaustive search, and the given
selection it is measured with (Model.set_residual_mask, rm_session_set_residual_mask).

Tolerance of the exhaustive comparison: the oracle's measured KL is at most the optimum plus 2% of
the distance from the optimum to base only (on these cases it finds the optimum itself, or the
second best selection 0.5% of that distance away on a 6-token case)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import oracle
from rapidmoe_gguf.errors import InvalidArgumentError

torch = pytest.importorskip("torch")

N_CTX = 4


@pytest.fixture(scope="module")
def pair(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle") / "p.gguf"
    rm.convert(tiny_hf("qwen3_moe"), out, recipe="q2k-q4", progress=False)
    return str(out)


@pytest.fixture(scope="module")
def twin(pair):
    return oracle.TorchPair(pair, pair.replace(".gguf", ".residual.gguf"))


def _ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 320, n).tolist()


@pytest.fixture(scope="module")
def mixtral_pair(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle_mixtral") / "p.gguf"
    rm.convert(tiny_hf("mixtral"), out, recipe="q2k-q4", progress=False)
    return str(out)


@pytest.mark.parametrize("arch", ["qwen3moe", "llama"])
def test_twin_follows_the_runtime(arch, request):
    """The f32 twin with m = 0 / m = 1 is the runtime's base only / all residuals up to the
    runtime's Q8 activations: the same argmax nearly everywhere, KL well under base only's over
    all positions, and under 2e-3 at the positions without a routing near-tie (a router gap under
    0.02 at the k-th expert in some layer, which the runtime's rounding may resolve the other way:
    at most a few of the 32). llama is Mixtral: no q/k norm, interleaved RoPE (a NEOX twin is far
    off, checked below)."""
    pair = request.getfixturevalue("pair" if arch == "qwen3moe" else "mixtral_pair")
    twin = oracle.TorchPair(pair, pair.replace(".gguf", ".residual.gguf"))
    assert (twin.qk_norm, twin.rope_neox, twin.norm_topk) == ((True, True, True) if arch == "qwen3moe"
                                                               else (False, False, True))
    ids = _ids(5, 32)
    with rm.Model(pair, n_ctx=32, n_threads=1) as m:
        assert m.info["arch"] == arch
        lp = {}
        for policy in ("none", "all"):
            m.set_residual(policy)
            lp[policy] = oracle._log_softmax(m.eval_logits(ids).astype(np.float64))
        none_vs_all = (np.exp(lp["all"]) * (lp["all"] - lp["none"])).sum(-1).mean()
        for policy, mix in (("none", 0.0), ("all", 1.0)):
            ours = lp[policy]
            margins = []
            with torch.no_grad():
                tw = twin.logits(ids, torch.full((32, 2, 2), mix), margins).log_softmax(-1).double().numpy()
            tied = torch.stack(margins).min(0).values.numpy() < 0.02
            kl_pos = (np.exp(ours) * (ours - tw)).sum(-1)
            kl = kl_pos[~tied].mean()
            assert tied.sum() <= 4, (policy, tied.sum())
            assert kl < 2e-3, (policy, kl)
            assert kl_pos.mean() < 0.1 * none_vs_all, (policy, kl_pos.mean(), none_vs_all)
            assert (ours.argmax(-1) == tw.argmax(-1)).mean() >= 0.9
            if arch == "llama" and policy == "all":
                # the RoPE layout matters: the other one puts the twin far from the runtime
                twin.rope_neox = True
                with torch.no_grad():
                    tw = twin.logits(ids, torch.full((32, 2, 2), mix)).log_softmax(-1).double().numpy()
                twin.rope_neox = False
                assert (np.exp(ours) * (ours - tw)).sum(-1).mean() > 10 * kl


def test_mask_selects_exactly_the_given_slots(pair):
    ids = _ids(6, 16)
    with rm.Model(pair, n_ctx=16, n_threads=1) as m:
        L, K = m.info["n_layer"], m.info["n_expert_used"]
        m.set_residual("all")
        all_logits = m.eval_logits(ids)
        m.set_residual("none")
        none_logits = m.eval_logits(ids)
        m.set_residual_mask(np.ones((16, L, K), np.uint8))
        assert np.array_equal(m.eval_logits(ids), all_logits)
        m.set_residual_mask(np.zeros((16, L, K), np.uint8))
        assert np.array_equal(m.eval_logits(ids), none_logits)
        sel = (np.random.default_rng(0).random((16, L, K)) < 0.3).astype(np.uint8)
        m.set_residual_mask(sel)
        m.clear_stats()
        m.eval_logits(ids)
        st = m.stats()
        assert int(st["residual"].sum()) == int(sel.sum())
        assert st["residual_rate"] == pytest.approx(sel.mean(), abs=1e-12)
        m.set_residual_mask(sel[:8])     # positions from 8 on get none
        m.clear_stats()
        m.eval_logits(ids)
        assert int(m.stats()["residual"].sum()) == int(sel[:8].sum())
        m.set_residual("all")            # a policy replaces the mask
        assert np.array_equal(m.eval_logits(ids), all_logits)
        with pytest.raises(InvalidArgumentError, match="shape"):
            m.set_residual_mask(np.ones((16, L + 1, K), np.uint8))
    with rm.Model(pair, n_ctx=16, n_threads=1, residual=None, residual_policy="none") as m:
        with pytest.raises(rm.NoResidualError):
            m.set_residual_mask(np.ones((16, 2, 2), np.uint8))


@pytest.mark.parametrize("budget,seed", [(0.25, 0), (0.25, 1), (0.25, 2), (0.5, 1)])
def test_oracle_against_exhaustive_search(pair, twin, budget, seed):
    with rm.Model(pair, n_ctx=N_CTX, n_threads=1) as m:
        m.set_residual("all")
        problem = oracle.make_problem(m, _ids(seed, N_CTX), N_CTX, 1, 2, 2)
        groups = problem.groups()
        quota = oracle.quotas(groups, budget)
        res = oracle.search(m, twin, problem, budget)

        # the realised budget is the requested one, in each group and as the runtime counts it
        for g, q in quota.items():
            assert int(res.selection[groups == g].sum()) == q
        m.clear_stats()
        oracle.measured_kl(m, problem, res.selection)
        assert m.stats()["residual_rate"] == pytest.approx(budget, abs=1e-12)

        flat = groups.ravel()
        members = {g: np.flatnonzero(flat == g) for g in quota}
        kls = []
        for a in itertools.combinations(members[0], quota[0]):
            for b in itertools.combinations(members[1], quota[1]):
                sel = np.zeros(flat.size, np.uint8)
                sel[list(a) + list(b)] = 1
                kls.append(oracle.measured_kl(m, problem, sel.reshape(groups.shape)))
        best = min(kls)
        none = oracle.measured_kl(m, problem, np.zeros(groups.shape, np.uint8))
        assert none > best
        assert res.kl == pytest.approx(oracle.measured_kl(m, problem, res.selection), rel=1e-12)
        assert res.kl <= best + 0.02 * (none - best), (res.kl, best, none)


def test_oracle_budget_ends_and_errors(pair, twin):
    with rm.Model(pair, n_ctx=8, n_threads=1) as m:
        m.set_residual("all")
        problem = oracle.make_problem(m, _ids(3, 8), 8, 1, 2, 2)
        assert oracle.search(m, twin, problem, 0.0).selection.sum() == 0
        full = oracle.search(m, twin, problem, 1.0)
        # every residual is the reference's own output bit for bit (the mask test above): KL 0
        # exactly, on every kernel set
        assert full.selection.all() and full.kl == 0.0
        with pytest.raises(InvalidArgumentError, match="budget"):
            oracle.search(m, twin, problem, 1.5)


def test_twin_refuses_other_architectures(tiny_hf, tmp_path):
    out = tmp_path / "m.gguf"
    rm.convert(tiny_hf("qwen2_moe"), out, recipe="q2k-q4", progress=False)
    with pytest.raises(rm.RapidMoEError, match="architecture 'qwen2moe'"):
        oracle.TorchPair(str(out), str(tmp_path / "m.residual.gguf"))
