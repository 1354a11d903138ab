"""The forward pass against transformers, on tiny random models of every architecture.

Oracle: the checkpoint's own transformers model. Recipe f32: logits match within 1e-4 relative
(to each position's largest logit) over a 48-token prompt (batched prefill) and 16 decode steps
through the KV cache. Recipe q8_0: mean KL divergence <= 1e-3 against the original model and
against transformers running the same Q8_0-rounded weights. Top-1 agreement is checked on the
bundled trained model (test_bundled.py): on random weights the top-1 margins are so thin that Q8_0
rounding alone flips 1-5% of the argmaxes in transformers itself.
"""

from __future__ import annotations

import numpy as np
import pytest

import rapidmoe_gguf as rm
from conftest import TINY_ARCHS, VOCAB, random_iq_weights, write_gguf_like

N_PROMPT, N_DECODE = 48, 16
_SOURCES = {}  # converted file -> its checkpoint


def tiny_hf_dir(path):
    return _SOURCES[path]


def _reference_logits(hf_dir, ids, round_to=None):
    """transformers' logits; with round_to, every matrix the converter quantizes is first rounded
    through that type (the router and the 1-D shared-expert gate stay float, as in our files)."""
    import torch
    import transformers

    from rapidmoe_gguf import quants

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        if round_to:
            for name, p in model.named_parameters():
                if p.ndim < 2 or name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight",
                                                "shared_expert_gate.weight")):
                    continue
                rows = np.ascontiguousarray(p.numpy().reshape(-1, p.shape[-1]))
                back = quants.dequantize(round_to, quants.quantize(round_to, rows), rows.shape)
                p.copy_(torch.from_numpy(back.reshape(p.shape)))
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def converted(tiny_hf, tmp_path_factory):
    cache = {}

    def get(arch, recipe):
        if (arch, recipe) not in cache:
            # transformers' own init scale; a wider head for logits with some margin
            src = tiny_hf(arch, weight_std=0.02, head_std=0.1)
            out = tmp_path_factory.mktemp(f"fw-{arch}-{recipe}") / "model.gguf"
            rm.convert(src, out, recipe=recipe, progress=False)
            ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
            cache[(arch, recipe)] = (out, ids, _reference_logits(src, ids))
            _SOURCES[out] = src
        return cache[(arch, recipe)]

    return get


def _ours_prefill_then_decode(path, ids):
    """Logits of every position: the prompt as one batch, then one token at a time."""
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=64) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = [m.eval([t]) for t in ids[N_PROMPT:]]
        assert m.n_past == len(ids)
    return np.concatenate([first, np.stack(rest)])


