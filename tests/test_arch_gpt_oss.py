"""gpt-oss: a tiny random GptOssForCausalLM against transformers, and what its math adds.

The checkpoint (``make_tiny_gpt_oss``) has gpt-oss's layer pattern (layer 0 slides, layer 1 sees
everything) with a window of 8 positions, shorter than the 48-token prompt; attention sinks of
order one, so they take a real share of each softmax; q/k/v/o, router and expert biases; YaRN with
factor 32 over an original context of 64 and transformers' ``truncate`` false (the released
configs' value). Oracle: transformers at f32, logits within 1e-4 relative (max |diff| over the
position's max |logit|) over a batched prompt and 16 decode steps. Measured: 1.1e-6.

Each of the window, the sinks and YaRN's truncate is shown to matter: a file that changes one of
them moves the logits by more than 1e-3 relative, so the 1e-4 agreement does not come from a
feature that does nothing on this model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import rapidmoe_gguf as rm
from conftest import VOCAB, make_tiny_tokenizer, write_gguf_like

N_PROMPT, N_DECODE = 48, 16
WINDOW = 8


def make_tiny_gpt_oss(out_dir, *, truncate: bool = False, seed: int = 0, dtype: str = "float32",
                      **overrides) -> Path:
    """A tiny random gpt-oss checkpoint (config as in the module docstring). Expert FFN 512 and
    hidden 256 differ, so a transposed expert matrix cannot pass for the right one."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = transformers.GptOssConfig(**dict(dict(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=512, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": truncate, "original_max_position_embeddings": 64}),
        **overrides))
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("sinks"):
                p.copy_(noise)
            elif name.startswith("lm_head"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.02 * noise)
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    make_tiny_tokenizer(out)
    return out


def reference_logits(hf_dir, ids):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def ours(path, ids, n_batch=64):
    """The prompt in batches of n_batch, then one token at a time."""
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=n_batch) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = [m.eval([t]) for t in ids[N_PROMPT:]]
    return np.concatenate([first, np.stack(rest)])


def rel_err(a, ref):
    return float((np.abs(a - ref).max(-1) / np.abs(ref).max(-1)).max())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    src = make_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss-hf"))
    out = tmp_path_factory.mktemp("gpt-oss") / "m.gguf"
    rm.convert(src, out, recipe="f32", progress=False)
    ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    return src, out, ids, reference_logits(src, ids)


def test_arch_gpt_oss_f32_matches_transformers(tiny):
    _, path, ids, ref = tiny
    err = rel_err(ours(path, ids), ref)
    assert err <= 1e-4, f"rel err {err:.2e}"


def test_arch_gpt_oss_batches_cross_the_window(tiny):
    """Prefill batches of 1, 5 (not a divisor of the window) and 64 give the same logits."""
    _, path, ids, _ = tiny
    outs = [ours(path, ids, n_batch) for n_batch in (1, 5, 64)]
    np.testing.assert_allclose(outs[0], outs[2], rtol=0, atol=1e-5)
    np.testing.assert_allclose(outs[1], outs[2], rtol=0, atol=1e-5)


