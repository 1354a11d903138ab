"""Quant types: the native reference kernels against gguf-py, which is bit-exact with ggml.

gguf-py quantizes Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16 and BF16 and dequantizes those plus the
K-quants and the IQ types; where it has no kernel (K-quant quantizers, Q8_1/Q8_K) the tests state
error budgets or use a numpy formula. Most IQ types have no quantizer here: their tests take random
blocks (random bytes with a finite fp16 scale); IQ2_XXS's and IQ3_XXS's are tested in
test_quants_iq.py.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

from conftest import random_iq_blocks
from rapidmoe_gguf import planner, quants
from rapidmoe_gguf._native import check, ffi, lib
from rapidmoe_gguf.errors import InvalidArgumentError, UnsupportedError

GGUF_QUANTIZES = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]
K_QUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
GGUF_DEQUANTIZES = ["F32"] + GGUF_QUANTIZES + K_QUANTS
IQ_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "IQ1_M"]  # by id
IQ_QUANTIZED = ["IQ2_XXS", "IQ3_XXS", "IQ4_NL"]   # the IQ types with a quantizer (ours, not ggml's)
QUANTIZABLE = [name for name, t in quants.TYPES.items() if t.can_quantize]


def gtype(name):
    return GGMLQuantizationType[name]


def rng(seed):
    return np.random.default_rng(seed)


def edge_cases(n_rows, n, block, seed):
    """Named float32 arrays of shape (n_rows, n) that stress the block quantizers."""
    r = rng(seed)
    normal = r.standard_normal((n_rows, n)).astype(np.float32)
    cases = {
        "normal": normal,
        "uniform_scaled": (r.uniform(-1, 1, (n_rows, n)) * 10.0 ** r.integers(-3, 4, (n_rows, 1))).astype(np.float32),
        "all_equal": np.full((n_rows, n), 0.37, np.float32),
        "all_equal_negative": np.full((n_rows, n), -2.5, np.float32),
        "zeros_inside": np.where(r.random((n_rows, n)) < 0.3, 0, normal).astype(np.float32),
        "negative_dominant": (normal - np.where(r.random((n_rows, n)) < 0.05, 20, 0)).astype(np.float32),
        "huge_f16_range": (normal * 1e3).astype(np.float32),
        "huge_1e30": (normal * 1e30).astype(np.float32),
        "tiny_1e-30": (normal * 1e-30).astype(np.float32),
        "integers": np.round(normal * 4).astype(np.float32),
    }
    zero_blocks = normal.copy()
    zero_blocks[:, :block] = 0
    if n >= 3 * block:
        zero_blocks[:, 2 * block:3 * block] = 0
    cases["zero_blocks"] = zero_blocks
    cases["all_zero"] = np.zeros((n_rows, n), np.float32)
    return cases


SHAPES_32 = [(1, 32), (3, 96), (8, 256), (2, 4096)]


@pytest.mark.parametrize("name", GGUF_QUANTIZES)
@pytest.mark.parametrize("shape", SHAPES_32, ids=lambda s: f"{s[0]}x{s[1]}")
def test_quants_quantize_matches_gguf(name, shape):
    block = quants.TYPES[name].block_elems
    for case, x in edge_cases(*shape, max(block, 32), seed=shape[1]).items():
        with np.errstate(all="ignore"):
            want = gq.quantize(x, gtype(name)).tobytes()
        got = quants.quantize(name, x)
        assert got == want, f"{name} {shape} {case}"


@pytest.mark.parametrize("name", GGUF_DEQUANTIZES)
def test_quants_dequantize_matches_gguf_on_our_data(name):
    block = quants.TYPES[name].block_elems
    n = 1024 if block < 256 else 2048
    for case, x in edge_cases(4, n, block, seed=7).items():
        if case == "huge_1e30" and name != "F32" and name != "BF16":
            continue  # scales overflow fp16 to inf and inf * 0 is nan: nothing to compare
        q = quants.quantize(name, x)
        want = gq.dequantize(np.frombuffer(q, np.uint8).reshape(4, -1), gtype(name))
        got = quants.dequantize(name, q, x.shape)
        assert got.shape == x.shape and got.dtype == np.float32
        assert got.tobytes() == want.tobytes(), f"{name} {case}"


@pytest.mark.parametrize("name", GGUF_QUANTIZES)
def test_quants_dequantize_matches_gguf_on_gguf_data(name):
    x = rng(3).standard_normal((6, 512)).astype(np.float32)
    q = gq.quantize(x, gtype(name))
    got = quants.dequantize(name, q, x.shape)
    assert got.tobytes() == gq.dequantize(q, gtype(name)).tobytes()


# Byte offsets of the fp16 scale fields in each block: random bytes there could be inf/nan.
SCALE_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "MXFP4": [],  # its E8M0 scale has no inf or nan: every byte is compared as it comes
}


@pytest.mark.parametrize("name", list(SCALE_FIELDS) + ["F16", "BF16"])
def test_quants_dequantize_matches_gguf_on_random_bits(name):
    """Every bit of the quants and packed sub-block scales, not just what a quantizer writes."""
    t = quants.TYPES[name]
    n_blocks = 64 if t.block_elems > 1 else 4096
    raw = rng(11).integers(0, 256, (n_blocks, t.block_bytes), dtype=np.uint8)
    finite = (rng(12).standard_normal(n_blocks * 2) * 0.1).astype(np.float16).view(np.uint8).reshape(n_blocks, 4)
    for k, off in enumerate(SCALE_FIELDS.get(name, [])):
        raw[:, off:off + 2] = finite[:, 2 * k:2 * k + 2]
    if name == "F16":  # keep nans out: hardware conversions may quiet them
        h = raw.view(np.uint16)
        h[(h & 0x7C00) == 0x7C00] &= 0xFC00
    n = n_blocks * t.block_elems
    got = quants.dequantize(name, raw.tobytes(), (n,))
    want = gq.dequantize(raw.reshape(1, -1), gtype(name)).reshape(-1)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("name", ["Q8_1", "Q8_K"])
def test_quants_dequantize_activation_types(name):
    """gguf-py has no kernels for these: check the layout with numpy."""
    x = rng(5).standard_normal((3, 512)).astype(np.float32)
    q = np.frombuffer(quants.quantize(name, x), np.uint8).reshape(-1, quants.TYPES[name].block_bytes)
    if name == "Q8_1":
        d = q[:, 0:2].copy().view(np.float16).astype(np.float32)
        s = q[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = q[:, 4:].view(np.int8).astype(np.float32)
        np.testing.assert_allclose(s[:, 0], d[:, 0] * qs.sum(1), rtol=2e-3, atol=1e-3)
    else:
        d = q[:, 0:4].copy().view(np.float32)
        qs = q[:, 4:260].view(np.int8).astype(np.float32)
        bsums = q[:, 260:].copy().view(np.int16)
        assert (bsums == qs.reshape(-1, 16, 16).sum(-1)).all()
    want = (d * qs).reshape(x.shape)
    got = quants.dequantize(name, q.tobytes(), x.shape)
    assert got.tobytes() == want.tobytes()
    assert np.abs(got - x).max() <= np.abs(x).max() / 127  # half a level, with margin


# Round-trip RMSE on N(0, 1) data, 64 x 4096 values. Measured: Q2_K 0.297, Q3_K 0.151,
# Q4_K 0.0716, Q5_K 0.0361, Q6_K 0.0178, Q8_K 0.0070; budgets leave ~5% headroom.
RMSE_BUDGET = {"Q2_K": 0.31, "Q3_K": 0.16, "Q4_K": 0.075, "Q5_K": 0.038, "Q6_K": 0.019, "Q8_K": 0.0075}


def test_quants_k_budgets_are_monotone():
    budgets = [RMSE_BUDGET[name] for name in K_QUANTS + ["Q8_K"]]
    assert budgets == sorted(budgets, reverse=True)


@pytest.mark.parametrize("name", list(RMSE_BUDGET))
def test_quants_k_roundtrip_rmse_within_budget(name):
    x = rng(21).standard_normal((64, 4096)).astype(np.float32)
    y = quants.dequantize(name, quants.quantize(name, x), x.shape)
    rmse = float(np.sqrt(np.mean((y - x) ** 2)))
    assert rmse < RMSE_BUDGET[name], f"{name}: rmse {rmse:.4f}"
    assert rmse > RMSE_BUDGET[name] / 2, f"{name}: rmse {rmse:.4f} is suspiciously low"


# vec_dot: the error |got - dot(dequant(w), x)| relative to |w| |x|, on n = 4096 N(0, 1) values.
# With Q8 activations it is the activation rounding: measured up to 3.7e-4 over 200 rows of
# every type; with F32 activations (F32/F16/BF16 weights) it is float rounding, ~2e-9.
VEC_DOT_TOL = {name: 1e-3 for name in QUANTIZABLE}
VEC_DOT_TOL.update({"F32": 1e-6, "F16": 1e-6, "BF16": 1e-6})


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_quants_vec_dot_matches_float64_dot(name):
    r = rng(31)
    n = 4096
    for _ in range(8):
        w = r.standard_normal(n).astype(np.float32)
        x = r.standard_normal(n).astype(np.float32)
        qw = quants.quantize(name, w)
        wd = quants.dequantize(name, qw, n).astype(np.float64)
        want = wd @ x.astype(np.float64)
        got = quants.vec_dot(name, qw, x)
        err = abs(got - want) / (np.linalg.norm(wd) * np.linalg.norm(x))
        assert err < VEC_DOT_TOL[name], f"{name}: error {err:.2e}"


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_quants_vec_dot_kernel_is_exact_on_quantized_activations(name):
    """Against the activations as the kernel sees them, only float32 accumulation error is left."""
    r = rng(41)
    n = 2048
    w = (r.standard_normal(n) * 3).astype(np.float32)
    x = r.standard_normal(n).astype(np.float32)
    act = quants.TYPES[name].vec_dot_type
    qx = quants.quantize(act, x)
    xd = quants.dequantize(act, qx, n).astype(np.float64)
    qw = quants.quantize(name, w)
    wd = quants.dequantize(name, qw, n).astype(np.float64)
    got = quants.vec_dot(name, qw, x)
    tol = 1e-5 * np.linalg.norm(wd) * np.linalg.norm(xd)
    if act == "Q8_1":
        # the offset term m * sum(x) takes sum(x) from the fp16 field s: half an fp16 ulp per block
        m = np.frombuffer(qw, np.uint8).reshape(-1, quants.TYPES[name].block_bytes)[:, 2:4].copy().view(np.float16)
        s = np.frombuffer(qx, np.uint8).reshape(-1, 36)[:, 2:4].copy().view(np.float16)
        tol += np.sum(np.abs(m.astype(np.float64) * s.astype(np.float64))) * 2.0 ** -11
    assert abs(got - wd @ xd) <= tol


def test_quants_table_agrees_with_gguf_sizes():
    assert set(quants.TYPES) == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
                                 "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "MXFP4", *IQ_TYPES}
    for name, t in quants.TYPES.items():
        assert t.id == gtype(name).value
        if name == "Q8_1":
            # gguf-py still says 4 + 4 + 32 from when d and s were float32; ggml's block_q8_1 has
            # held two fp16 since (static_assert 2 * sizeof(ggml_half) + 32). Q8_1 is an
            # activation type only, never stored in GGUF files.
            assert GGML_QUANT_SIZES[gtype(name)] == (32, 40)
            assert (t.block_elems, t.block_bytes) == (32, 36)
            continue
        assert (t.block_elems, t.block_bytes) == GGML_QUANT_SIZES[gtype(name)], name
    for name, t in quants.TYPES.items():
        assert t.is_quantized == (t.block_elems > 1)
        assert t.can_quantize == (name not in IQ_TYPES or name in IQ_QUANTIZED)
        assert quants.type_info(t.id) is t
        assert quants.type_info(gtype(name)) is t
        assert quants.type_info(name.lower()) is t
        assert quants.row_bytes(name, 3 * t.block_elems) == 3 * t.block_bytes
        assert lib.rm_row_bytes(t.id, 3 * t.block_elems) == 3 * t.block_bytes
    dot_types = {name: t.vec_dot_type for name, t in quants.TYPES.items()}
    assert dot_types == {
        "F32": "F32", "F16": "F32", "BF16": "F32",
        "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1", "Q8_1": "Q8_1",
        "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K", "Q8_K": "Q8_K",
        "IQ2_XXS": "Q8_K", "IQ2_XS": "Q8_K", "IQ2_S": "Q8_K", "IQ3_XXS": "Q8_K", "IQ3_S": "Q8_K",
        "IQ1_S": "Q8_K", "IQ1_M": "Q8_K", "IQ4_NL": "Q8_0", "IQ4_XS": "Q8_K", "MXFP4": "Q8_0",
    }


def test_quants_threads_do_not_change_bytes():
    x = rng(51).standard_normal((64, 4096)).astype(np.float32)
    for name in ["Q4_K", "Q8_0"]:
        one = quants.quantize(name, x, n_threads=1)
        assert quants.quantize(name, x, n_threads=4) == one
        assert quants.quantize(name, x) == one
        assert b"".join(quants.quantize(name, row) for row in x[:3]) == one[:3 * quants.row_bytes(name, 4096)]


def test_quants_accepts_any_float_array():
    x = rng(61).standard_normal((2, 3, 64))
    want = quants.quantize("Q8_0", x.astype(np.float32))
    assert quants.quantize("Q8_0", x) == want  # float64
    assert quants.quantize("Q8_0", np.asfortranarray(x)) == want
    assert quants.dequantize("Q8_0", np.frombuffer(want, np.uint8), (2, 3, 64)).shape == (2, 3, 64)
    assert quants.quantize("Q4_K", np.zeros((0, 256), np.float32)) == b""


def test_quants_unknown_type_name_raises():
    x = np.zeros(32, np.float32)
    with pytest.raises(UnsupportedError, match="'Q9_K'"):
        quants.quantize("Q9_K", x)
    with pytest.raises(UnsupportedError, match="NVFP4"):
        quants.type_info("NVFP4")
    with pytest.raises(UnsupportedError, match="type 40 is not supported"):
        quants.type_info(40)
    with pytest.raises(UnsupportedError, match="rm_quantize: type IQ4_XS has no quantizer"):
        quants.quantize("IQ4_XS", np.zeros(256, np.float32))
    with pytest.raises(UnsupportedError, match="type 999 is not supported"):
        quants.type_info(999)
    with pytest.raises(UnsupportedError, match="type -1"):
        check(lib.rm_quantize(-1, ffi.from_buffer("float[]", x), 1, 32, ffi.new("char[64]"), 64, 1))


def test_quants_row_not_multiple_of_block_raises():
    with pytest.raises(InvalidArgumentError, match=r"rm_quantize: type Q4_K: n_per_row 100 is not a multiple of the block size 256"):
        quants.quantize("Q4_K", np.zeros((2, 100), np.float32))
    with pytest.raises(InvalidArgumentError, match="n_per_row is 0"):
        quants.quantize("Q8_0", np.zeros((2, 0), np.float32))
    with pytest.raises(InvalidArgumentError, match="multiple of the block size 32"):
        quants.dequantize("Q4_0", b"\0" * 18, (16,))
    with pytest.raises(InvalidArgumentError, match="not a multiple of the block size 256"):
        quants.row_bytes("Q6_K", 100)
    assert lib.rm_row_bytes(lib.RM_TYPE_Q6_K, 100) == 0
    with pytest.raises(InvalidArgumentError, match="n 40 is not a multiple"):
        check(lib.rm_dequantize(lib.RM_TYPE_Q8_0, b"\0" * 68, 68, ffi.new("float[64]"), 40))


def test_quants_too_small_buffers_raise():
    x = np.zeros((2, 256), np.float32)
    dst = ffi.new("char[]", 287)
    with pytest.raises(InvalidArgumentError, match="rm_quantize: type Q4_K: 2 rows of 256 elements need 288 bytes, dst holds 287"):
        check(lib.rm_quantize(lib.RM_TYPE_Q4_K, ffi.from_buffer("float[]", x), 2, 256, dst, 287, 1))
    with pytest.raises(InvalidArgumentError, match="rm_dequantize: type Q8_0: 64 elements need 68 bytes, src has 67"):
        check(lib.rm_dequantize(lib.RM_TYPE_Q8_0, b"\0" * 67, 67, ffi.new("float[64]"), 64))
    with pytest.raises(InvalidArgumentError, match="needs 68 bytes, got 67"):
        quants.dequantize("Q8_0", b"\0" * 67, (2, 32))
    with pytest.raises(InvalidArgumentError, match="needs 68 bytes, got 69"):
        quants.dequantize("Q8_0", b"\0" * 69, (2, 32))
    with pytest.raises(InvalidArgumentError, match="64 weights need 68 bytes, got 34"):
        quants.vec_dot("Q8_0", b"\0" * 34, np.zeros(64, np.float32))
    with pytest.raises(InvalidArgumentError, match="rm_vec_dot: type Q4_K: 256 weights need 144 bytes, w has 100"):
        check(lib.rm_vec_dot(lib.RM_TYPE_Q4_K, b"\0" * 100, 100, ffi.from_buffer("float[]", x), 256, ffi.new("float *")))


def test_quants_null_pointers_raise():
    with pytest.raises(InvalidArgumentError, match="rm_quantize: type Q8_0: src is NULL"):
        check(lib.rm_quantize(lib.RM_TYPE_Q8_0, ffi.NULL, 1, 32, ffi.new("char[34]"), 34, 1))
    with pytest.raises(InvalidArgumentError, match="rm_dequantize: type Q8_0: dst is NULL"):
        check(lib.rm_dequantize(lib.RM_TYPE_Q8_0, b"\0" * 34, 34, ffi.NULL, 32))
    with pytest.raises(InvalidArgumentError, match="out is NULL"):
        check(lib.rm_type_describe(lib.RM_TYPE_Q8_0, ffi.NULL))


def test_quants_iq_types_are_the_ones_without_a_quantizer():
    assert [name for name, t in quants.TYPES.items() if not t.can_quantize] == [
        n for n in IQ_TYPES if n not in IQ_QUANTIZED]


@pytest.mark.parametrize("name", IQ_TYPES)
def test_quants_iq_dequantize_matches_gguf_on_every_shape(name):
    """One block, a few rows and a long row: gguf-py's numpy dequantizer gives the same floats.
    IQ1_M is also compared with every delta sign bit set and every one clear (bit 3 of each qh
    nibble: -1/8 when set, +1/8 when clear), so both shifts are checked whatever the draw."""
    t = quants.TYPES[name]
    for n_rows, blocks_per_row in [(1, 1), (3, 2), (2, 4096 // t.block_elems)]:
        raw = random_iq_blocks(name, n_rows * blocks_per_row, seed=n_rows)
        variants = [raw]
        if name == "IQ1_M":   # qs (32 bytes), then qh (16 bytes): a nibble per group of 8
            variants += [raw.copy(), raw.copy()]
            variants[1][:, 32:48] |= 0x88
            variants[2][:, 32:48] &= 0x77
        shape = (n_rows, blocks_per_row * t.block_elems)
        for v in variants:
            got = quants.dequantize(name, v.tobytes(), shape)
            want = gq.dequantize(v.reshape(n_rows, -1), gtype(name))
            assert got.shape == shape and np.any(got != 0)
            assert got.tobytes() == want.tobytes()


# IQ vec_dot: random blocks against N(0, 3) activations with outliers. Against the activations
# as the kernel sees them (dequantized Q8_0/Q8_K) only float32 rounding is left: measured up to
# 2e-8 of |w| |x| (IQ4_NL, whose 32-element blocks add up the most float terms), budget 1e-5 as
# for the other types. Against the float activations the Q8 rounding adds at most |w| |x - x_q|
# (Cauchy-Schwarz), large here because the outliers set the step.
@pytest.mark.parametrize("name", IQ_TYPES)
def test_quants_iq_vec_dot_matches_float64_dot(name):
    t = quants.TYPES[name]
    r = rng(71)
    for n in (t.block_elems, 2048, 4096 + 256):
        for k in range(4):
            w = random_iq_blocks(name, n // t.block_elems, seed=100 * k + n).tobytes()
            wd = quants.dequantize(name, w, n).astype(np.float64)
            x = (r.standard_normal(n) * 3).astype(np.float32)
            x[r.random(n) < 0.02] *= 20
            xd = quants.dequantize(t.vec_dot_type, quants.quantize(t.vec_dot_type, x), n).astype(np.float64)
            got = quants.vec_dot(name, w, x)
            scale = np.linalg.norm(wd) * np.linalg.norm(xd)
            assert abs(got - wd @ xd) <= 1e-5 * scale, f"{name} n={n}"
            rounding = np.linalg.norm(wd) * np.linalg.norm(x.astype(np.float64) - xd)
            assert abs(got - wd @ x.astype(np.float64)) <= rounding + 1e-5 * scale


def test_quants_iq_grids_are_gguf_pys():
    """The codebooks in native/src/format/iq_grids.h are what tools/gen_iq_grids.py makes of the installed
    gguf package's tables today: regenerate the header when this fails."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("gen_iq_grids", root / "tools" / "gen_iq_grids.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    header = (root / "native" / "src" / "format" / "iq_grids.h").read_text()
    assert header == gen.render()
    # and the library's 16 IQ4 levels are gguf-py's: one IQ4_NL block with d = 1 and indices 0..15
    block = np.concatenate([np.array([1.0], np.float16).view(np.uint8),
                            np.arange(16, dtype=np.uint8)])  # low nibbles 0..15, high nibbles 0
    levels = quants.dequantize("IQ4_NL", block.tobytes(), 32)
    assert tuple(levels[:16].astype(int)) == gq.IQ4_NL.kvalues


