"""The IQ2_XXS and IQ3_XXS quantizers (native/src/format/quants_iq.c): our own codebook search, so not
byte-identical to ggml's, and IQ4_NL's (quants_ref.c: a search over trial scales; the KV cache's
iq4_nl). What is checked instead:

- the bytes decode, with gguf-py's dequantizer (the format's oracle), to exactly what ours gives;
- the error on N(0, 1) rows, at any magnitude, stays within budget: relative RMSE measured 0.346
  (IQ2_XXS) and 0.180 (IQ3_XXS) on 16 x 1024 values, budgets 0.36 and 0.19;
- an importance lowers the error it weighs (measured 0.254 against 0.351 without, IQ2_XXS);
- every block keeps unit gain along x (sum w x x' = sum w x^2) up to the fp16 rounding of d
  (2^-11; measured within 6.1e-4, budget 1e-3);
- against ggml's own quantizer (ggml_quantize_chunk from llama-cpp-python's libggml-base, where it
  is installed) on the bundled model's expert weights with the same importance, our weighted error
  is no more than 3% above ggml's (measured 0.58x for IQ2_XXS, 0.82x for IQ3_XXS with this skewed
  importance; 0.96x and 0.95x over all experts with a llama-imatrix file of the bundled model).
"""

import ctypes
import os
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from rapidmoe_gguf import quants
from rapidmoe_gguf.errors import InvalidArgumentError

IQ_QUANTIZED = ["IQ2_XXS", "IQ3_XXS"]
RMSE_BUDGET = {"IQ2_XXS": 0.36, "IQ3_XXS": 0.19}


def _rel(x, y, w=None):
    w = np.ones(x.shape[-1], np.float64) if w is None else w.astype(np.float64)
    x, y = x.astype(np.float64), y.astype(np.float64)
    return float(np.sqrt(((x - y) ** 2 * w).sum() / (x * x * w).sum()))


def _roundtrip(name, x, **kw):
    q = quants.quantize(name, x, **kw)
    return q, quants.dequantize(name, q, x.shape)


@pytest.mark.parametrize("name", IQ_QUANTIZED)
def test_quants_iq_quantize_decodes_as_gguf(name):
    r = np.random.default_rng(3)
    cases = {
        "normal": r.standard_normal((3, 768)),
        "outliers": r.standard_normal((2, 512)) * (1 + 20 * (r.random(512) < 0.01)),
        "sparse": r.standard_normal((2, 512)) * (r.random((2, 512)) < 0.1),
        "one_zero_sub_block": np.concatenate([np.zeros((1, 32)), r.standard_normal((1, 224))], axis=1),
        "all_negative": -np.abs(r.standard_normal((1, 256))),
    }
    for case, x in cases.items():
        x = x.astype(np.float32)
        for imp in (None, r.gamma(0.5, 1.0, x.shape[1]).astype(np.float32)):
            q, got = _roundtrip(name, x, importance=imp)
            want = gq.dequantize(np.frombuffer(q, np.uint8).reshape(x.shape[0], -1), GGMLQuantizationType[name])
            assert np.array_equal(got, want), case
            assert np.all(np.isfinite(got)), case
            # a sanity bound only (zeros would give 1): a 21x outlier leaves the other weights of its
            # sub-block on the lowest level, 0.76 here for IQ2_XXS (ggml's quantizer: 0.81)
            assert _rel(x, got) < 0.9, case


@pytest.mark.parametrize("name", IQ_QUANTIZED)
def test_quants_iq_quantize_zeros_are_exact(name):
    q, y = _roundtrip(name, np.zeros((2, 512), np.float32))
    assert not np.any(y)
    q, y = _roundtrip(name, np.zeros((1, 256), np.float32), importance=np.ones(256, np.float32))
    assert not np.any(y)


@pytest.mark.parametrize("name", IQ_QUANTIZED)
def test_quants_iq_quantize_error_within_budget_at_any_scale(name):
    x = np.random.default_rng(1).standard_normal((16, 1024)).astype(np.float32)
    errs = [_rel(x * s, _roundtrip(name, x * s)[1]) for s in (1e-3, 1.0, 1e3)]
    assert max(errs) < RMSE_BUDGET[name], errs
    assert max(errs) - min(errs) < 0.01 * RMSE_BUDGET[name]   # scale-free up to fp16 rounding