def _kl(ref, ours):
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lq = ours - ours.max(-1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
    lp = np.log(p)
    return (p * (lp - lq)).sum(-1)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_forward_f32_matches_transformers(converted, arch):
    path, ids, ref = converted(arch, "f32")
    ours = _ours_prefill_then_decode(path, ids)
    rel = np.abs(ours - ref).max(-1) / np.abs(ref).max(-1)
    assert rel.max() <= 1e-4, f"{arch}: worst position {rel.argmax()} rel err {rel.max():.2e}"


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_forward_q8_0_close_to_transformers(converted, arch):
    path, ids, ref = converted(arch, "q8_0")
    ours = _ours_prefill_then_decode(path, ids)
    kl = _kl(ref, ours)
    assert kl.mean() <= 1e-3, f"{arch}: mean KL {kl.mean():.2e} against the original model"
    # The engine's own share of that: against transformers running the very same rounded
    # weights, what is left is the Q8_0 rounding of the activations (as ggml does it).
    same = _reference_logits(tiny_hf_dir(path), ids, round_to="Q8_0")
    assert _kl(same, ours).mean() <= 1e-3, f"{arch}: mean KL against the same Q8_0 weights"


def test_forward_batch_sizes_agree(converted):
    """Prefill in batches of 1, 5 and 64 gives the same logits (decode is prefill with n = 1)."""
    path, ids, _ = converted("qwen3_moe", "f32")
    outs = []
    for n_batch in (1, 5, 64):
        with rm.Model(path, n_ctx=128, n_threads=2, n_batch=n_batch) as m:
            outs.append(m.eval_logits(ids[:N_PROMPT]))
    np.testing.assert_allclose(outs[0], outs[2], rtol=0, atol=1e-5)
    np.testing.assert_allclose(outs[1], outs[2], rtol=0, atol=1e-5)


def test_forward_context_overflow_is_refused_and_cache_kept(converted):
    path, ids, _ = converted("qwen3_moe", "f32")
    with rm.Model(path, n_ctx=32, n_threads=1) as m:
        m.eval(ids[:30])
        with pytest.raises(rm.ContextFullError, match="exceed the context of 32"):
            m.eval(ids[:5])
        assert m.n_past == 30
        m.eval(ids[30:32])  # still usable
        assert m.n_past == 32


def test_forward_bad_tokens_and_empty_input(converted):
    path, _, _ = converted("qwen3_moe", "f32")
    with rm.Model(path, n_ctx=32, n_threads=1) as m:
        with pytest.raises(rm.InvalidArgumentError, match="outside the vocabulary"):
            m.eval([1, VOCAB + 5])
        with pytest.raises(rm.InvalidArgumentError, match="at least one token"):
            m.eval([])
        with pytest.raises(rm.InvalidArgumentError, match="empty"):
            list(m.generate_tokens([], 4, rm.SamplingParams()))
        m.eval([1, 2, 3])  # the session keeps working


def test_forward_unsupported_architecture_is_refused(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(rm.UnsupportedError, match="architecture 'mamba' is not supported"):
        rm.Model(tmp_path / "x.gguf", residual=None)


def test_forward_same_seed_same_text_and_completion_shapes(converted):
    path, _, _ = converted("qwen3_moe", "f32")
    with rm.Model(path, n_ctx=128, n_threads=2) as m:
        a = m.generate("hello world", max_tokens=12, temperature=1.0, seed=5)
        b = m.generate("hello world", max_tokens=12, temperature=1.0, seed=5)
        assert a == b and len(a) > 0
        out = m.create_completion("hello world", max_tokens=8, temperature=1.0, seed=5)
        assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] in ("stop", "length")
        assert out["usage"]["completion_tokens"] <= 8
        chunks = list(m.create_completion("hello world", max_tokens=8, temperature=1.0, seed=5, stream=True))
        assert "".join(c["choices"][0]["text"] for c in chunks) == out["choices"][0]["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]


# Experts in an IQ type against the same model with those experts as float32 holding the very
# same (dequantized) weights. What differs is only the Q8_0/Q8_K rounding of the experts' input
# activations (the float model dots float activations). Every token uses all 4 experts: with
# top-2 on random weights the router's margins are so thin that this rounding flips a choice now
# and then (one position in 64 off by 18% with IQ2_XXS), which would measure the router, not the
# kernels. Measured: worst position's logits within 0.4% (IQ4_NL) to 1.1% (IQ2_XS) of its largest
# logit, mean KL up to 3e-5; budgets 3e-2 and 3e-4.
@pytest.mark.parametrize("iq_type", ["IQ4_XS", "IQ4_NL", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"])
def test_forward_iq_experts_match_their_dequantized_weights(converted, tmp_path, iq_type):
    import gguf

    path, ids, _ = converted("qwen3_moe", "f32")
    reader = gguf.GGUFReader(str(path))
    all_experts = {"qwen3moe.expert_used_count": int(reader.fields["qwen3moe.expert_count"].contents())}
    iq, f32 = {}, {}
    for k, t in enumerate(reader.tensors):
        if "_exps." in t.name:
            data, back = random_iq_weights(iq_type, tuple(int(v) for v in t.data.shape), seed=k)
            iq[t.name] = (data, gguf.GGMLQuantizationType[iq_type])
            f32[t.name] = (back, None)
    assert len(iq) == 3 * 2  # gate, up and down experts of both layers
    write_gguf_like(path, tmp_path / "iq.gguf", iq, all_experts)
    write_gguf_like(path, tmp_path / "f32.gguf", f32, all_experts)
    ours = _ours_prefill_then_decode(tmp_path / "iq.gguf", ids)
    ref = _ours_prefill_then_decode(tmp_path / "f32.gguf", ids)
    assert np.all(np.isfinite(ours))
    kl = _kl(ref, ours)
    rel = np.abs(ours - ref).max(-1) / np.abs(ref).max(-1)
    assert kl.mean() <= 3e-4, f"{iq_type}: mean KL {kl.mean():.2e}"
    assert rel.max() <= 3e-2, f"{iq_type}: worst position {rel.argmax()} rel err {rel.max():.2e}"


@pytest.mark.parametrize("recipe", ["q4_0-q4_0", "q4k-q8"])
def test_forward_read_and_mapped_files_give_the_same_logits(converted, recipe, monkeypatch):
    """use_mmap=False reads the files into (huge-page) memory, use_mmap=True maps them: the same
    bytes, so the same logits bit for bit. Q4_0 rows are repacked at load and the source pages
    released, which must hold in read memory as in a mapping; q4k-q8 loads a residual sidecar."""
    path, ids, _ = converted("qwen3_moe", recipe)
    logits = []
    for use_mmap in (True, False):
        with rm.Model(path, n_ctx=128, n_threads=2, n_batch=64, use_mmap=use_mmap) as m:
            logits.append(np.concatenate([m.eval_logits(ids[:24]), np.stack([m.eval([t]) for t in ids[24:32]])]))
    assert np.isfinite(logits[0]).all()
    assert logits[0].tobytes() == logits[1].tobytes()
    monkeypatch.setenv("RAPIDMOE_MMAP", "yes")
    with pytest.raises(rm.InvalidArgumentError, match="RAPIDMOE_MMAP"):
        rm.Model(path, n_ctx=128)


def test_forward_truncated_file_read_whole_is_refused(converted, tmp_path):
    """A file cut short is refused with the reader's error when it is read into memory, as when
    it is mapped; nothing is left loaded."""
    path, _, _ = converted("qwen3_moe", "q4_0-q4_0")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) * 2 // 3])
    for use_mmap in (True, False):
        with pytest.raises(rm.RapidMoEError, match="cut.gguf"):
            rm.Model(cut, n_ctx=128, use_mmap=use_mmap)


def test_forward_tied_q4_0_embeddings_read_whole_are_kept(tiny_hf, tmp_path):
    """A Q4_0 output matrix tied to the token embeddings is repacked at load on AVX-512; in a file
    read into memory (unlike a mapping) its released pages would read back as zeros, so the
    embeddings must stay: the logits of the read file are those of the mapped one."""
    src = tiny_hf("qwen3_moe", weight_std=0.02, head_std=0.1, tie_word_embeddings=True)
    out = tmp_path / "tied.gguf"
    rm.convert(src, out, recipe="q4_0-q4_0", other_type="Q4_0", progress=False)
    ids = list(range(3, 19))
    logits = []
    for use_mmap in (True, False):
        with rm.Model(out, n_ctx=64, n_threads=2, use_mmap=use_mmap) as m:
            logits.append(m.eval_logits(ids))
    assert np.isfinite(logits[0]).all() and np.abs(logits[0]).max() > 0
    assert logits[0].tobytes() == logits[1].tobytes()
