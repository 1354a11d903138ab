"""MiniMax-M2 (minimax-m2): q/k RMSNorm over the whole projection, partial NEOX RoPE (rotary_dim),
sigmoid routing with a selection bias and renormalised weights, no shared expert.

Tiny random checkpoints of transformers' MiniMaxM2ForCausalLM (saved in the released layout:
block_sparse_moe.experts.N.w1/w2/w3), made at test time: 2 layers, 8 experts, top-2, a routing
bias large enough to change the choice, RoPE on half of each head.

Oracles and budgets:
- transformers (f32): our logits within 1e-4 relative (max |diff| / max |logit| per position) over a
  40-token prefill and 8 decode steps, from our converter's file and from llama.cpp's converter's.
- llama.cpp (F32 cache) on the same file, when the config says scoring_func "sigmoid" (its converter
  then writes expert_gating_func): within 1e-4. Without it llama.cpp's converter writes no gating
  key and llama.cpp 0.3.36 stops on such a file (an abort in its MoE graph); we follow
  transformers, which routes by sigmoid.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import rapidmoe_gguf as rm
import llamacpp_oracle as llamacpp
from conftest import VOCAB, make_tiny_tokenizer
from conftest import logit_rel as _rel

N_PROMPT, N_DECODE = 40, 8


def make_tiny_minimax(out_dir, seed: int = 0, **overrides):
    import torch
    import transformers

    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, rotary_dim=8, num_local_experts=8, num_experts_per_tok=2,
               max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
               eos_token_id=2, pad_token_id=0)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = transformers.MiniMaxM2ForCausalLM(transformers.MiniMaxM2Config(**cfg)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if p.ndim == 1 else (0.1 if name.startswith("lm_head") else 0.05) * noise)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))   # moves the sigmoid scores' order
    model.save_pretrained(out_dir)
    make_tiny_tokenizer(out_dir)
    return model


@pytest.fixture(scope="module")
def minimax(tmp_path_factory):
    import torch

    d = tmp_path_factory.mktemp("minimax-m2")
    model = make_tiny_minimax(d / "hf")
    out = d / "model.gguf"
    rm.convert(d / "hf", out, recipe="f32", progress=False)
    ids = np.random.default_rng(5).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    return d / "hf", out, ids, ref


def _run(path, ids, **kw):
    with rm.Model(path, n_ctx=96, n_threads=2, **kw) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    return np.concatenate([first, rest])


def test_minimax_m2_logits_match_transformers(minimax):
    hf, path, ids, ref = minimax
    with rm.open_gguf(path) as g:
        md = g.metadata
    assert md["minimax-m2.rope.dimension_count"] == 8 and md["minimax-m2.expert_gating_func"] == 2
    got = _run(path, ids, n_batch=16)
    assert _rel(got[:N_PROMPT], ref[:N_PROMPT]) < 1e-4
    assert _rel(got[N_PROMPT:], ref[N_PROMPT:]) < 1e-4


def test_minimax_m2_routing_bias_matters(minimax):
    """The selection bias changes which experts the sigmoid scores pick (else a wrong bias would pass)."""
    import torch
    from safetensors.torch import load_file

    hf, _, _, _ = minimax
    w = load_file(str(hf / "model.safetensors"))
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    s = torch.sigmoid(x @ w["model.layers.0.block_sparse_moe.gate.weight"].T)
    plain = s.topk(2).indices.sort().values
    biased = (s + w["model.layers.0.block_sparse_moe.e_score_correction_bias"]).topk(2).indices.sort().values
    assert (plain != biased).any(-1).float().mean() > 0.3


@llamacpp.needs
def test_minimax_m2_llamacpp_converter_and_engine(minimax, tmp_path):
    """llama.cpp's converter's file (without a gating key: transformers' config has no
    scoring_func) runs with transformers' logits here; with the config naming the sigmoid, its file
    runs with them in llama.cpp too."""
    hf, ours, ids, ref = minimax
    theirs = llamacpp.convert(hf, tmp_path / "llamacpp.gguf", "qwen2")
    with rm.open_gguf(theirs) as g:
        assert "minimax-m2.expert_gating_func" not in g.metadata
    assert _rel(_run(theirs, ids), ref) < 1e-4
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(dict(cfg, scoring_func="sigmoid")))
    try:
        named = llamacpp.convert(hf, tmp_path / "llamacpp-sigmoid.gguf", "qwen2")
    finally:
        (hf / "config.json").write_text(json.dumps(cfg))
    assert _rel(llamacpp.logits(named, ids[:N_PROMPT], tmp_path), ref[:N_PROMPT]) < 1e-4
    assert _rel(_run(named, ids), ref) < 1e-4


def test_minimax_m2_on_the_standin_device_equals_cpu(minimax):
    from rapidmoe_gguf import planner

    _, path, ids, _ = minimax
    hw = planner.Hardware(host_bw_gbps=20.0)
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw) as cpu, \
            rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw, gpu_memory=1 << 30,
                     gpu_backend="standin") as dev:
        assert dev.backend == "standin"
        ref, got = cpu.eval_logits(ids[:N_PROMPT]), dev.eval_logits(ids[:N_PROMPT])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_minimax_m2_resplit_pair(minimax, tmp_path):
    """A RESplit pair: with every residual nearer the f32 file than its base alone."""
    _, path, ids, _ = minimax
    pair = tmp_path / "pair.gguf"
    rm.convert(path, pair, recipe="q4_0-q4_0", progress=False)
    exact = _run(path, ids)
    mean_rel = lambda a: (np.abs(a - exact).max(-1) / np.abs(exact).max(-1)).mean()   # noqa: E731
    assert mean_rel(_run(pair, ids, residual_policy="all")) < 0.5 * mean_rel(_run(pair, ids, residual_policy="none"))


def test_minimax_m2_converter_refuses_softmax_scoring(tmp_path):
    make_tiny_minimax(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(dict(cfg, scoring_func="softmax")))
    with pytest.raises(rm.errors.UnsupportedError, match="scoring_func 'softmax'"):
        rm.convert(tmp_path / "hf", tmp_path / "m.gguf", recipe="f32", progress=False)