@pytest.mark.parametrize("name", IQ_QUANTIZED)
def test_quants_iq_importance_lowers_the_error_it_weighs(name):
    r = np.random.default_rng(1)
    x = r.standard_normal((16, 1024)).astype(np.float32)
    imp = r.gamma(0.5, 1.0, 1024).astype(np.float32)
    with_imp = _rel(x, _roundtrip(name, x, importance=imp)[1], imp)
    without = _rel(x, _roundtrip(name, x)[1], imp)
    assert with_imp < 0.85 * without, (with_imp, without)


@pytest.mark.parametrize("name", IQ_QUANTIZED)
def test_quants_iq_blocks_keep_unit_gain(name):
    r = np.random.default_rng(5)
    x = r.standard_normal((8, 1024)).astype(np.float32)
    for imp in (None, r.gamma(0.5, 1.0, 1024).astype(np.float32)):
        y = _roundtrip(name, x, importance=imp)[1]
        w = np.ones_like(x) if imp is None else np.broadcast_to(imp, x.shape)
        xb, yb, wb = (a.reshape(-1, 256).astype(np.float64) for a in (x, y, w))
        gain = (wb * xb * yb).sum(1) / (wb * xb * xb).sum(1)
        assert np.max(np.abs(gain - 1)) < 1e-3


@pytest.mark.parametrize("name", IQ_QUANTIZED)
def test_quants_iq_threads_and_row_splits_give_the_same_bytes(name):
    """Threads split the run at block boundaries inside rows; each must read its own columns'
    importance."""
    r = np.random.default_rng(7)
    x = r.standard_normal((5, 768)).astype(np.float32)
    imp = r.gamma(0.5, 1.0, 768).astype(np.float32)
    one = quants.quantize(name, x, n_threads=1, importance=imp)
    assert quants.quantize(name, x, n_threads=4, importance=imp) == one
    per_row = b"".join(quants.quantize(name, x[i:i + 1], n_threads=1, importance=imp) for i in range(5))
    assert per_row == one


def test_quants_iq_bad_importance_is_refused():
    x = np.ones((2, 256), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"importance has shape \(128,\)"):
        quants.quantize("IQ2_XXS", x, importance=np.ones(128, np.float32))
    for bad in (np.nan, -1.0, np.inf):
        imp = np.ones(256, np.float32)
        imp[7] = bad
        with pytest.raises(InvalidArgumentError, match=r"importance\[7\] is .*finite and >= 0"):
            quants.quantize("IQ3_XXS", x, importance=imp)
    with pytest.raises(InvalidArgumentError, match="type Q4_K's quantizer takes no importance"):
        quants.quantize("Q4_K", x, importance=np.ones(256, np.float32))
    assert [n for n, t in quants.TYPES.items() if t.takes_importance] == IQ_QUANTIZED + ["IQ4_NL"]


# -- against ggml's quantizer ---------------------------------------------------------------------

def _libggml_base():
    """llama-cpp-python's libggml-base (it exports ggml_quantize_chunk), or None."""
    import llamacpp_oracle

    path = os.environ.get("RAPIDMOE_LIBGGML_BASE")
    if not path:
        py = llamacpp_oracle.python()
        if py is None:
            return None
        out = subprocess.run([py, "-c", "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))"],
                             capture_output=True, text=True)
        path = os.path.join(out.stdout.strip(), "lib", "libggml-base.so")
    if not os.path.isfile(path):
        return None
    lib = ctypes.CDLL(path)
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p]
    return fn


def _bundled_experts(name: str, k: int) -> np.ndarray:
    """Expert k of a bundled model tensor as W = dequant(base) + dequant(residual), (rows, cols)."""
    import gguf

    from rapidmoe_gguf.bundled import bundled_model_path
    from rapidmoe_gguf.resplit import residual_path

    base = {t.name: t for t in gguf.GGUFReader(bundled_model_path()).tensors}[name]
    res = {t.name: t for t in gguf.GGUFReader(residual_path(bundled_model_path())).tensors}[
        name[:-len(".weight")] + ".residual"]
    shape = tuple(int(s) for s in reversed(base.shape))[1:]
    w = quants.dequantize(base.tensor_type.name, np.asarray(base.data[k]).tobytes(), shape)
    return w + quants.dequantize(res.tensor_type.name, np.asarray(res.data[k]).tobytes(), shape)


