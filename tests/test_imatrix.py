"""Importance matrices computed by the runtime (rm_session_set_importance, compute_imatrix).

The oracle is llama.cpp's llama-imatrix on the same model and text (where the tools are built):
per expert, the vectors of mean x^2 per input column must agree within 5% (relative L2) and the
row counts within 1% + 3 rows. Measured on the bundled base (Q4_K experts) over 11 chunks of 256:
L2 up to 2.3%, counts off by up to 3 rows: both engines quantize activations their own way, so now
and then a token's top-2 differs, which moves a row between experts (on an F32 conversion of the
same model the vectors agree within 1.1%). Without the tools, the counts are checked against the
routing statistics and the sums' structure against the model.
"""

import os
import shutil
import subprocess

import numpy as np
import pytest

import llamacpp_oracle as llamacpp
import rapidmoe_gguf as rm
from rapidmoe_gguf import convert
from rapidmoe_gguf.bundled import bundled_heldout_path, bundled_model_path
from rapidmoe_gguf.convert.imatrix import compute_imatrix, read_imatrix
from rapidmoe_gguf.errors import StateError


def _text(n_chars=12000):
    with open(bundled_heldout_path(), encoding="utf-8") as f:
        return f.read()[-n_chars:]


def test_imatrix_counts_are_the_routed_rows(tmp_path):
    with rm.Model(bundled_model_path(), n_ctx=64, n_threads=2) as m:
        with pytest.raises(StateError, match="not collecting importance"):
            m.importance()
        ids = m.tokenize(_text(2000), add_special=False)[:64]
        m.set_residual("all")
        m.clear_stats()
        m.set_importance(True)
        m.eval_logits(ids)
        s_in, s_ff, count = m.importance()
        active = m.stats()["active"]
        m.set_importance(False)
        with pytest.raises(StateError):
            m.importance()
        L, X, K = m.info["n_layer"], m.info["n_expert"], m.info["n_expert_used"]
    assert s_in.shape == (L, X, m.info["n_embd"]) and s_ff.shape == (L, X, m.info["n_ff_exp"])
    assert np.array_equal(count, active)
    assert np.all(count.sum(1) == len(ids) * K)
    assert np.all(s_in >= 0) and np.all(s_ff >= 0)
    assert np.all((s_in.sum(2) > 0) == (count > 0)) and np.all((s_ff.sum(2) > 0) == (count > 0))


def test_imatrix_file_round_trip_and_conversion(tiny_hf, tmp_path):
    """compute_imatrix writes what read_imatrix and the converter take."""
    f32 = tmp_path / "f32.gguf"
    convert(tiny_hf("qwen3_moe"), f32, "f32")
    out = tmp_path / "m.imatrix.gguf"
    r = compute_imatrix(f32, " ".join(str(i) for i in range(3000)), out, n_ctx=64, n_threads=2)
    assert r["entries"] == 6 and r["chunks"] >= 2
    imx = read_imatrix(out)
    assert imx.names == sorted(f"blk.{b}.ffn_{p}_exps.weight" for b in (0, 1) for p in ("gate", "up", "down"))
    for b in (0, 1):
        gate = imx.importance(f"blk.{b}.ffn_gate_exps.weight", 256, 4)
        up = imx.importance(f"blk.{b}.ffn_up_exps.weight", 256, 4)
        for g, u in zip(gate, up):
            assert (g is None and u is None) or np.array_equal(g, u)
    rep = convert(tiny_hf("qwen3_moe"), tmp_path / "iq.gguf", "iq2xxs-q4", imatrix=out)
    assert rep.imatrix_tensors == 6


def test_imatrix_too_short_text_is_refused(tiny_hf, tmp_path):
    f32 = tmp_path / "f32.gguf"
    convert(tiny_hf("qwen3_moe"), f32, "f32")
    with pytest.raises(rm.InvalidArgumentError, match="fewer than one chunk of 512"):
        compute_imatrix(f32, "a b c", tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


@llamacpp.needs_tools
def test_imatrix_agrees_with_llama_imatrix(tmp_path):
    base = tmp_path / "tiny.gguf"   # the base alone: no sidecar beside it, for either engine
    shutil.copy(bundled_model_path(), base)
    text = tmp_path / "calib.txt"
    text.write_text(_text(), encoding="utf-8")
    theirs = tmp_path / "llama.imatrix.gguf"
    r = subprocess.run([os.path.join(llamacpp.tools(), "llama-imatrix"), "-m", str(base), "-f", str(text),
                        "-o", str(theirs), "-c", "256", "-t", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    ours = tmp_path / "ours.imatrix.gguf"
    compute_imatrix(base, text.read_text(encoding="utf-8"), ours, n_ctx=256, n_threads=2)
    a, b = read_imatrix(ours), read_imatrix(theirs)
    assert set(a.names) <= set(b.names) and len(a.names) == 12
    for name in a.names:
        n_in = 256 if "down" not in name else 512
        assert np.all(np.abs(a.counts(name) - b.counts(name)) <= 0.01 * b.counts(name) + 3), name
        for x, y in zip(a.importance(name, n_in, 8), b.importance(name, n_in, 8)):
            assert (x is None) == (y is None), name
            if x is not None:
                assert np.linalg.norm(x - y) <= 0.05 * np.linalg.norm(y), name
