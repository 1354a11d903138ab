"""KV cache types (Model's cache_type_k / cache_type_v, llama.cpp's names): each cache type's
logits against the F32 cache's (KL), prefill equal to decode bit for bit in every type, sliding
windows and hybrids included, the bytes the session allocates, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import planner
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.errors import InvalidArgumentError, NeedsCPUError
from rapidmoe_gguf.gguf_file import open_gguf
from rapidmoe_gguf.model import CACHE_TYPES

TEXT = "The history of the English language begins with the arrival of three tribes. " * 6
# KL(F32 cache || this type), mean over the positions of TEXT on the bundled model, at most: a
# little above what was measured (f16 5.2e-5, q8_0 8.2e-5, q4_0 2.3e-3, iq4_nl 1.9e-3) so that a
# change of arithmetic shows, not a change of last bits
KL_MEAN = {"f16": 2e-4, "bf16": 1e-3, "q8_0": 3e-4, "q5_0": 4e-3, "q5_1": 4e-3, "q4_0": 8e-3, "q4_1": 8e-3,
           "iq4_nl": 6e-3}


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def f32_logits():
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=2) as m:
        ids = m.tokenize(TEXT)
        return ids, m.eval_logits(ids)


@pytest.mark.parametrize("cache", [t for t in CACHE_TYPES if t != "f32"])
def test_kv_cache_type_logits_near_f32_and_prefill_equals_decode(f32_logits, cache):
    ids, ref = f32_logits
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=2, n_batch=64, cache_type_k=cache,
                  cache_type_v=cache) as m:
        got = m.eval_logits(ids)                 # two steps of 64 and one of the rest
        m.reset()
        one = np.stack([m.eval([t]) for t in ids])
    assert np.array_equal(got, one), f"{cache}: prefill and decode differ"
    p = _log_softmax(ref.astype(np.float64))
    kl = (np.exp(p) * (p - _log_softmax(got.astype(np.float64)))).sum(-1)
    assert 0 < kl.mean() <= KL_MEAN[cache], f"{cache}: KL {kl.mean():.2e}"
    assert (ref.argmax(-1) == got.argmax(-1)).mean() >= 0.9


def test_kv_cache_mixed_types_and_forks(f32_logits):
    """K and V of different types; a fork takes its parent's types and gives its logits."""
    ids, _ = f32_logits
    with rm.Model(bundled_model_path(), n_ctx=512, n_threads=2, cache_type_k="q8_0", cache_type_v="F16") as m:
        assert (m.cache_type_k, m.cache_type_v) == ("q8_0", "f16")
        want = m.eval(ids)
        fork = m.fork_session()
        assert (fork.cache_type_k, fork.cache_type_v) == ("q8_0", "f16")
        assert np.array_equal(fork.eval(ids), want)


def test_kv_cache_bytes():
    """What the session allocates for the cache, per type: F16 half of F32, Q8_0 34/128, Q4_0 18/128."""
    with open_gguf(bundled_model_path()) as g:
        sizes = planner.ModelSizes.from_gguf(g, None)
    f32 = planner.kv_cache_bytes(sizes, 4096)
    assert f32 > 0
    assert planner.kv_cache_bytes(sizes, 4096, "f16", "f16") * 2 == f32
    assert planner.kv_cache_bytes(sizes, 4096, "q8_0", "q8_0") * 128 == f32 * 34
    assert planner.kv_cache_bytes(sizes, 4096, "q4_0", "f32") * 256 == f32 * (128 + 18)
    with rm.Model(bundled_model_path(), n_ctx=4096, n_threads=2, cache_type_k="f16", cache_type_v="f16") as m:
        assert m.kv_cache_bytes * 2 == f32


def test_kv_cache_refusals(tmp_path):
    with pytest.raises(InvalidArgumentError, match="cache_type_k must be one of"):
        rm.Model(bundled_model_path(), n_ctx=64, cache_type_k="q3_k")
    with pytest.raises(InvalidArgumentError, match="cache_type_v"):
        rm.Model(bundled_model_path(), n_ctx=64, cache_type_v=8)
    with pytest.raises(NeedsCPUError, match="CPU backend only"):
        rm.Model(bundled_model_path(), n_ctx=64, gpu_memory="1GiB", gpu_backend="standin", cache_type_k="f16")


def f32_cache_bytes(path) -> int:
    with rm.Model(str(path), n_ctx=256, n_threads=2, cache_type_k="f32", cache_type_v="f32") as m:
        return m.kv_cache_bytes


