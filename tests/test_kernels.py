"""CPU kernel sets: every SIMD kernel against its scalar reference twin, for every set this machine
runs, and the choice of set (RAPIDMOE_ISA) in fresh processes.

Error budget of the dot kernels: |simd - reference| <= TOL * |w| * |x|, with |w| and |x| the norms
of the dequantized weight row and activations. The integer parts are exact in both, so what is
left is float summation order: measured up to 7.2e-8 (F32/F16, whose products are float too) and
4.3e-8 (block types; Q4_1 6.7e-8 and Q5_1 1.1e-7, whose blocks add two float terms, d_w d_x sum(q q_x)
and m_w s_x) over the cases below; the budget is 1e-6. The activation quantizers must give
the reference's bytes exactly, nan and inf included.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import random_iq_blocks
from rapidmoe_gguf import kernels, quants
from rapidmoe_gguf.errors import InvalidArgumentError, UnsupportedError

SIMD_TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "Q5_0", "Q4_1", "Q5_1"]
TOL = 1e-6
SIMD_ISAS = [isa for isa in kernels.supported_isas() if isa != "scalar"]

# Byte offsets of the fp16 scale fields in each block: random bytes there could be inf/nan.
SCALE_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
                "MXFP4": [], "Q5_0": [0], "Q4_1": [0, 2], "Q5_1": [0, 2]}
# Byte offsets of E8M0 exponents: random ones reach 2^127, whose products overflow float.
E8M0_FIELDS = {"MXFP4": 0}

needs_simd = pytest.mark.skipif(not SIMD_ISAS, reason="this machine runs no SIMD kernel set")


def rng(seed):
    return np.random.default_rng(seed)


def act_type(name):
    return quants.TYPES[name].vec_dot_type


def random_rows(name, n_rows, n, seed):
    """Weight rows two ways: quantized from N(0, s) data with s varying per row, and (for the
    block types) random bytes with small finite scales, which reach every level and packed scale."""
    r = rng(seed)
    t = quants.TYPES[name]
    x = (r.standard_normal((n_rows, n)) * 10.0 ** r.uniform(-2, 2, (n_rows, 1))).astype(np.float32)
    rows = [quants.quantize(name, x)]
    if t.is_quantized:
        nb = n_rows * n // t.block_elems
        raw = r.integers(0, 256, (nb, t.block_bytes), dtype=np.uint8)
        scales = (r.uniform(0.5, 2, nb * 2) * 0.01).astype(np.float16).view(np.uint8).reshape(nb, 4)
        for k, off in enumerate(SCALE_FIELDS[name]):
            raw[:, off:off + 2] = scales[:, 2 * k:2 * k + 2]
        if name in E8M0_FIELDS:
            raw[:, E8M0_FIELDS[name]] = r.integers(110, 140, nb)
        rows.append(raw.tobytes())
    return rows


def activations(name, n, seed, n_tok=1):
    """n_tok rows of activations, as floats and as the kernel takes them (quantized, or F32)."""
    r = rng(seed)
    x = (r.standard_normal((n_tok, n)) * 3).astype(np.float32)
    x[r.random((n_tok, n)) < 0.02] *= 20  # a few outliers, as real activations have
    act = act_type(name)
    return x, (x.tobytes() if act == "F32" else quants.quantize(act, x))


def norms(name, w, x_q, n):
    """Row norms of the dequantized weights and of the dequantized activations (per token)."""
    wd = quants.dequantize(name, w, (len(w) // quants.row_bytes(name, n), n)).astype(np.float64)
    act = act_type(name)
    n_tok = len(x_q) // quants.row_bytes(act, n)
    xd = np.frombuffer(x_q, np.float32) if act == "F32" else quants.dequantize(act, x_q, (n_tok, n))
    return np.linalg.norm(wd, axis=1), np.linalg.norm(xd.reshape(n_tok, n).astype(np.float64), axis=1)


def sizes(name):
    block = max(quants.TYPES[name].block_elems, quants.TYPES[act_type(name)].block_elems)
    if block == 1:
        return [1, 7, 8, 100, 2048, 4096 + 13]  # every tail of the 8-, 16- and 64-wide loops
    return [block, 3 * block, 2048, 4096 + block]


def test_kernels_isa_in_use_is_supported():
    isas = kernels.supported_isas()
    assert isas[0] == "scalar"
    assert kernels.cpu_isa() in isas
    assert set(isas) <= set(kernels.ISAS)


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("name", SIMD_TYPES)
def test_kernels_vec_dot_matches_reference(name, isa):
    """Six tokens, one at a time through the one-token kernel and as the backend takes them (the
    first four through the multi-token kernel where the type has one)."""
    for n in sizes(name):
        x, x_q = activations(name, n, seed=n, n_tok=6)
        for k, w in enumerate(random_rows(name, 16, n, seed=n + 1)):
            want = kernels.vec_dot_rows(name, w, x_q, n, isa="scalar")
            wn, xn = norms(name, w, x_q, n)
            assert want.shape == (6, 16) and np.all(np.isfinite(want)) and np.all(want != 0)
            for batched in (False, True):
                got = kernels.vec_dot_rows(name, w, x_q, n, isa=isa, batched=batched)
                err = np.abs(got.astype(np.float64) - want) / (xn[:, None] * wn[None, :])
                assert err.max() <= TOL, f"{name} {isa} n={n} rows#{k} batched={batched}: error {err.max():.2e}"


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("name", SIMD_TYPES)
def test_kernels_batched_tokens_equal_single_tokens(name, isa):
    """A token's result does not depend on the batch around it: the multi-token kernels give the
    one-token kernels' floats bit for bit (so prefill and decode see the same numbers)."""
    for n in (1024, 1024 + 96):  # block groups of eight, and a tail
        if n % quants.TYPES[name].block_elems:
            continue
        w = random_rows(name, 8, n, seed=6)[0]
        for n_tok in (2, 3, 7, 9, 11):  # calls of 8, 4 and what is left (1 to 3 tokens)
            _, x_q = activations(name, n, seed=5, n_tok=n_tok)
            batched = kernels.vec_dot_rows(name, w, x_q, n, isa=isa)
            assert batched.tobytes() == kernels.vec_dot_rows(name, w, x_q, n, isa=isa, batched=False).tobytes()
            step = len(x_q) // n_tok
            for i in range(n_tok):
                alone = kernels.vec_dot_rows(name, w, x_q[i * step:(i + 1) * step], n, isa=isa)
                assert alone.tobytes() == batched[i:i + 1].tobytes(), f"{name} {isa} token {i} of {n_tok}"