def test_quants_the_librarys_whole_type_table_agrees_with_gguf_py():
    """One type table (native/src/format/types.c) sizes every tensor the GGUF reader meets, implemented
    or not; its block geometry is gguf-py's (GGML_QUANT_SIZES, which the converter writes with),
    but for Q8_1, whose layout gguf-py 0.19.0 still gives as the 40 bytes ggml dropped."""
    known = {int(t): v for t, v in GGML_QUANT_SIZES.items()}
    assert set(known) <= set(quants.GGML_BLOCKS)
    for type_id, (name, elems, nbytes) in quants.GGML_BLOCKS.items():
        if type_id in known and name != "Q8_1":
            assert (elems, nbytes) == known[type_id], name
            assert name == GGMLQuantizationType(type_id).name
        if name in quants.TYPES:
            t = quants.TYPES[name]
            assert (t.id, t.block_elems, t.block_bytes) == (type_id, elems, nbytes)
    removed = {i for i, (_, elems, _) in quants.GGML_BLOCKS.items() if elems == 0}
    assert removed == {4, 5, 31, 32, 33, 36, 37, 38}
    assert quants.CUDA_MATMUL_TYPES == {"F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                        "Q4_K", "Q5_K", "Q6_K", "MXFP4", "IQ4_NL", "IQ4_XS", "IQ2_XXS",
                                        "IQ3_XXS"}
    assert planner.GPU_MATMUL_TYPES is quants.CUDA_MATMUL_TYPES