@pytest.mark.parametrize("name", IQ_QUANTIZED)
def test_quants_iq_error_comparable_to_ggml_quantizer(name):
    ggml_quantize_chunk = _libggml_base()
    if ggml_quantize_chunk is None:
        pytest.skip("llama-cpp-python's libggml-base not found (tools/bench_vs_llamacpp.py --install-only)")
    r = np.random.default_rng(11)
    num = {"ours": 0.0, "ggml": 0.0}
    den = 0.0
    for tensor in ("blk.0.ffn_up_exps.weight", "blk.2.ffn_down_exps.weight"):
        for k in (0, 5):
            x = np.ascontiguousarray(_bundled_experts(tensor, k), np.float32)
            # an importance like a real one: mean x^2 of activations whose scale varies by column
            imp = (r.gamma(0.7, 1.0, x.shape[1]) ** 2).astype(np.float32)
            theirs = np.zeros(quants.row_bytes(name, x.size), np.uint8)
            ggml_quantize_chunk(int(GGMLQuantizationType[name]), x.ctypes.data, theirs.ctypes.data, 0,
                                x.shape[0], x.shape[1], imp.ctypes.data)
            for who, q in (("ours", quants.quantize(name, x, importance=imp)), ("ggml", theirs.tobytes())):
                y = quants.dequantize(name, q, x.shape).astype(np.float64)
                num[who] += float((((x - y) ** 2) * imp).sum())
            den += float((x.astype(np.float64) ** 2 * imp).sum())
    ratio = np.sqrt(num["ours"] / num["ggml"])
    assert ratio < 1.03, f"{name}: weighted error {ratio:.3f}x ggml's"


# -- IQ4_NL ---------------------------------------------------------------------------------------

def test_quants_iq4_nl_quantize_decodes_as_gguf_and_errs_as_ggml():
    """IQ4_NL's bytes decode, by gguf-py, to what ours gives (zeros and a block of one sign too);
    the relative RMSE on N(0, 1) rows is 0.076 (measured; budget 0.08), an importance lowers the
    error it weighs, and, where llama-cpp-python
    is installed, within 1% of ggml's quantizer's on the same rows (measured 0.076 against 0.076;
    weighted by x^2, the weight both use without an importance, 1.004x) and on the bundled model's
    expert weights."""
    r = np.random.default_rng(5)
    x = r.standard_normal((8, 1024)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :64] = np.abs(x[1, :64])
    x[2] *= 1e-3
    q, got = _roundtrip("IQ4_NL", x)
    want = gq.dequantize(np.frombuffer(q, np.uint8).reshape(x.shape[0], -1), GGMLQuantizationType.IQ4_NL)
    assert np.array_equal(got, want)
    assert np.all(got[0, :32] == 0)
    assert _rel(x, got) < 0.08
    imp = r.gamma(0.5, 1.0, 1024).astype(np.float32)   # an importance lowers the error it weighs (0.915x)
    assert _rel(x, _roundtrip("IQ4_NL", x, importance=imp)[1], imp) < 0.95 * _rel(x, got, imp)
    ggml_quantize_chunk = _libggml_base()
    if ggml_quantize_chunk is None:
        pytest.skip("llama-cpp-python's libggml-base not found (tools/bench_vs_llamacpp.py --install-only)")
    rows = [x, np.ascontiguousarray(_bundled_experts("blk.0.ffn_up_exps.weight", 3), np.float32)]
    for y in rows:
        theirs = np.zeros(quants.row_bytes("IQ4_NL", y.size), np.uint8)
        ggml_quantize_chunk(int(GGMLQuantizationType.IQ4_NL), y.ctypes.data, theirs.ctypes.data, 0, y.shape[0],
                            y.shape[1], None)
        ours = quants.dequantize("IQ4_NL", quants.quantize("IQ4_NL", y), y.shape)
        ggml = quants.dequantize("IQ4_NL", theirs.tobytes(), y.shape)
        assert _rel(y, ours) < 1.01 * _rel(y, ggml)
        w = (y.astype(np.float64) ** 2)
        err = {k: float(((y - v) ** 2 * w).sum()) for k, v in (("ours", ours), ("ggml", ggml))}
        assert np.sqrt(err["ours"] / err["ggml"]) < 1.01