@pytest.mark.parametrize("kind", ["gpt_oss", "qwen3_5_moe", "deepseek_v2"])
def test_kv_cache_types_on_other_layer_kinds(tmp_path, tiny_hf, kind):
    """Sliding-window rings (gpt-oss), a hybrid's attention layers (Qwen3.5) and multi-head latent
    attention's latent cache (DeepSeek) take the types, near F32's. Prefill equals decode where
    one attention form runs both (MLA's prefill runs the expanded form and its decode the absorbed
    one, whose float sums differ in order, with an F32 cache as with any other)."""
    from test_determinism import _hf

    out = tmp_path / "m.gguf"
    if kind == "deepseek_v2":   # latents of 56 + 8 (a whole number of Q8_0 blocks, as DeepSeek's 512 + 64)
        from test_arch_deepseek import make_checkpoint

        make_checkpoint(tmp_path / "hf", kind, kv_lora_rank=56)
        rm.convert(tmp_path / "hf", out, recipe="f32", progress=False)
    else:
        rm.convert(_hf(tmp_path, tiny_hf, kind), out, recipe="f32", progress=False)
    ids = list(np.random.default_rng(3).integers(3, 200, 150))
    with rm.Model(str(out), n_ctx=256, n_threads=2, n_batch=32) as m:
        ref = m.eval_logits(ids)
    with rm.Model(str(out), n_ctx=256, n_threads=2, n_batch=32, cache_type_k="q8_0", cache_type_v="f16") as m:
        got = m.eval_logits(ids)
        m.reset()
        one = np.stack([m.eval([t]) for t in ids])
        q8_bytes = m.kv_cache_bytes
    if kind == "deepseek_v2":
        assert q8_bytes == pytest.approx(f32_cache_bytes(out) * 34 / 128)   # Q8_0 latents: 34 bytes a block of 32
        with rm.Model(str(out), n_ctx=256, n_threads=2, n_batch=32) as m:
            m.reset()
            one_f32 = np.stack([m.eval([t]) for t in ids])
        rel_one = np.abs(one - one_f32).max(-1) / np.abs(one_f32).max(-1)
        assert 0 < np.median(rel_one) < 0.01 and (rel_one > 0.01).mean() <= 0.02
    else:
        assert np.array_equal(got, one)
    # near F32's: a perturbation may flip a near tie of the router's top-k at a position (it did
    # at one of 150 on the hybrid with Q8_0 or BF16, not with F16), so most positions, not all
    rel = np.abs(got - ref).max(-1) / np.abs(ref).max(-1)
    assert 0 < np.median(rel) < 0.01 and (rel > 0.01).mean() <= 0.02


def test_kv_cache_default_is_f16_where_the_model_can_have_it(tmp_path, tiny_hf, monkeypatch):
    """Without a type asked for (and without $RAPIDMOE_CACHE_TYPE_K / _V, which the suite sets):
    F16 on the CPU, as llama.cpp's default, the same session as an explicit f16 (multi-head latent
    attention's latents too); F32 on a device backend; the environment's types where set, an
    invalid one refused naming the variable."""
    from test_determinism import _hf

    monkeypatch.delenv("RAPIDMOE_CACHE_TYPE_K", raising=False)
    monkeypatch.delenv("RAPIDMOE_CACHE_TYPE_V", raising=False)
    ids = list(range(5, 60))
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m, \
            rm.Model(bundled_model_path(), n_ctx=256, n_threads=2, cache_type_k="f16", cache_type_v="f16") as f16:
        assert (m.cache_type_k, m.cache_type_v) == ("f16", "f16")
        assert m.kv_cache_bytes == f16.kv_cache_bytes
        np.testing.assert_array_equal(m.eval_logits(ids), f16.eval_logits(ids))
        with m.fork_session() as fork:
            assert (fork.cache_type_k, fork.cache_type_v) == ("f16", "f16")
    with rm.Model(bundled_model_path(), n_ctx=64, gpu_memory="1GiB", gpu_backend="standin") as dev:
        assert dev.backend == "standin" and (dev.cache_type_k, dev.cache_type_v) == ("f32", "f32")
    out = tmp_path / "mla.gguf"
    rm.convert(_hf(tmp_path, tiny_hf, "deepseek_v2"), out, recipe="f32", progress=False)
    with rm.Model(str(out), n_ctx=64, n_threads=2) as mla:
        assert (mla.cache_type_k, mla.cache_type_v) == ("f16", "f16")
    monkeypatch.setenv("RAPIDMOE_CACHE_TYPE_K", "q8_0")
    with rm.Model(bundled_model_path(), n_ctx=64, n_threads=2) as m:
        assert (m.cache_type_k, m.cache_type_v) == ("q8_0", "f16")
    monkeypatch.setenv("RAPIDMOE_CACHE_TYPE_V", "q3_k")
    with pytest.raises(InvalidArgumentError, match=r"\$RAPIDMOE_CACHE_TYPE_V must be one of"):
        rm.Model(bundled_model_path(), n_ctx=64)