def tiled_against_reference(name, isa, n, n_rows, n_tok):
    """Random rows of a type (quantized, and random blocks) against n_tok tokens through isa's
    batched path, each within TOL of the scalar reference: yields (rows, activations, result)."""
    _, x_q = activations(name, n, seed=n + n_tok, n_tok=n_tok)
    rows = (random_rows(name, n_rows, n, seed=n_tok) if not name.startswith("IQ") else
            [random_iq_blocks(name, n_rows * n // quants.TYPES[name].block_elems, seed=n_tok).tobytes()])
    for k, w in enumerate(rows):
        want = kernels.vec_dot_rows(name, w, x_q, n, isa="scalar")
        assert want.shape == (n_tok, n_rows) and np.all(np.isfinite(want)) and np.all(want != 0)
        got = kernels.vec_dot_rows(name, w, x_q, n, isa=isa)
        wn, xn = norms(name, w, x_q, n)
        err = np.abs(got.astype(np.float64) - want) / (xn[:, None] * wn[None, :])
        assert err.max() <= TOL, f"{isa} {name} n={n} rows#{k}: error {err.max():.2e}"
        yield w, x_q, got


# The AMX set's tile form (prefill, from 16 tokens on for Q8_0/Q4_0/Q2_K/IQ2_XXS, 10 for Q6_K, 32
# for the other K-quants and IQ types, the AVX-512 set's tiles below; Q8_0/Q4_0 rows of whole groups
# of eight blocks, K-quant rows of whole super-blocks).
# Every tile gives the AVX-512 set's floats bit for bit: the same integers, then the same float
# steps (for the K-quants and IQ4_XS, simd_x86.h's kq_sum).
AMX_TYPES = ["Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ3_XXS"]
needs_amx = pytest.mark.skipif("amx" not in kernels.supported_isas(), reason="this machine or build has no AMX")


@needs_amx
@pytest.mark.parametrize("name", AMX_TYPES)
def test_kernels_amx_tiles_match_reference(name):
    """Many tokens through the AMX tiles, against the scalar reference (TOL), and against the
    AVX-512 set and each token alone through its one-token kernel, bit for bit. Sizes cover a
    partial tile of rows and of tokens, one token past a tile, a single group, and (K-quants) rows
    of 2, 3 and 8 super-blocks, a partial and a whole group of the float steps' eight lanes; and
    fewer tokens than the tiles take (6 and 3), where the AVX-512 set's tiles serve from their own
    least number of tokens (rm_cpu_tile_below)."""
    for n, n_rows, n_tok in [(2048, 40, 37), (256, 16, 16), (768, 33, 17), (4096, 5, 64), (1024, 20, 12),
                             (512, 17, 16), (768, 18, 8), (512, 19, 6), (768, 17, 3)]:
        for w, x_q, got in tiled_against_reference(name, "amx", n, n_rows, n_tok):
            avx512 = kernels.vec_dot_rows(name, w, x_q, n, isa="avx512")
            assert got.tobytes() == avx512.tobytes(), f"{name} n={n}: not the AVX-512 floats"
            for i in range(n_tok):   # and each token alone, through the one-token kernel
                alone = kernels.vec_dot_rows(name, w, x_q[i * len(x_q) // n_tok:(i + 1) * len(x_q) // n_tok], n,
                                             isa="amx", batched=False)
                assert alone.tobytes() == got[i:i + 1].tobytes()


# The tile form without AMX (kq_rows_x86.h: sixteen rows side by side in the registers; in the
# AVX-512 set with VNNI and in the AVX2 set, whose Q8_0, IQ4_NL and IQ4_XS take the sign trick
# without AVX-VNNI, and IQ2_XXS and IQ3_XXS with it too), from six tokens on (IQ2_XXS and IQ3_XXS
# from two): the set's floats bit for bit as well.
ROWS_CASES = [(isa, name) for isa in ("avx2", "avx512") if isa in kernels.supported_isas()
              for name in ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q8_0", "Q5_0", "IQ4_NL", "MXFP4", "IQ4_XS",
                                                                            "IQ2_XXS", "IQ3_XXS"]]
BLOCK32_TYPES = {"Q4_0", "Q8_0", "Q5_0", "IQ4_NL", "MXFP4"}


@pytest.mark.skipif(not ROWS_CASES, reason="this machine or build has neither AVX2 nor AVX-512")
@pytest.mark.parametrize("isa,name", ROWS_CASES)
def test_kernels_row_tiles_equal_single_tokens(isa, name):
    """Many tokens through a set's tile form against the scalar reference (TOL) and each token
    alone through the one-token kernel, bit for bit: a partial tile of rows (and one of at most
    eight, half a tile in the AVX2 set), partial passes of tokens (8 or 4 at a time) and one past
    them, the fewest tokens it takes (6; 2 for IQ2_XXS and IQ3_XXS; 10 for the 32-element types
    but Q8_0 in the AVX-512 set), rows of 1, 2, 3 and 9 super-blocks (a partial and a whole group
    of the float steps' eight lanes, and one past it); for the 32-element types also rows that end
    inside a group of eight blocks (90, 11 and 7 blocks) or hold none whole (3). In the AVX2 set
    without AVX-VNNI, Q8_0 and IQ4_NL (whose levels would overflow vpmaddubsw's pairs with an
    offset) take the sign trick, as IQ4_XS, IQ2_XXS and IQ3_XXS do there with or without it: the
    same check."""
    sizes = [(2048, 40, 37), (256, 16, 8), (768, 33, 17), (2304, 5, 9), (512, 17, 16), (768, 18, 6), (1024, 7, 11)]
    if name in BLOCK32_TYPES:
        sizes += [(2880, 20, 13), (352, 9, 11), (224, 17, 16), (96, 3, 10)]
    if name in ("IQ2_XXS", "IQ3_XXS"):   # from 2 tokens on
        sizes += [(768, 18, 2), (512, 9, 3)]
    for n, n_rows, n_tok in sizes:
        for w, x_q, got in tiled_against_reference(name, isa, n, n_rows, n_tok):
            step = len(x_q) // n_tok
            for i in range(n_tok):
                alone = kernels.vec_dot_rows(name, w, x_q[i * step:(i + 1) * step], n, isa=isa, batched=False)
                assert alone.tobytes() == got[i:i + 1].tobytes(), f"{isa} {name} n={n} token {i}"


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_kernels_mxfp4_subnormal_and_small_scales(isa):
    """MXFP4 exponents 0 and 1 give the subnormal scales 2^-128 and 2^-127 (the SIMD kernels decode
    eight at a time with shifts, not rm_e8m0_to_fp32_half): rows whose every block has such a
    scale, or 2 and 3, or a mix, against the reference within TOL, one token at a time and
    batched (the prefill form from eight tokens on), batched bit for bit as single tokens. The
    row has four groups of eight blocks and three blocks past them."""
    n = 35 * 32
    r = rng(12)
    raw = r.integers(0, 256, (4, 35, 17), dtype=np.uint8)
    for k, choices in enumerate(([0, 1], [2, 3], [0, 1, 2, 3], [0, 1, 126, 127])):
        raw[k, :, 0] = r.choice(choices, 35)
    w = raw.tobytes()
    _, x_q = activations("MXFP4", n, seed=13, n_tok=9)
    want = kernels.vec_dot_rows("MXFP4", w, x_q, n, isa="scalar")
    assert want.shape == (9, 4) and np.all(np.isfinite(want)) and np.all(want != 0)
    wn, xn = norms("MXFP4", w, x_q, n)
    got = kernels.vec_dot_rows("MXFP4", w, x_q, n, isa=isa, batched=False)
    err = np.abs(got.astype(np.float64) - want) / (xn[:, None] * wn[None, :])
    assert err.max() <= TOL, f"{isa}: error {err.max():.2e}"
    assert kernels.vec_dot_rows("MXFP4", w, x_q, n, isa=isa).tobytes() == got.tobytes()
    for n_tok in (1, 9):   # rows repacked as at load: the stored form, then the tiles
        assert (kernels.vec_dot_rows("MXFP4", w, x_q[:n_tok * len(x_q) // 9], n, isa=isa, stored=True).tobytes()
                == got[:n_tok].tobytes())


# Q4_0 and MXFP4 rows repacked at load into the x86 sets' stored layout (Q4_0's rows of whole groups
# of eight blocks only; MXFP4's also with blocks past the last group, as gpt-oss's 2,880 have).
STORED_TYPES = ["Q4_0", "MXFP4"]


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("name", STORED_TYPES)
def test_kernels_stored_rows_equal_the_file_layout(name, isa):
    """Rows in the stored layout give the file layout's floats bit for bit, however many tokens
    (the one-token form up to 7, the stored groups unpacked for the prefill form from 8, the tiles
    from 10): whole groups, a tail of 2 and 3 blocks past them, a single group, and rows that hold
    no whole group (kept in the file's layout). In a set without a stored layout the same path as
    the file's, so the same check holds."""
    for n, n_rows, n_toks in [(2048, 19, (1, 3, 4, 5, 8, 9, 12, 17)), (2880, 21, (1, 4, 7, 8, 11, 16)),
                              (352, 17, (1, 9, 10)), (256, 5, (2, 8, 13)), (224, 3, (1, 10))]:
        for k, w in enumerate(random_rows(name, n_rows, n, seed=n)):   # quantized rows, random blocks
            for n_tok in n_toks:
                _, x_q = activations(name, n, seed=n + n_tok, n_tok=n_tok)
                want = kernels.vec_dot_rows(name, w, x_q, n, isa=isa)
                got = kernels.vec_dot_rows(name, w, x_q, n, isa=isa, stored=True)
                assert got.tobytes() == want.tobytes(), f"{isa} {name} n={n} rows#{k} tokens={n_tok}"
                one = kernels.vec_dot_rows(name, w, x_q, n, isa=isa, batched=False)
                assert got.tobytes() == one.tobytes(), f"{isa} {name} n={n} rows#{k} tokens={n_tok}: not one-token's"


# The K-quants' stored layouts: both sets keep Q4_K and Q6_K matrices of a multiple of 16 rows
# sixteen rows to a tile (read by the tile form for any number of tokens), the AVX-512 set Q5_K and
# IQ4_XS too; other row counts, and the AVX2 set's Q5_K and IQ4_XS, stay as the file has them (the
# same check then holds on the file's rows).
KQ_STORED_TYPES = ["Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("name", KQ_STORED_TYPES)
def test_kernels_kquant_stored_rows_equal_the_file_layout(name, isa):
    """K-quant matrices in a set's stored layout give the one-token kernel's floats bit for bit for
    1 to 17 tokens (the stored forms under 6, the tile form from 6), for rows of one super-block to
    eight, whole tiles of rows and not."""
    for n, n_rows, n_toks in [(2048, 32, (1, 2, 3, 4, 5, 6, 8, 9, 17)), (768, 16, (1, 4, 7, 16)), (256, 48, (1, 8)),
                              (512, 19, (1, 6))]:
        rows = (random_rows(name, n_rows, n, seed=n) if name != "IQ4_XS"   # no quantizer: every index and scale
                else [random_iq_blocks(name, n_rows * n // 256, seed=n).tobytes()])
        for k, w in enumerate(rows):
            for n_tok in n_toks:
                _, x_q = activations(name, n, seed=n + n_tok, n_tok=n_tok)
                one = kernels.vec_dot_rows(name, w, x_q, n, isa=isa, batched=False)
                got = kernels.vec_dot_rows(name, w, x_q, n, isa=isa, stored=True)
                assert got.tobytes() == one.tobytes(), f"{isa} {name} n={n} rows#{k} tokens={n_tok}"
                assert kernels.vec_dot_rows(name, w, x_q, n, isa=isa).tobytes() == one.tobytes()


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_kernels_repack_rows_gives_the_stored_layout_or_says_why_not(isa):
    """repack_rows converts rows the set keeps stored (another byte order, the same size; products
    from them as from the file's rows) and refuses the rest with the reason: Q4_K's tiles need whole
    tiles of sixteen rows, Q8_0 has no stored layout, nor has the AVX2 set's Q5_K, nor any K-quant
    of the AMX set (its tiles read the file's layout)."""
    w = random_rows("Q4_K", 32, 512, seed=3)[1]
    if isa == "amx":
        with pytest.raises(InvalidArgumentError, match="set amx keeps no 32 rows of 512 Q4_K weights in a stored"):
            kernels.repack_rows("Q4_K", w, 512, isa=isa)
        return
    stored = kernels.repack_rows("Q4_K", w, 512, isa=isa)
    assert len(stored) == len(w) and stored != w
    _, x_q = activations("Q4_K", 512, seed=4, n_tok=3)
    assert (kernels.vec_dot_rows("Q4_K", stored, x_q, 512, isa=isa, repacked=True).tobytes()
            == kernels.vec_dot_rows("Q4_K", w, x_q, 512, isa=isa, batched=False).tobytes())
    with pytest.raises(InvalidArgumentError, match="keeps no .* Q8_0 weights in a stored layout"):
        kernels.repack_rows("Q8_0", random_rows("Q8_0", 4, 256, seed=5)[0], 256, isa=isa)
    with pytest.raises(InvalidArgumentError, match="keeps no 19 rows of 512 Q4_K weights"):
        kernels.repack_rows("Q4_K", random_rows("Q4_K", 19, 512, seed=6)[0], 512, isa=isa)
    with pytest.raises(InvalidArgumentError, match="keeps no 19 rows"):
        kernels.vec_dot_rows("Q4_K", random_rows("Q4_K", 19, 512, seed=6)[0], x_q, 512, isa=isa, repacked=True)
    if isa == "avx2":
        with pytest.raises(InvalidArgumentError, match="set avx2 keeps no 32 rows of 512 Q5_K"):
            kernels.repack_rows("Q5_K", random_rows("Q5_K", 32, 512, seed=7)[0], 512, isa=isa)


# IQ types with SIMD kernels (one token and several at once)
IQ_SIMD_TYPES = ["IQ4_XS", "IQ2_XXS", "IQ3_XXS", "IQ4_NL"]
# Row lengths: one block and more; for IQ4_NL's 32-element blocks, rows ending in blocks past the
# last group of eight (the kernels take eight blocks at a time, then the rest one by one).
IQ_SIZES = {"IQ4_NL": (96, 2048, 4096 + 224)}


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("name", IQ_SIMD_TYPES)
def test_kernels_iq_vec_dot_matches_reference(name, isa):
    """Random blocks (every index and sub-block scale, a finite d) against the scalar reference
    within TOL (the same integers; measured up to 1.9e-8, IQ3_XXS), batched (13 tokens: the AMX
    tiles where there are some) as one token at a time bit for bit, and the set in use as the best set."""
    for n in IQ_SIZES.get(name, (256, 2048, 4096 + 256)):
        w = random_iq_blocks(name, 8 * n // quants.TYPES[name].block_elems, seed=n).tobytes()
        _, x_q = activations(name, n, seed=n + 1, n_tok=13)   # batched: 8, 4, then 1 at a time
        want = kernels.vec_dot_rows(name, w, x_q, n, isa="scalar")
        assert want.shape == (13, 8) and np.all(np.isfinite(want)) and np.all(want != 0)
        wn, xn = norms(name, w, x_q, n)
        got = kernels.vec_dot_rows(name, w, x_q, n, isa=isa, batched=False)
        err = np.abs(got.astype(np.float64) - want) / (xn[:, None] * wn[None, :])
        assert err.max() <= TOL, f"{name} {isa} n={n}: error {err.max():.2e}"
        batched = kernels.vec_dot_rows(name, w, x_q, n, isa=isa)
        assert batched.tobytes() == got.tobytes()
        if "RAPIDMOE_ISA" not in os.environ and isa == SIMD_ISAS[-1]:
            assert kernels.vec_dot_rows(name, w, x_q, n, batched=False).tobytes() == got.tobytes()


# Types with no SIMD kernel: every set falls through to the scalar reference.
SCALAR_ONLY_TYPES = ["IQ2_XS", "IQ1_S", "IQ3_S", "IQ2_S", "IQ1_M"]


@pytest.mark.parametrize("isa", kernels.supported_isas())
@pytest.mark.parametrize("name", SCALAR_ONLY_TYPES)
def test_kernels_types_without_simd_kernels_fall_back_to_the_reference(name, isa):
    """Random blocks with a finite scale through every set, one token at a time and batched: the
    reference's floats bit for bit, and the same as rm_vec_dot (the kernel the table names)."""
    n = 2048
    w = random_iq_blocks(name, 5 * n // quants.TYPES[name].block_elems, seed=9).tobytes()
    x, x_q = activations(name, n, seed=3, n_tok=9)
    want = kernels.vec_dot_rows(name, w, x_q, n, isa="scalar")
    assert want.shape == (9, 5) and np.all(np.isfinite(want)) and np.all(want != 0)
    for batched in (False, True):
        assert kernels.vec_dot_rows(name, w, x_q, n, isa=isa, batched=batched).tobytes() == want.tobytes()
    row = quants.row_bytes(name, n)
    assert quants.vec_dot(name, w[:row], x[0]) == want[0, 0]


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_kernels_vec_dot_in_use_is_the_best_set(isa):
    """With no override the runtime's kernels are the chosen set's (bit for bit): the best by the
    CPU's flags, or the one a CPU family's rule prefers (rm.cpu_isa_reason says which)."""
    if "RAPIDMOE_ISA" in os.environ:
        pytest.skip("RAPIDMOE_ISA is set")
    best = kernels.cpu_isa()
    assert best in kernels.supported_isas()
    for name in SIMD_TYPES:
        n = 2048
        _, x_q = activations(name, n, seed=3)
        w = random_rows(name, 4, n, seed=4)[0]
        got = kernels.vec_dot_rows(name, w, x_q, n)
        assert got.tobytes() == kernels.vec_dot_rows(name, w, x_q, n, isa=best).tobytes()


def quantizer_cases(n, seed):
    r = rng(seed)
    normal = r.standard_normal(n).astype(np.float32)
    cases = {
        "normal": normal,
        "scaled": (normal * 10.0 ** r.integers(-3, 4, n // 32).repeat(32)).astype(np.float32),
        "integers": np.round(normal * 40).astype(np.float32),                    # ties after scaling
        "halves": (np.round(normal * 40) + 0.5).astype(np.float32),
        "all_equal": np.full(n, 0.37, np.float32),
        "equal_magnitude": np.where(r.random(n) < 0.5, -1.5, 1.5).astype(np.float32),  # the first wins
        "zeros_inside": np.where(r.random(n) < 0.3, 0, normal).astype(np.float32),
        "huge": (normal * 1e30).astype(np.float32),
        "tiny": (normal * 1e-30).astype(np.float32),
        "subnormal": (normal * 1e-39).astype(np.float32),
    }
    zero_blocks = normal.copy()
    zero_blocks[:32] = 0
    zero_blocks[n - 256:] = 0
    cases["zero_blocks"] = zero_blocks
    special = normal.copy()
    special[[3, 40, 200]] = [np.nan, np.inf, -np.inf]
    cases["nan_inf"] = special
    return cases


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("act", ["Q8_0", "Q8_K"])
def test_kernels_quantize_activations_is_byte_identical(act, isa):
    for n in [256, 4096]:
        for case, x in quantizer_cases(n, seed=n).items():
            with np.errstate(all="ignore"):
                want = quants.quantize(act, x)
            got = kernels.quantize_activations(act, x, isa=isa)
            assert got == want, f"{act} {isa} {case} n={n}"
            assert kernels.quantize_activations(act, x, isa="scalar") == want


def test_kernels_bad_isa_arguments_raise():
    w = quants.quantize("Q8_0", np.ones(32, np.float32))
    with pytest.raises(InvalidArgumentError, match="isa 'sse9' is not one of scalar, avx2, avx512"):
        kernels.vec_dot_rows("Q8_0", w, w, isa="sse9")
    for isa in set(kernels.ISAS) - set(kernels.supported_isas()):
        with pytest.raises(UnsupportedError, match=f"isa '{isa}' is not available"):
            kernels.vec_dot_rows("Q8_0", w, w, isa=isa)
    with pytest.raises(InvalidArgumentError, match="not a whole number of rows"):
        kernels.vec_dot_rows("Q8_0", w[:-1], w)


# The folder holding the package this process imported; children run there, so that a source tree
# in the current folder cannot shadow an installed package.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kernels.__file__)))


def package_env(**changes):
    """The environment for a child Python that imports the very package this process runs."""
    env = dict(os.environ, **changes)
    env["PYTHONPATH"] = PACKAGE_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def isa_in_subprocess(value):
    env = package_env(RAPIDMOE_ISA=value)
    code = "from rapidmoe_gguf import kernels; print(kernels.cpu_isa())"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                       cwd=PACKAGE_ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip(), p.stderr


def default_isa() -> str:
    """The set the runtime chooses with no RAPIDMOE_ISA (the best by the CPU's flags, or the one its
    family's rule prefers)."""
    if "RAPIDMOE_ISA" in os.environ:
        pytest.skip("RAPIDMOE_ISA is set")
    return kernels.cpu_isa()


@pytest.mark.parametrize("isa", kernels.ISAS)
def test_kernels_env_chooses_the_set(isa):
    got, err = isa_in_subprocess(isa)
    best = default_isa()
    if isa in kernels.supported_isas():
        assert got == isa and err == ""
    else:  # not on this CPU or build: the set it would choose anyway, with a warning
        assert got == best
        assert f"RAPIDMOE_ISA={isa}: this CPU or build does not have it; using {best}" in err


def test_kernels_env_unknown_set_warns_and_uses_the_default():
    got, err = isa_in_subprocess("avx9000")
    assert got == default_isa()
    assert "RAPIDMOE_ISA=avx9000 is not one of scalar, avx2, avx512" in err


# ---------------------------------------------------------------------------------------------
# Whole models: every kernel set gives the scalar set's logits
# ---------------------------------------------------------------------------------------------

# recipe -> the weight types it puts on the hot path
MODEL_RECIPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0-q4_0": "Q4_0 + Q4_0 residual",
                 "q4k-q8": "Q4_K + Q8_0 residual", "q3k-q8": "Q3_K", "q2k-q4": "Q2_K + Q4_0 residual",
                 "mxfp4": "MXFP4", "q5_0-q5_1": "Q5_0 + Q5_1 residual, Q4_1 for the other matrices"}
# recipes above that are a table recipe with other types: rapidmoe_gguf.convert's arguments
CONVERT_ARGS = {"q5_0-q5_1": dict(recipe="q4_0-q4_0", base_type="Q5_0", residual_type="Q5_1", other_type="Q4_1")}
_LOGITS_SCRIPT = """
import sys, numpy as np
import rapidmoe_gguf as rm
ids = [int(t) for t in sys.argv[2].split(",")]
out = {}
for path in sys.argv[3:]:
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=32) as m:
        first = m.eval_logits(ids[:40])
        rest = [m.eval([t]) for t in ids[40:]]
        out[path] = np.concatenate([first, np.stack(rest)])
    assert rm.cpu_isa() == sys.argv[1], rm.cpu_isa()
np.savez(sys.argv[1] + ".npz", *[out[p] for p in sys.argv[3:]])
"""


@pytest.fixture(scope="module")
def isa_logits(tiny_hf, tmp_path_factory):
    """Logits of a tiny Qwen3-MoE under every recipe (prefill of 40 tokens in batches of 32,
    then 8 decode steps; residuals on), computed with each kernel set in a fresh process."""
    import rapidmoe_gguf as rm

    d = tmp_path_factory.mktemp("isa-models")
    src = tiny_hf("qwen3_moe", weight_std=0.02, head_std=0.1)
    paths = []
    for recipe in MODEL_RECIPES:
        paths.append(str(d / f"{recipe}.gguf"))
        rm.convert(src, paths[-1], **CONVERT_ARGS.get(recipe, dict(recipe=recipe)), progress=False)
    ids = ",".join(str(t) for t in rng(9).integers(3, 300, 48))
    env = package_env()
    result = {}
    for isa in kernels.supported_isas():
        env["RAPIDMOE_ISA"] = isa
        p = subprocess.run([sys.executable, "-c", _LOGITS_SCRIPT, isa, ids, *paths], cwd=d, env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        with np.load(d / f"{isa}.npz") as z:
            result[isa] = dict(zip(MODEL_RECIPES, (z[f"arr_{k}"] for k in range(len(paths)))))
    for isa in ("avx2", "avx512"):   # once more without the weights repacked at load (RAPIDMOE_REPACK=0)
        if isa not in result:
            continue
        env.update(RAPIDMOE_ISA=isa, RAPIDMOE_REPACK="0")
        p = subprocess.run([sys.executable, "-c", _LOGITS_SCRIPT, isa, ids, *paths], cwd=d, env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        with np.load(d / f"{isa}.npz") as z:
            result[f"{isa}-not-repacked"] = dict(zip(MODEL_RECIPES, (z[f"arr_{k}"] for k in range(len(paths)))))
    return result


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("recipe", ["q4_0-q4_0", "q2k-q4", "mxfp4", "q4k-q8"])
def test_kernels_repacked_weights_give_the_same_logits(isa_logits, isa, recipe):
    """Q4_0, MXFP4 and Q4_K matrices repacked at load (both sets) give the file layout's logits bit
    for bit, in prefill and in decode."""
    if f"{isa}-not-repacked" not in isa_logits:
        pytest.skip(f"no {isa} kernel set on this machine")
    np.testing.assert_array_equal(isa_logits[isa][recipe], isa_logits[f"{isa}-not-repacked"][recipe])


_RSS_SCRIPT = """
import sys, rapidmoe_gguf as rm
def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:")) * 1024
before = anon()
with rm.Model(sys.argv[1], n_ctx=64, n_threads=2, use_mmap=False) as m:
    m.eval_logits([5, 6, 7])
    print(anon() - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_kernels_repacked_weights_cost_no_memory_in_a_read_file(tiny_hf, tmp_path):
    """A file read whole into memory (use_mmap=False) whose Q4_0 matrices the kernel set keeps
    repacked: the copy's pages of those matrices are handed back (mapped from the file again), so
    the process holds them once, not twice. 14 MB of Q4_0 experts in each of the base and residual
    files (both read); measured: 0.06 MB more anonymous memory repacked than not, against 28 MB."""
    if kernels.cpu_isa() not in ("avx2", "avx512"):
        pytest.skip("the stored layout is the x86 sets'")
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("the sanitizer build copies files to the heap, not into a read copy (gguf.c)")
    import rapidmoe_gguf as rm

    src = tiny_hf("qwen3_moe", hidden_size=512, moe_intermediate_size=512, num_experts=16)
    path = tmp_path / "q4_0.gguf"
    rm.convert(src, path, recipe="q4_0-q4_0", progress=False)
    grown = {}
    for repack in ("1", "0"):
        p = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(path)], cwd=tmp_path,
                           env=package_env(RAPIDMOE_REPACK=repack), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        grown[repack] = int(p.stdout.split()[-1])
    experts = 2 * 3 * 16 * 512 * 512 * 18 // 32
    assert grown["0"] > 2 * experts, grown   # the read copies hold the experts once
    assert grown["1"] - grown["0"] < experts // 4, grown


@pytest.mark.parametrize("recipe", list(MODEL_RECIPES))
def test_kernels_amx_prefill_gives_the_avx512_logits(isa_logits, recipe):
    """The AMX set changes only how prefill's products run (the Q8_0/Q4_0 and K-quant tiles), not
    their floats: the AVX-512 set's logits bit for bit, prefill and decode."""
    if "amx" not in isa_logits:
        pytest.skip("no AMX kernel set on this machine")
    np.testing.assert_array_equal(isa_logits["amx"][recipe], isa_logits["avx512"][recipe])


_PREFILL_SCRIPT = """
import sys, numpy as np
import rapidmoe_gguf as rm
ids = [int(t) for t in sys.argv[2].split(",")]
with rm.Model(sys.argv[3], n_ctx=128, n_threads=2, n_batch=64) as m:
    np.save(sys.argv[1] + ".npy", m.eval_logits(ids))
assert rm.cpu_isa() == sys.argv[1], rm.cpu_isa()
"""


@needs_amx
def test_kernels_amx_k_quant_prefill_logits(tiny_hf, tmp_path):
    """A 64-token prefill of a Q4_K model in one batch, where the experts' products take the
    K-quant tiles: the AVX-512 set's logits bit for bit, and within
    test_kernels_model_logits_match_scalar_set's budget of the scalar set's (measured: median
    9.5e-8, worst 1.4e-3, one position whose Q8 activations round the other way)."""
    import rapidmoe_gguf as rm

    path = str(tmp_path / "q4k-q8.gguf")
    rm.convert(tiny_hf("qwen3_moe", weight_std=0.02, head_std=0.1), path, recipe="q4k-q8", progress=False)
    ids = ",".join(str(t) for t in rng(9).integers(3, 300, 64))
    logits = {}
    for isa in ("scalar", "avx512", "amx"):
        p = subprocess.run([sys.executable, "-c", _PREFILL_SCRIPT, isa, ids, path], cwd=tmp_path,
                           env=package_env(RAPIDMOE_ISA=isa), capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        logits[isa] = np.load(tmp_path / f"{isa}.npy")
    ref, got = logits["scalar"], logits["amx"]
    assert got.shape == (64, ref.shape[1]) and np.all(np.isfinite(got))
    np.testing.assert_array_equal(got, logits["avx512"])
    rel = np.abs(got - ref).max(-1) / np.abs(ref).max(-1)
    assert np.median(rel) <= 1e-5 and rel.max() <= 1e-2, f"median {np.median(rel):.2e}, worst {rel.max():.2e}"


@needs_simd
@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("recipe", list(MODEL_RECIPES))
def test_kernels_model_logits_match_scalar_set(isa_logits, recipe, isa):
    """Error budget, relative to each position's largest logit: 1e-5 at the median position and
    1e-2 at the worst. The kernels agree to float rounding (measured: medians 1e-7 to 3e-7), but a
    Q8 activation that lands on a rounding boundary can round the other way and move a position
    by much more (measured worst: 3.1e-4, q4k-q8)."""
    ref, got = isa_logits["scalar"][recipe], isa_logits[isa][recipe]
    rel = np.abs(got - ref).max(-1) / np.abs(ref).max(-1)
    assert np.median(rel) <= 1e-5 and rel.max() <= 1e-2, \
        f"{recipe} {isa}: median {np.median(rel):.2e}, worst {rel.max():.2e} at position {rel.argmax()}"
