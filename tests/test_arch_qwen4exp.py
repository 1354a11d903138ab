"""qwen4exp (Qwen3.8-Flash-Next, transformers' Qwen4ExpForCausalLM): Qwen3.5-MoE's Gated DeltaNet
layers, routed experts and gated shared expert, with hyper-connections in place of every norm: the
residual is hc_count streams, each block's input their gated mean, its output added to each stream
with the stream's own weight, and the output's norm a last such mixer.

Tiny random checkpoints made at test time: 3 Gated DeltaNet layers (2 key heads, 4 value heads),
3 residual streams of a low rank of 8, every norm's gamma away from 1.

Oracles and budgets:
- transformers (f32): our logits within 1e-4 relative (max |diff| / max |logit| per position) over a
  40-token prefill and 6 decode steps (measured 1.6e-6 and 2.0e-6);
- llama.cpp's converter on the same checkpoint (when its source is at hand): its file runs in our
  engine within 1e-5 relative of our own file's logits (measured 1.9e-6 from transformers), so both
  converters write the same layout. llama.cpp's engine itself stops on a file without attention
  layers (GGML_ASSERT(buffer) in ggml-backend.cpp, llama-cpp-python 0.3.36), so it is no oracle here.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import rapidmoe_gguf as rm
import llamacpp_oracle as llamacpp
from conftest import VOCAB, make_tiny_tokenizer
from conftest import logit_rel as _rel
from test_arch_qwen35 import init_hybrid_weights

N_PROMPT, N_DECODE = 40, 6


def make_tiny_qwen4exp(out_dir, seed: int = 0, **overrides):
    """A tiny random Qwen4ExpForCausalLM checkpoint (f32)."""
    import torch
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
               max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
               eos_token_id=2, pad_token_id=0, hc_count=3, hc_lowrank=8,
               layer_types=["linear_attention"] * 3,
               # the QSA keys llama.cpp's converter and loader require, unused without indexed layers
               indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=8,
               indexer_compress_ratio=4)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(Qwen4ExpTextConfig(**cfg)).eval()
    # every norm's gamma well away from 1; the hyper-connections' gates away from 1/2
    init_hybrid_weights(model, seed, norm_std=0.2, stds=(("input_mix_weight", 0.3), ("block_inject", 0.3)))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    make_tiny_tokenizer(out_dir)
    return model


@pytest.fixture(scope="module")
def qwen4exp(tmp_path_factory):
    """(checkpoint dir, our f32 file, token ids, transformers' logits)."""
    import torch

    d = tmp_path_factory.mktemp("qwen4exp")
    model = make_tiny_qwen4exp(d / "hf")
    out = d / "model.gguf"
    rm.convert(d / "hf", out, recipe="f32", progress=False)
    ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    return d / "hf", out, ids, ref


def test_qwen4exp_hyper_connections_match_transformers(qwen4exp):
    hf, path, ids, ref = qwen4exp
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=64) as m:
        assert m.info["arch"] == "qwen4exp"
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    print("rel", _rel(first, ref[:N_PROMPT]), _rel(rest, ref[N_PROMPT:]))
    assert _rel(first, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4


def test_qwen4exp_llama_cpp_file_runs_as_ours(qwen4exp, tmp_path):
    hf, path, ids, ref = qwen4exp
    if llamacpp.src() is None:
        pytest.skip("llama.cpp's converter is not at hand (LLAMA_CPP_SRC)")
    theirs = llamacpp.convert(hf, tmp_path / "llamacpp.gguf", "qwen35")
    with rm.Model(theirs, n_ctx=64, n_threads=2) as m, rm.Model(path, n_ctx=64, n_threads=2) as ours:
        assert m.info["arch"] == "qwen4exp"
        a = m.eval_logits(ids[:N_PROMPT])
        b = ours.eval_logits(ids[:N_PROMPT])
    assert _rel(a, b) < 1e-5
    assert _rel(a, ref[:N_PROMPT]) < 1e-4