def test_kv_cache_mla_latents_in_f16_survive_a_state_file(tmp_path):
    """A state saved from a session whose latent cache is F16 loads into a fresh one and continues
    bit for bit; the prompt's positions are reusable from it."""
    from conftest import state_round_trip
    from test_arch_deepseek import make_checkpoint

    make_checkpoint(tmp_path / "hf", "deepseek_v2")
    out = tmp_path / "m.gguf"
    rm.convert(tmp_path / "hf", out, recipe="f32", progress=False)
    prompt, rest = list(range(5, 40)), list(range(40, 52))
    want, got, reusable = state_round_trip(out, prompt, rest, tmp_path / "s.bin", cache_type_k="f16",
                                           cache_type_v="f16")
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(want, got)
    assert reusable == len(prompt)   # the loaded cache holds the prompt, all of which the longer prompt repeats


@pytest.mark.parametrize("cache", ["f32", "f16", "q8_0"])
def test_kv_cache_decode_split_by_segments_equals_prefill(cache):
    """Past two segments of 512 positions one token's attention is split between the threads by
    segments (ops.c) and each segment's softmax merged at the end, where a prefill merges the same
    segments inside its jobs: the same floats, in every cache type."""
    with rm.Model(bundled_model_path(), n_ctx=1400, n_threads=2, n_batch=512, cache_type_k=cache,
                  cache_type_v=cache) as m:
        ids = (m.tokenize(TEXT) * 20)[:1300]
        whole = m.eval_logits(ids)[-6:]          # steps of 512, 512 and 276 tokens
        m.reset()
        m.eval(ids[:-6])
        one = np.stack([m.eval([t]) for t in ids[-6:]])
    assert np.array_equal(whole, one), f"{cache}: prefill and decode differ past two segments"


@pytest.mark.parametrize("cache", ["f32", "q8_0"])
def test_kv_cache_mla_decode_split_by_segments(tmp_path, cache):
    """Multi-head latent attention's decode (the absorbed form: plain attention with one kv head
    over the latent rows, values their first kv_lora_rank floats) past two segments of 512
    positions, split between the threads by segments: the expanded prefill's logits within float
    rounding (their sums differ in order), and a batch of two sequences decoding gives each the
    floats it gets alone."""
    from test_arch_deepseek import make_checkpoint

    make_checkpoint(tmp_path / "hf", "deepseek_v2", kv_lora_rank=56, max_position_embeddings=2048)
    out = tmp_path / "m.gguf"
    rm.convert(tmp_path / "hf", out, recipe="f32", progress=False)
    ids = np.random.default_rng(8).integers(3, 200, 1300).tolist()
    with rm.Model(str(out), n_ctx=1400, n_threads=2, n_batch=512, cache_type_k=cache, cache_type_v=cache) as m:
        whole = m.eval_logits(ids)[-6:]          # expanded, steps of 512, 512 and 276 tokens
        m.reset()
        m.eval(ids[:-6])
        f = m.fork_session()
        f.eval(ids[:-9])
        one = np.stack([m.eval([t]) for t in ids[-6:]])
        alone = np.stack([f.eval([t]) for t in ids[-9:-6]])
        m.truncate(len(ids) - 6)
        f.truncate(len(ids) - 9)
        both = [rm.eval_batch([(m, [a]), (f, [b])]) for a, b in zip(ids[-6:-3], ids[-9:-6])]
    rel = np.abs(one - whole).max(-1) / np.abs(whole).max(-1)
    assert rel.max() <= 1e-5, f"{cache}: absorbed decode against expanded prefill, rel {rel.max():.2e}"
    assert np.array_equal(np.stack([x[0] for x in both]), one[:3])
    assert np.array_equal(np.stack([x[1] for x in both]), alone)
