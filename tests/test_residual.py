"""RESplit at run time: residual application, policies, the budget controller, calibration."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import rapidmoe_gguf as rm
from rapidmoe_gguf import evaluate, gguf_rewrite, quants
from conftest import _CORPUS

TEXT = " ".join(_CORPUS)


@pytest.fixture(scope="module")
def pair(tiny_hf, tmp_path_factory):
    """A calibrated q2k-q4 RESplit pair of the tiny Qwen3-MoE, and its checkpoint."""
    src = tiny_hf("qwen3_moe")
    out = tmp_path_factory.mktemp("resplit") / "m.gguf"
    rm.convert(src, out, recipe="q2k-q4", progress=False)
    evaluate.calibrate(str(out), TEXT, n_ctx=64, max_tokens=384, n_threads=2)
    return src, out


def _logits(path, ids, **kw):
    with rm.Model(path, n_ctx=128, n_threads=2, **kw) as m:
        return m.eval_logits(ids)


def _kl(p_logits, q_logits):
    lp, lq = evaluate._log_softmax(p_logits.astype(np.float64)), evaluate._log_softmax(q_logits.astype(np.float64))
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def test_residual_none_equals_base_only_file(pair):
    _, path = pair
    ids = list(range(5, 69))
    base_only = _logits(path, ids, residual=None)
    none = _logits(path, ids, residual_policy="none")
    np.testing.assert_array_equal(base_only, none)
    # with a budget of 0 too (rapidmoe perplexity --policy none --budget 0): "none" is applied, not
    # taken for the state a session starts in
    np.testing.assert_array_equal(base_only, _logits(path, ids, residual_policy="none", residual_budget=0.0))


def test_residual_all_equals_reconstructed_precision(pair, tmp_path):
    """Policy all (x.B + x.R) gives the logits of a model whose experts were stored at the
    reconstructed precision dequant(B) + dequant(R), up to the rounding of the activations."""
    src, path = pair
    recon_dir = tmp_path / "recon"
    shutil.copytree(src, recon_dir)
    st = load_file(str(recon_dir / "model.safetensors"))
    for name, w in st.items():
        if ".mlp.experts." in name:
            w = np.ascontiguousarray(w, dtype=np.float32)
            b = quants.dequantize("Q2_K", quants.quantize("Q2_K", w), w.shape)
            r = quants.dequantize("Q4_0", quants.quantize("Q4_0", w - b), w.shape)
            st[name] = b + r
    save_file(st, str(recon_dir / "model.safetensors"), metadata={"format": "pt"})
    recon = tmp_path / "recon.gguf"
    rm.convert(recon_dir, recon, recipe="f32", other_type="Q8_0", progress=False)
    ids = list(range(5, 69))
    ref = _logits(recon, ids)
    full = _logits(path, ids, residual_policy="all")
    base = _logits(path, ids, residual_policy="none")
    kl_all, kl_base = _kl(ref, full), _kl(ref, base)
    assert kl_all <= 2e-4, f"KL(all || reconstructed) = {kl_all:.2e}"
    assert kl_all * 20 <= kl_base, f"all ({kl_all:.2e}) is not far closer than base only ({kl_base:.2e})"


@pytest.mark.parametrize("policy", ["umia", "gate", "expert", "layer", "random"])
@pytest.mark.parametrize("budget", [0.1, 0.25, 0.5])
def test_residual_rate_tracks_budget(pair, policy, budget):
    _, path = pair
    with rm.Model(path, n_ctx=512, n_threads=2, residual_policy=policy, residual_budget=budget) as m:
        ids = m.tokenize(TEXT, add_special=False)[:300]
        m.clear_stats()
        m.eval(ids[:44])                       # a prefill ...
        for t in ids[44:300]:                  # ... then 256 decoded tokens
            m.eval([t])
        rate = m.stats()["residual_rate"]
    assert abs(rate - budget) <= 0.02, f"{policy} at budget {budget}: realised rate {rate:.3f}"


def test_residual_random_is_deterministic_and_policies_switch_without_reload(pair):
    _, path = pair
    ids = list(range(5, 100))
    with rm.Model(path, n_ctx=128, n_threads=2) as m:
        m.set_residual("random", 0.3)
        a = m.eval_logits(ids)
        s_a = m.stats()
        m.set_residual("none")
        b = m.eval_logits(ids)
        m.set_residual("random", 0.3)
        c = m.eval_logits(ids)
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, b)
    assert s_a["residual"].sum() > 0


def test_residual_umia_beats_random_at_equal_budget(pair):
    _, path = pair
    with rm.Model(path, n_ctx=128, n_threads=2) as m, \
            rm.Model(path, n_ctx=128, n_threads=2, residual_policy="all") as ref:
        ids = m.tokenize(TEXT, add_special=False)
        kl = {}
        for policy in ("umia", "random"):
            m.set_residual(policy, 0.25)
            kl[policy] = evaluate.perplexity(m, ids, 64, reference=ref, max_chunks=8).kld_mean
    assert kl["umia"] < kl["random"], kl


def test_residual_calibration_tables_are_stored(pair):
    _, path = pair
    with rm.open_gguf(str(path).replace(".gguf", ".residual.gguf")) as g:
        tables = rm.umia.Tables.from_metadata(g.metadata)
    assert tables is not None and tables.n_layer == 2 and tables.n_expert == 4
    assert np.all(tables.layer_sensitivity > 0)
    assert np.allclose(tables.expert_frequency.sum(1), 1.0, atol=1e-5)


def test_residual_failed_calibration_leaves_sidecar_intact(pair, monkeypatch):
    _, path = pair
    sidecar = str(path).replace(".gguf", ".residual.gguf")
    before = open(sidecar, "rb").read()

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(gguf_rewrite.gguf.GGUFWriter, "write_tensors_to_file", broken)   # the rewrite's writer
    tables = rm.umia.Tables(2, 4, np.ones((2, 4)), np.ones(2), np.full((2, 4), 0.25),
                            {p: np.zeros((2, rm.umia.N_QUANTILES)) for p in rm.umia.SCORED}, 1)
    with pytest.raises(OSError, match="disk full"):
        evaluate.store_tables(sidecar, tables)
    assert open(sidecar, "rb").read() == before
    assert not [p for p in path.parent.iterdir() if "partial" in p.name]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_residual_calibration_fsyncs_sidecar_and_folder(pair, monkeypatch):
    """The new sidecar is on disk before it replaces the old one, and the rename is made durable;
    its temporary has an unpredictable name."""
    _, path = pair
    sidecar = str(path).replace(".gguf", ".residual.gguf")
    with rm.open_gguf(sidecar) as g:
        tables = rm.umia.Tables.from_metadata(g.metadata)
    synced, real = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    evaluate.store_tables(sidecar, tables)
    assert len(synced) == 2, synced
    assert re.fullmatch(r"\.m\.residual\.gguf\.partial-\d+-[0-9a-f]{16}", os.path.basename(synced[0]))
    assert synced[1] == str(path.parent)
    rm.resplit.check_pair(path, sidecar)


def test_residual_mismatched_sidecar_is_refused(pair, tiny_hf, tmp_path):
    _, path = pair
    other = tmp_path / "other.gguf"
    rm.convert(tiny_hf("qwen3_moe"), other, recipe="q2k-q4", progress=False)
    with pytest.raises(rm.RapidMoEError, match="(?i)base|identity|match"):
        rm.Model(path, residual=str(other).replace(".gguf", ".residual.gguf"))


def test_residual_policy_errors(pair):
    _, path = pair
    with rm.Model(path, n_ctx=64, n_threads=1) as m:
        with pytest.raises(rm.InvalidArgumentError, match="unknown residual policy"):
            m.set_residual("best", 0.2)
        with pytest.raises(rm.InvalidArgumentError, match="budget"):
            m.set_residual("umia", 1.5)
    with rm.Model(path, n_ctx=64, n_threads=1, residual=None) as m:
        with pytest.raises(rm.RapidMoEError, match="sidecar"):
            m.set_residual("all")


def test_residual_convert_cli_calibrates_in_the_same_run(tiny_hf, tmp_path):
    from rapidmoe_gguf.cli import main

    text = tmp_path / "calib.txt"
    text.write_text(TEXT)
    out = tmp_path / "c.gguf"
    assert main(["convert", str(tiny_hf("qwen3_moe")), str(out), "--recipe", "q2k-q4",
                 "--calibrate", str(text), "--calibrate-tokens", "256"]) == 0
    with rm.Model(out, n_ctx=64, n_threads=1) as m:
        assert m.umia_tables is not None and m.residual_policy == "umia"


def _load_native(base, side):
    """rm_model_load itself, without the Python pair check in front of it."""
    from rapidmoe_gguf._native import check, ffi, lib

    params = ffi.new("rm_model_params *")
    params.struct_size = ffi.sizeof("rm_model_params")
    params.n_threads = 1
    res_c = ffi.new("char[]", str(side).encode())
    params.residual_path = res_c
    out = ffi.new("rm_model **")
    check(lib.rm_model_load(str(base).encode(), params, out))
    lib.rm_model_free(out[0])


def _copy_pair(path, dst_dir):
    base, side = dst_dir / "c.gguf", dst_dir / "c.residual.gguf"
    shutil.copyfile(path, base)
    shutil.copyfile(str(path).replace(".gguf", ".residual.gguf"), side)
    return base, side


@pytest.mark.parametrize("tensor, end", [("blk.1.ffn_up_exps.weight", "first"),
                                         ("blk.0.ffn_down_exps.weight", "last")])
def test_residual_sidecar_is_bound_to_the_base_data(pair, tmp_path, tensor, end):
    """The tensor infos and uuid stay, the expert bytes change: the pair check and the C loader
    both refuse, naming the tensor."""
    _, path = pair
    base, side = _copy_pair(path, tmp_path)
    with rm.open_gguf(side) as g:
        fps = g.metadata[rm.resplit.KEY_BASE_FINGERPRINTS]
        assert len(fps) == len(g.tensors) == 6
    _load_native(base, side)                                   # the untouched copy loads
    h = rm.gguf_header.read_header(base)
    t = h.tensor(tensor)
    pos = h.data_offset + t.offset + (0 if end == "first" else t.nbytes - 1)
    with open(base, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x5A]))
    with pytest.raises(rm.FormatError, match=rf"base tensor '{re.escape(tensor)}'.*not the data .*was made for"):
        rm.resplit.check_pair(base, side)
    with pytest.raises(rm.FormatError, match=rf"rm_model_load: .*base tensor '{re.escape(tensor)}'.*not the data"):
        _load_native(base, side)
    with pytest.raises(rm.FormatError, match=re.escape(tensor)):
        rm.Model(base, n_ctx=16, n_threads=1)


def test_residual_c_loader_checks_the_base_uuid(pair, tiny_hf, tmp_path):
    _, path = pair
    other = tmp_path / "other.gguf"
    rm.convert(tiny_hf("qwen3_moe"), other, recipe="q2k-q4", progress=False)
    with pytest.raises(rm.FormatError, match=r"rm_model_load: .*other.residual.gguf.* base uuid"):
        _load_native(path, str(other).replace(".gguf", ".residual.gguf"))