def test_arch_gpt_oss_keys_and_tensors(tiny):
    import gguf

    _, path, _, _ = tiny
    r = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert kv["general.architecture"] == "gpt-oss"
    assert kv["gpt-oss.attention.sliding_window"] == WINDOW
    assert kv["gpt-oss.rope.scaling.type"] == "yarn" and kv["gpt-oss.rope.scaling.factor"] == 32.0
    assert kv["gpt-oss.rope.scaling.original_context_length"] == 64
    assert kv["rapidmoe.rope.yarn_truncate"] is False
    t = {x.name: x for x in r.tensors}
    assert t["blk.0.attn_sinks.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert tuple(t["blk.0.ffn_gate_exps.bias"].shape) == (512, 4)   # ne: {n_ff_exp, n_expert}
    assert tuple(t["blk.0.ffn_down_exps.weight"].shape) == (512, 256, 4)
    assert t["blk.1.ffn_up_exps.bias"].tensor_type == gguf.GGMLQuantizationType.F32


@pytest.mark.parametrize("change", ["window", "sinks", "truncate"])
def test_arch_gpt_oss_each_feature_matters(tiny, tmp_path, change):
    import gguf

    _, path, ids, ref = tiny
    tensors, kv = {}, {}
    if change == "window":
        kv["gpt-oss.attention.sliding_window"] = 4096
    elif change == "sinks":
        r = gguf.GGUFReader(str(path))
        for x in r.tensors:
            if x.name.endswith("attn_sinks.weight"):
                tensors[x.name] = (np.full(x.data.shape, -1e4, np.float32), None)   # exp(-1e4) = 0: no sink
    else:
        kv["rapidmoe.rope.yarn_truncate"] = True
    write_gguf_like(path, tmp_path / "x.gguf", tensors, kv)
    assert rel_err(ours(tmp_path / "x.gguf", ids), ref) > 1e-3


def test_arch_gpt_oss_truncate_true_matches_transformers(tmp_path):
    """truncate true (llama.cpp's only reading) is followed too, through the same key."""
    src = make_tiny_gpt_oss(tmp_path / "hf", truncate=True, seed=1)
    out = tmp_path / "m.gguf"
    rm.convert(src, out, recipe="f32", progress=False)
    ids = np.random.default_rng(8).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    err = rel_err(ours(out, ids), reference_logits(src, ids))
    assert err <= 1e-4, f"rel err {err:.2e}"


def test_arch_gpt_oss_bf16_checkpoint_converts(tmp_path):
    """The bf16 form: weights read as bf16, logits against transformers on the same bf16 weights."""
    src = make_tiny_gpt_oss(tmp_path / "hf", dtype="bfloat16", seed=2)
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["dtype"] == "bfloat16"
    out = tmp_path / "m.gguf"
    rm.convert(src, out, recipe="f32", progress=False)
    ids = np.random.default_rng(9).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    err = rel_err(ours(out, ids), reference_logits(src, ids))
    assert err <= 1e-4, f"rel err {err:.2e}"


def _kl(ref, ours):
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lq = ours - ours.max(-1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
    return (p * (np.log(p) - lq)).sum(-1)


def test_arch_gpt_oss_split_recipe_runs(tmp_path):
    """A Q4_K base + Q8_0 residual pair against transformers. Every token uses all 4 experts: with
    top-2 on random weights, Q8_0 rounding alone flips router choices (mean KL 0.027 even for the
    q8_0 recipe), which would measure the router, not the pair. Measured mean KL: base only 9.2e-3,
    base + every residual 3.6e-4 (q8_0 alone: 3.5e-4)."""
    src = make_tiny_gpt_oss(tmp_path / "hf", num_experts_per_tok=4)
    ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT).tolist()
    ref = reference_logits(src, ids)
    out = tmp_path / "m.gguf"
    rm.convert(src, out, recipe="q4k-q8", progress=False)
    kl = {}
    for policy in ("none", "all"):
        with rm.Model(out, n_ctx=128, n_threads=2, residual_policy=policy) as m:
            kl[policy] = float(_kl(ref, m.eval_logits(ids)).mean())
    assert kl["all"] <= 1e-3 and kl["none"] > 5 * kl["all"], kl


def test_arch_gpt_oss_refuses_a_device(tiny):
    _, path, _, _ = tiny
    with pytest.raises(rm.NeedsCPUError, match="layer 0 of this gpt-oss model has biased experts with the "
                       "clamped SwiGLU, which only the CPU backend runs"):
        rm.Model(path, n_ctx=64, n_threads=1, gpu_memory="1GB", gpu_backend="standin")


def test_arch_gpt_oss_bad_layer_pattern_is_refused(tmp_path):
    src = make_tiny_gpt_oss(tmp_path / "hf", seed=3)
    cfg = json.loads((src / "config.json").read_text())
    cfg["layer_types"] = ["full_attention", "sliding_attention"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(rm.UnsupportedError, match="is not gpt-oss's alternation"):
        rm.convert(src, tmp_path / "m.gguf", recipe="f32", progress=False)
    assert not os.path.exists(tmp_path / "m.gguf")
