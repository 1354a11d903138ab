#!/usr/bin/env python3
"""Write the benchmark model: a random-weight Qwen3-MoE checkpoint with Qwen3-30B-A3B's per-layer
shapes, and its GGUF conversions.

Shapes per layer are those of Qwen3-30B-A3B (hidden 2048, 128 experts, top-8 with renormalised
weights, expert FFN 768, 32 query and 4 KV heads of dim 128); the model has 4 layers and a
32000-token vocabulary: 2.62 B parameters, about 0.29 B of them read per decoded token. Weights
are N(0, 0.02) (norm weights 1), stored as bf16: fit for measuring speed and memory, not for
generating text. The tokenizer is a byte-level BPE with Qwen2's pre-tokenizer, trained in seconds
on local text; the config's vocab_size pads the vocabulary to 32000.

    python tools/make_bench_model.py OUT_DIR                      # checkpoint + GGUF files
    python tools/make_bench_model.py OUT_DIR --layers 1 --experts 16 --check   # small, for development
    python tools/make_bench_model.py OUT_DIR --arch gpt-oss       # gpt-oss-20b's shapes

``--arch gpt-oss`` writes a GptOssForCausalLM instead, with gpt-oss-20b's per-layer shapes (hidden
2880, 32 experts, top-4, expert FFN 2880, 64 query and 8 KV heads of 64, sliding window 128 on
every other layer, YaRN factor 32 over 4096, attention sinks and biases), 4 layers, the same
vocabulary: its experts fused per layer (gate_up_proj, down_proj) as transformers stores them.
Rows of 2880 are no multiple of 256, so K-quant recipes fall back to 32-element types there; the
gpt-oss formats are mxfp4 (llama.cpp's MXFP4_MOE layout) and q8_0.

OUT_DIR/hf is the Hugging Face checkpoint (config.json, sharded model safetensors + index,
tokenizer.json, tokenizer_config.json), written tensor by tensor so memory stays near one tensor.
Then rapidmoe_gguf.convert writes OUT_DIR/bench-<name>.gguf for each --formats entry:

    q4_0     Q4_0 experts, no residual        q8_0     Q8_0 everywhere
    q4_k     Q4_K experts, no residual        q4k-q8   Q4_K experts + a Q8_0 residual sidecar

``--check`` loads the checkpoint with transformers and runs a forward pass (small models only: it
materialises the model in float32).

``--arch deepseek2`` writes a DeepSeek-V2-Lite / GLM-4.7-Flash-like checkpoint instead
(DeepseekV3ForCausalLM, which llama.cpp converts to deepseek2): hidden 2048, 16 heads with
multi-head latent attention (q_lora_rank 768, kv_lora_rank 512, 128 + 64 rotary query/key dims,
value dim 128), one leading dense layer (FFN 10944), then 64 routed experts of FFN 1408, top-6
with sigmoid scores, and 2 shared experts. The MLA options: --q-lora, --kv-lora, --nope, --rope, --v-dim.

``--arch glm-dsa`` writes a GlmMoeDsaForCausalLM with GLM-5's per-layer shapes (hidden 6144, 64
heads of latent attention with q_lora_rank 2048, kv_lora_rank 512, 192 + 64 query/key dims, value
dim 256; a lightning indexer of 32 heads of 128 keeping 2048 positions; top-8 of the routed experts
of FFN 2048 by sigmoid scores, one shared expert; a leading dense layer of FFN 12288) and 3 layers,
the dense one then two MoE ones of 64 experts rather than 256, so that the checkpoint and llama.cpp's
f16 file fit this machine's disk together (a decoded token reads the same experts' bytes).

``--arch gemma4`` writes a Gemma4ForCausalLM with Gemma-4-26B-A4B's per-layer shapes instead (hidden
2816, 128 experts, top-8, expert FFN 704 beside a dense GELU FFN of 2112; sliding layers with 16
query and 8 KV heads of 256 and a window of 1024, full layers with 16 query heads and 2 KV heads
of 512 whose keys are also the values, proportional RoPE on a quarter of them; soft-capped
logits), 6 layers: five sliding, then one full, the model's own 5:1 pattern. Its tokenizer is
SentencePiece-style BPE with byte fallback, as Gemma's (llama.cpp's converter reads it as such).
The expert FFN of 704 and the dense one of 2112 are no multiples of 256: llama.cpp's K-quant mixes
fall back to other types for the down projections.

``--arch minimax-m2`` writes a MiniMaxM2ForCausalLM with MiniMax-M2's per-layer shapes instead (hidden
3072, 256 experts of FFN 1536, top-8 by sigmoid scores with a selection bias; 48 query and 8 KV
heads of 128 with q/k norms over the whole projection, RoPE on 64 dims of each head), 2 layers
(7.3 B parameters; each layer is 3.6 B), in the released layout (block_sparse_moe.experts.N.w1/w2/w3),
with the released config's scoring_func "sigmoid", which llama.cpp's converter needs to write
the gating key llama.cpp reads.

``--arch mimo2`` writes a MiMoV2FlashForCausalLM with MiMo-V2-Flash's per-layer shapes (hidden 4096,
64 query heads with keys of 192 and values of 128, RoPE on 64 of them; sliding layers with 8 KV
heads, a window of 128 and sinks, full layers with 4 KV heads; experts of FFN 2048, top-8 by sigmoid
scores with a selection bias), 2 layers, a sliding one then a full one, both MoE, and 128 experts
rather than 256 so that the checkpoint and llama.cpp's f16 file fit this machine's disk together
(6.5 B parameters, 12.9 GB bf16; a decoded token reads the same experts' bytes). Its config.json
carries the released config's keys, which llama.cpp's converter reads, and a model_type that
transformers does not know, so that the converter reads config.json itself (through transformers'
own class it meets RoPE keys it does not read).

``--arch step35`` writes a Step-3.5-Flash checkpoint in the released layout (each layer's experts
stacked in one tensor per projection, the released config's keys and a model_type transformers does
not know, as llama.cpp's converter reads them) with Step-3.5-Flash's per-layer shapes (hidden 4096,
expert and shared-expert FFN 1280, top-8 by sigmoid scores with a selection bias; 8 KV heads of
128, full layers with 64 query heads and RoPE on half of each, sliding layers with 96 and a window
of 512; a sigmoid gate per query head), 2 layers, a sliding one then a full one, both MoE, and 144
experts rather than 288 so that the checkpoint and llama.cpp's f16 file fit this machine's disk
together (4.9 B parameters, 9.8 GB bf16; a decoded token reads the same experts' bytes).

``--arch qwen35moe`` writes a Qwen3_5MoeForCausalLM with Qwen3.5-35B-A3B's per-layer shapes instead
(hidden 2048, 256 experts, top-8, expert and shared-expert FFN 512; gated attention with 16 query
and 2 KV heads of dim 256, RoPE on a quarter of each head; Gated DeltaNet with 16 key and 32
value heads of dim 128 and a 4-tap conv; every 4th layer full attention): with 4 layers, three
Gated DeltaNet layers and one gated-attention layer. llama.cpp's converter makes its qwen35moe
files (tools/make_llamacpp_files.py HF_DIR OUT --pre qwen35; it needs --no-mtp for a checkpoint
without an MTP block, which that tool passes for this architecture).

``--arch qwen4exp`` writes a Qwen4ExpForCausalLM (Qwen3.8-Flash-Next) with its per-layer shapes: those
of Qwen3.5 above (Gated DeltaNet and gated attention, expert and shared-expert FFN 512) with top-10
experts, the residual as 4 hyper-connection streams (low rank 320) in place of every norm, and QSA
sparse attention on every 4th layer (an indexer of 16 heads of 128 keeping 2048 positions in blocks
of 4; sizes of our choosing, about 1% of a layer's bytes), without the n-gram embeddings (PLE) and
the MTP block; 4 layers, 128 experts rather than 512 (a decoded token reads the same experts'
bytes). Its config names the QSA layers full_attention, as the released one does, so that llama.cpp's
converter writes their compress ratio (tools/make_llamacpp_files.py HF_DIR OUT --pre qwen35).

``--arch deepseek4`` writes a DeepseekV4ForCausalLM (DeepSeek-V4-Flash) with its per-layer shapes:
hidden 4096, 64 query heads of 512 sharing one key-value head (RoPE on the last 64 dims), the query's
low rank 1024, a grouped output of 8 groups of rank 1024, a window of 128, 4 hyper-connection streams
(20 Sinkhorn iterations), top-6 experts of FFN 2048 and one shared expert, the CSA layers' indexer of
64 heads of 128 keeping 512 entries, YaRN (factor 16 over 65536) on the compressed layers; 4 layers,
CSA, HCA, CSA, HCA, the first routed by a token id table, 16 experts rather than 256 (a decoded token
reads the same experts' bytes), without the MTP block. llama.cpp's converter does not take a
transformers checkpoint of DeepSeek-V4: llama.cpp's files of it are its quantizer's output from our
f16 file (tools/make_llamacpp_files.py HF_DIR OUT --from-gguf OUT/bench-f16.gguf).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import sys
import time

import numpy as np

from make_big_checkpoint import write_shards  # the sharded bf16 writer (tools/)

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# name -> (recipe, convert() overrides)
FORMATS = {
    "q4_0": ("q4_0-q4_0", {"residual_type": "none"}),
    "q8_0": ("q8_0", {}),
    "q4_k": ("q4k-q8", {"residual_type": "none"}),
    "q4k-q8": ("q4k-q8", {}),
    "mxfp4": ("mxfp4", {}),
    "mxfp4-q8": ("mxfp4-q8", {}),
    "f16": ("f16", {}),
}
# --arch -> the formats written by default
DEFAULT_FORMATS = {"gpt-oss": "mxfp4,q8_0", "gemma4": "q8_0", "minimax-m2": "q8_0", "mimo2": "q8_0", "step35": "q8_0",
                   "glm-dsa": "q8_0", "deepseek4": "f16"}


# --arch -> the per-layer shapes its defaults take (flags given on the command line win)
SHAPES = {
    "qwen3moe": dict(experts=128, experts_used=8, hidden=2048, expert_ff=768, heads=32, kv_heads=4, head_dim=128),
    "qwen35moe": dict(experts=256, experts_used=8, hidden=2048, expert_ff=512, heads=16, kv_heads=2, head_dim=256),
    "qwen4exp": dict(experts=128, experts_used=10, hidden=2048, expert_ff=512, heads=16, kv_heads=2, head_dim=256),
    "deepseek2": dict(experts=64, experts_used=6, hidden=2048, expert_ff=1408, heads=16, kv_heads=4, head_dim=128,
                      shared=2, dense_ff=10944, q_lora=768, kv_lora=512, nope=128, rope=64, v_dim=128),
    "gpt-oss": dict(experts=32, experts_used=4, hidden=2880, expert_ff=2880, heads=64, kv_heads=8, head_dim=64),
    "gemma4": dict(experts=128, experts_used=8, hidden=2816, expert_ff=704, heads=16, kv_heads=8, head_dim=256),
    "minimax-m2": dict(experts=256, experts_used=8, hidden=3072, expert_ff=1536, heads=48, kv_heads=8, head_dim=128),
    "mimo2": dict(experts=128, experts_used=8, hidden=4096, expert_ff=2048, heads=64, kv_heads=4, head_dim=192),
    "step35": dict(experts=144, experts_used=8, hidden=4096, expert_ff=1280, heads=64, kv_heads=8, head_dim=128),
    "glm-dsa": dict(experts=64, experts_used=8, hidden=6144, expert_ff=2048, heads=64, kv_heads=64, head_dim=256,
                    shared=1, dense_ff=12288, q_lora=2048, kv_lora=512, nope=192, rope=64, v_dim=256),
    "deepseek4": dict(experts=16, experts_used=6, hidden=4096, expert_ff=2048, heads=64, kv_heads=1, head_dim=512,
                      shared=1, q_lora=1024, rope=64),
}
# DeepSeek-V4-Flash's attention beside SHAPES': the grouped output, window, streams, indexer, YaRN
DEEPSEEK4_EXTRA = dict(o_groups=8, o_lora_rank=1024, sliding_window=128, hc_mult=4, hc_sinkhorn_iters=20,
                       index_n_heads=64, index_head_dim=128, index_topk=512, swiglu_limit=10.0,
                       routed_scaling_factor=1.5, compress_rope_theta=160000.0, rope_theta=10000.0)
DEEPSEEK4_YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32,
                  "beta_slow": 1}
# the special tokens llama.cpp's GLM vocabulary code looks up
GLM_TOKENS = ("[gMASK]", "<|user|>", "<|observation|>")
# GLM-5's lightning indexer: heads, key width, positions kept
GLM_DSA_INDEXER = dict(index_n_heads=32, index_head_dim=128, index_topk=2048)
# Gemma-4-26B-A4B's full-attention layers and dense FFN
GEMMA4_FULL = dict(global_head_dim=512, num_global_key_value_heads=2, intermediate_size=2112, sliding_window=1024)


def hf_config_gemma4(a) -> dict:
    from transformers import Gemma4TextConfig

    n = a.layers
    cfg = Gemma4TextConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=n, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, head_dim=a.head_dim, attention_k_eq_v=True, enable_moe_block=True,
        num_experts=a.experts, top_k_experts=a.experts_used, moe_intermediate_size=a.expert_ff,
        hidden_size_per_layer_input=0, num_kv_shared_layers=0, final_logit_softcapping=30.0,
        layer_types=["full_attention" if (i + 1) % 6 == 0 or i == n - 1 else "sliding_attention" for i in range(n)],
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=2,
        eos_token_id=1, pad_token_id=0, **GEMMA4_FULL)
    d = cfg.to_dict()
    d["architectures"] = ["Gemma4ForCausalLM"]
    d["torch_dtype"] = "bfloat16"
    return d


def tensor_list_gemma4(a) -> list[tuple[str, tuple[int, ...]]]:
    """Gemma 4's tensors as transformers saves them: the experts stacked per layer (gate_up_proj
    with the gate rows first, down_proj), the router's norm scale and per-expert scale, the layer
    scalar; the full layers without v_proj (attention_k_eq_v); the output tied to the embeddings."""
    types = hf_config_gemma4(a)["layer_types"]
    F = GEMMA4_FULL
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p, s = f"model.layers.{b}.", f"model.layers.{b}.self_attn."
        full = types[b] == "full_attention"
        hd, kv = (F["global_head_dim"], F["num_global_key_value_heads"]) if full else (a.head_dim, a.kv_heads)
        t += [(p + "input_layernorm.weight", (a.hidden,)), (s + "q_proj.weight", (a.heads * hd, a.hidden)),
              (s + "k_proj.weight", (kv * hd, a.hidden))]
        t += [] if full else [(s + "v_proj.weight", (kv * hd, a.hidden))]
        t += [(s + "o_proj.weight", (a.hidden, a.heads * hd)), (s + "q_norm.weight", (hd,)), (s + "k_norm.weight", (hd,)),
              (p + "post_attention_layernorm.weight", (a.hidden,)), (p + "pre_feedforward_layernorm.weight", (a.hidden,)),
              (p + "mlp.gate_proj.weight", (F["intermediate_size"], a.hidden)),
              (p + "mlp.up_proj.weight", (F["intermediate_size"], a.hidden)),
              (p + "mlp.down_proj.weight", (a.hidden, F["intermediate_size"])),
              (p + "post_feedforward_layernorm_1.weight", (a.hidden,)),
              (p + "router.proj.weight", (a.experts, a.hidden)), (p + "router.scale", (a.hidden,)),
              (p + "router.per_expert_scale", (a.experts,)),
              (p + "pre_feedforward_layernorm_2.weight", (a.hidden,)),
              (p + "experts.gate_up_proj", (a.experts, 2 * a.expert_ff, a.hidden)),
              (p + "experts.down_proj", (a.experts, a.hidden, a.expert_ff)),
              (p + "post_feedforward_layernorm_2.weight", (a.hidden,)),
              (p + "post_feedforward_layernorm.weight", (a.hidden,)), (p + "layer_scalar", (1,))]
    t += [("model.norm.weight", (a.hidden,))]
    return t
# Qwen3.5-35B-A3B's linear-attention and shared-expert shapes
QWEN35_LINEAR = dict(linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                     linear_value_head_dim=128, linear_conv_kernel_dim=4, shared_expert_intermediate_size=512)


def hf_config_qwen35(a) -> dict:
    from transformers import Qwen3_5MoeTextConfig

    n = a.layers
    cfg = Qwen3_5MoeTextConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=n, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, head_dim=a.head_dim, num_experts=a.experts,
        num_experts_per_tok=a.experts_used, moe_intermediate_size=a.expert_ff, max_position_embeddings=40960,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        **QWEN35_LINEAR,
    )
    d = cfg.to_dict()
    d["architectures"] = ["Qwen3_5MoeForCausalLM"]
    d["full_attention_interval"] = 4
    d["torch_dtype"] = "bfloat16"
    return d


def tensor_list_qwen35(a) -> list[tuple[str, tuple[int, ...]]]:
    L = QWEN35_LINEAR
    nk, nv, dk, dv = (L["linear_num_key_heads"], L["linear_num_value_heads"], L["linear_key_head_dim"],
                      L["linear_value_head_dim"])
    q, kv, conv = a.heads * a.head_dim, a.kv_heads * a.head_dim, 2 * nk * dk + nv * dv
    sh = L["shared_expert_intermediate_size"]
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p = f"model.layers.{b}."
        t += [(p + "input_layernorm.weight", (a.hidden,))]
        if (b + 1) % 4 == 0:
            t += [(p + "self_attn.q_proj.weight", (2 * q, a.hidden)),
                  (p + "self_attn.k_proj.weight", (kv, a.hidden)),
                  (p + "self_attn.v_proj.weight", (kv, a.hidden)),
                  (p + "self_attn.o_proj.weight", (a.hidden, q)),
                  (p + "self_attn.q_norm.weight", (a.head_dim,)),
                  (p + "self_attn.k_norm.weight", (a.head_dim,))]
        else:
            la = p + "linear_attn."
            t += [(la + "in_proj_qkv.weight", (conv, a.hidden)), (la + "in_proj_z.weight", (nv * dv, a.hidden)),
                  (la + "in_proj_b.weight", (nv, a.hidden)), (la + "in_proj_a.weight", (nv, a.hidden)),
                  (la + "conv1d.weight", (conv, 1, L["linear_conv_kernel_dim"])),
                  (la + "dt_bias", (nv,)), (la + "A_log", (nv,)), (la + "norm.weight", (dv,)),
                  (la + "out_proj.weight", (a.hidden, nv * dv))]
        t += [(p + "post_attention_layernorm.weight", (a.hidden,)), (p + "mlp.gate.weight", (a.experts, a.hidden)),
              (p + "mlp.shared_expert.gate_proj.weight", (sh, a.hidden)),
              (p + "mlp.shared_expert.up_proj.weight", (sh, a.hidden)),
              (p + "mlp.shared_expert.down_proj.weight", (a.hidden, sh)),
              (p + "mlp.shared_expert_gate.weight", (1, a.hidden))]
        for x in range(a.experts):
            e = p + f"mlp.experts.{x}."
            t += [(e + "gate_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "up_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "down_proj.weight", (a.hidden, a.expert_ff))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


# Qwen3.8-Flash-Next's hyper-connections and QSA indexer (the indexer's sizes are our choice: no
# released config was at hand; its projection is 1% of a layer's bytes read per token)
QWEN4EXP_EXTRA = dict(hc_count=4, hc_lowrank=320, indexer_n_heads=16, indexer_kv_heads=1, indexer_head_dim=128,
                      indexer_budget=2048, indexer_compress_ratio=4)


def hf_config_qwen4exp(a) -> dict:
    """As the released checkpoint's config says it: the QSA layers named full_attention, the
    pattern also as full_attention_interval (transformers' own config keeps neither)."""
    from transformers.models.qwen4_exp import Qwen4ExpTextConfig

    n = a.layers
    cfg = Qwen4ExpTextConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=n, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, head_dim=a.head_dim, num_experts=a.experts,
        num_experts_per_tok=a.experts_used, moe_intermediate_size=a.expert_ff, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=0,
        layer_types=["indexed_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        **QWEN35_LINEAR, **QWEN4EXP_EXTRA,
    )
    d = cfg.to_dict()
    d["architectures"] = ["Qwen4ExpForCausalLM"]
    d["full_attention_interval"] = 4
    d["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in d["layer_types"]]
    d["torch_dtype"] = "bfloat16"
    return d


def tensor_list_qwen4exp(a) -> list[tuple[str, tuple[int, ...]]]:
    """Qwen3.5-MoE's tensors, each layer's two norms and the final one replaced by hyper-connections
    over hc_count streams, each QSA layer with its indexer."""
    X = QWEN4EXP_EXTRA
    hc, r, wide = X["hc_count"], X["hc_lowrank"], X["hc_count"] * a.hidden

    def hyper(p: str, inject: bool = True) -> list[tuple[str, tuple[int, ...]]]:
        t = [(p + "hc_norm.weight", (wide,)), (p + "input_mix_weight_down.weight", (r, wide)),
             (p + "input_mix_weight_up.weight", (wide, r))]
        return t + ([(p + "block_inject_weight.weight", (hc, wide))] if inject else [])

    t = []
    for name, shape in tensor_list_qwen35(a):
        if name == "model.norm.weight":
            t += hyper("model.hyper_connection_mixer.", inject=False)
        elif name.endswith("input_layernorm.weight"):
            t += hyper(name.replace("input_layernorm.weight", "attn_hyper_connection."))
        elif name.endswith("post_attention_layernorm.weight"):
            t += hyper(name.replace("post_attention_layernorm.weight", "mlp_hyper_connection."))
        else:
            t.append((name, shape))
            if name.endswith("self_attn.k_norm.weight"):
                ix, d = name.replace("k_norm.weight", "indexer."), X["indexer_head_dim"]
                t += [(ix + "index_qk_proj.weight", ((X["indexer_n_heads"] + X["indexer_kv_heads"]) * d, a.hidden)),
                      (ix + "q_layernorm.weight", (d,)), (ix + "k_layernorm.weight", (d,))]
    return t


def _deepseek4_layer_types(a) -> list[str]:
    return ["compressed_sparse_attention" if i % 2 == 0 else "heavily_compressed_attention" for i in range(a.layers)]


def hf_config_deepseek4(a) -> dict:
    from transformers import DeepseekV4Config

    cfg = DeepseekV4Config(
        vocab_size=a.vocab, hidden_size=a.hidden, moe_intermediate_size=a.expert_ff, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=1, head_dim=a.head_dim, q_lora_rank=a.q_lora,
        num_experts_per_tok=a.experts_used, n_routed_experts=a.experts, n_shared_experts=a.shared,
        partial_rotary_factor=a.rope / a.head_dim, layer_types=_deepseek4_layer_types(a),
        mlp_layer_types=["hash_moe"] + ["moe"] * (a.layers - 1), max_position_embeddings=1048576,
        rope_parameters=dict(DEEPSEEK4_YARN), rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=2,
        tie_word_embeddings=False, **DEEPSEEK4_EXTRA)
    d = cfg.to_dict()
    d["architectures"] = ["DeepseekV4ForCausalLM"]
    d["torch_dtype"] = "bfloat16"
    return d


def tensor_list_deepseek4(a) -> list[tuple]:
    """The checkpoint's tensors as transformers saves them, from the converter's own table of them
    (rapidmoe_gguf.arch.DEEPSEEK4: each tensor's name and shape); the hash layer's table int64."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source tree
    from rapidmoe_gguf.arch import DEEPSEEK4

    x = DEEPSEEK4_EXTRA
    dims = dict(n_vocab=a.vocab, n_embd=a.hidden, n_head=a.heads, head_dim=a.head_dim, q_lora_rank=a.q_lora,
                n_q=a.heads * a.head_dim, n_o_in=a.heads * a.head_dim // x["o_groups"],
                n_o_mid=x["o_groups"] * x["o_lora_rank"], n_hc_embd=x["hc_mult"] * a.hidden,
                hc_mix=(2 + x["hc_mult"]) * x["hc_mult"], hc_scales=3, hc_head_scales=1, hc_count=x["hc_mult"],
                head_dim2=2 * a.head_dim, ratio_csa=4, ratio_hca=128, index_n_head=x["index_n_heads"],
                n_index_q=x["index_n_heads"] * x["index_head_dim"], index_head_dim=x["index_head_dim"],
                index_head_dim2=2 * x["index_head_dim"], n_expert=a.experts, n_expert_used=a.experts_used,
                n_ff_exp=a.expert_ff, n_ff_shexp=a.expert_ff * a.shared)
    kinds = _deepseek4_layer_types(a)
    t = []
    for spec in DEEPSEEK4.tensors:
        ne = tuple(dims[d] for d in spec.ne)
        if not spec.per_layer:
            t.append((spec.hf, ne[::-1]))
            continue
        for b in range(a.layers):
            want = {"csa": kinds[b] == "compressed_sparse_attention", "hca": kinds[b] == "heavily_compressed_attention",
                    "hash": b == 0, "routed": b > 0, None: True}[spec.layers]
            if not want:
                continue
            if "{xid}" in spec.hf:
                t += [(spec.hf.format(bid=b, xid=e), ne[:2][::-1]) for e in range(a.experts)]
            elif spec.layers == "hash":
                t.append((spec.hf.format(bid=b), ne[::-1], "I64"))
            else:
                t.append((spec.hf.format(bid=b), ne[::-1]))
    return t


def hf_config_minimax(a) -> dict:
    from transformers import MiniMaxM2Config

    cfg = MiniMaxM2Config(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.expert_ff, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim, rotary_dim=64,
        num_local_experts=a.experts, num_experts_per_tok=a.experts_used, max_position_embeddings=196608,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2)
    d = cfg.to_dict()
    d.update(architectures=["MiniMaxM2ForCausalLM"], scoring_func="sigmoid", torch_dtype="bfloat16")
    return d


def tensor_list_minimax(a) -> list[tuple[str, tuple[int, ...]]]:
    """MiniMax-M2's tensors in its released layout: each expert's w1 (gate), w3 (up), w2 (down)."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p, s, m = f"model.layers.{b}.", f"model.layers.{b}.self_attn.", f"model.layers.{b}.block_sparse_moe."
        t += [(p + "input_layernorm.weight", (a.hidden,)), (s + "q_proj.weight", (q, a.hidden)),
              (s + "k_proj.weight", (kv, a.hidden)), (s + "v_proj.weight", (kv, a.hidden)),
              (s + "o_proj.weight", (a.hidden, q)), (s + "q_norm.weight", (q,)), (s + "k_norm.weight", (kv,)),
              (p + "post_attention_layernorm.weight", (a.hidden,)), (m + "gate.weight", (a.experts, a.hidden)),
              (m + "e_score_correction_bias", (a.experts,))]
        for x in range(a.experts):
            t += [(m + f"experts.{x}.w1.weight", (a.expert_ff, a.hidden)), (m + f"experts.{x}.w3.weight", (a.expert_ff, a.hidden)),
                  (m + f"experts.{x}.w2.weight", (a.hidden, a.expert_ff))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


MIMO2_V_HEAD_DIM, MIMO2_WINDOW = 128, 128


def hf_config_mimo2(a) -> dict:
    """The released config's keys (hybrid_layer_pattern, swa_*, rope_theta / swa_rope_theta,
    sliding_window, layernorm_epsilon) beside transformers' own."""
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(a.layers)]
    return dict(
        architectures=["MiMoV2FlashForCausalLM"], model_type="mimo_v2_flash_bench", vocab_size=a.vocab,
        hidden_size=a.hidden, intermediate_size=16384, moe_intermediate_size=a.expert_ff, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        v_head_dim=MIMO2_V_HEAD_DIM, n_routed_experts=a.experts, num_experts_per_tok=a.experts_used, n_group=1,
        topk_group=1, norm_topk_prob=True, routed_scaling_factor=None, scoring_func="sigmoid", topk_method="noaux_tc",
        max_position_embeddings=262144, rms_norm_eps=1e-5, layernorm_epsilon=1e-5, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=2, torch_dtype="bfloat16", layer_types=types,
        mlp_layer_types=["sparse"] * a.layers, hybrid_layer_pattern=[int(t == "sliding_attention") for t in types],
        sliding_window=MIMO2_WINDOW, swa_num_key_value_heads=2 * a.kv_heads, swa_head_dim=a.head_dim,
        swa_v_head_dim=MIMO2_V_HEAD_DIM, swa_num_attention_heads=a.heads, rope_theta=5000000.0,
        swa_rope_theta=10000.0, partial_rotary_factor=0.334, attention_value_scale=0.707,
        add_swa_attention_sink_bias=True, add_full_attention_sink_bias=False)


def tensor_list_mimo2(a) -> list[tuple[str, tuple[int, ...]]]:
    """MiMo-V2-Flash's tensors as released: q/k/v/o apart, the sliding layers' sinks, each expert's
    gate/up/down."""
    types = hf_config_mimo2(a)["layer_types"]
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p, s, m = f"model.layers.{b}.", f"model.layers.{b}.self_attn.", f"model.layers.{b}.mlp."
        kv = 2 * a.kv_heads if types[b] == "sliding_attention" else a.kv_heads
        t += [(p + "input_layernorm.weight", (a.hidden,)), (s + "q_proj.weight", (a.heads * a.head_dim, a.hidden)),
              (s + "k_proj.weight", (kv * a.head_dim, a.hidden)), (s + "v_proj.weight", (kv * MIMO2_V_HEAD_DIM, a.hidden)),
              (s + "o_proj.weight", (a.hidden, a.heads * MIMO2_V_HEAD_DIM))]
        if types[b] == "sliding_attention":
            t.append((s + "attention_sink_bias", (a.heads,)))
        t += [(p + "post_attention_layernorm.weight", (a.hidden,)), (m + "gate.weight", (a.experts, a.hidden)),
              (m + "gate.e_score_correction_bias", (a.experts,))]
        for x in range(a.experts):
            t += [(m + f"experts.{x}.gate_proj.weight", (a.expert_ff, a.hidden)),
                  (m + f"experts.{x}.up_proj.weight", (a.expert_ff, a.hidden)),
                  (m + f"experts.{x}.down_proj.weight", (a.hidden, a.expert_ff))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


STEP35_HEADS_SWA, STEP35_WINDOW = 96, 512


def hf_config_step35(a) -> dict:
    """The released config's keys (what llama.cpp's converter reads), a sliding layer then a full one."""
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(a.layers)]
    return dict(
        architectures=["Step3p5ForCausalLM"], model_type="step3p5_bench", vocab_size=a.vocab, hidden_size=a.hidden,
        intermediate_size=11264, num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_attention_groups=a.kv_heads, head_dim=a.head_dim,
        attention_other_setting={"attention_type": "sliding_attention", "num_attention_heads": STEP35_HEADS_SWA,
                                 "num_attention_groups": a.kv_heads, "head_dim": a.head_dim},
        layer_types=types, sliding_window=STEP35_WINDOW,
        partial_rotary_factors=[0.5 if t == "full_attention" else 1.0 for t in types],
        rope_theta=[5000000.0 if t == "full_attention" else 10000.0 for t in types], rope_scaling=None,
        max_position_embeddings=262144, rms_norm_eps=1e-5, moe_layers_enum=",".join(str(i) for i in range(a.layers)),
        moe_num_experts=a.experts, moe_top_k=a.experts_used, moe_intermediate_size=a.expert_ff,
        share_expert_dim=a.expert_ff, moe_router_activation="sigmoid", moe_router_scaling_factor=3.0,
        norm_expert_weight=True, use_moe_router_bias=True, use_head_wise_attn_gate=True, use_qk_norm=True,
        swiglu_limits=[0.0] * a.layers, swiglu_limits_shared=[0.0] * a.layers, num_nextn_predict_layers=0,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, torch_dtype="bfloat16")


def tensor_list_step35(a) -> list[tuple[str, tuple[int, ...]]]:
    """Step-3.5's tensors as released: q/k/v/o and the head gate (of the layer kind's heads), q/k norms,
    the experts stacked per projection, the router's selection bias, the shared expert."""
    types = hf_config_step35(a)["layer_types"]
    kv = a.kv_heads * a.head_dim
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        heads = STEP35_HEADS_SWA if types[b] == "sliding_attention" else a.heads
        p, s, m, x = (f"model.layers.{b}.{k}" for k in ("", "self_attn.", "moe.", "share_expert."))
        t += [(p + "input_layernorm.weight", (a.hidden,)), (s + "q_proj.weight", (heads * a.head_dim, a.hidden)),
              (s + "k_proj.weight", (kv, a.hidden)), (s + "v_proj.weight", (kv, a.hidden)),
              (s + "o_proj.weight", (a.hidden, heads * a.head_dim)), (s + "g_proj.weight", (heads, a.hidden)),
              (s + "q_norm.weight", (a.head_dim,)), (s + "k_norm.weight", (a.head_dim,)),
              (p + "post_attention_layernorm.weight", (a.hidden,)), (m + "gate.weight", (a.experts, a.hidden)),
              (m + "router_bias", (a.experts,)),
              (m + "gate_proj.weight", (a.experts, a.expert_ff, a.hidden)),
              (m + "up_proj.weight", (a.experts, a.expert_ff, a.hidden)),
              (m + "down_proj.weight", (a.experts, a.hidden, a.expert_ff)),
              (x + "gate_proj.weight", (a.expert_ff, a.hidden)), (x + "up_proj.weight", (a.expert_ff, a.hidden)),
              (x + "down_proj.weight", (a.hidden, a.expert_ff))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


def hf_config(a) -> dict:
    """config.json, through transformers' own Qwen3MoeConfig (or GptOssConfig) so that every field
    is spelled as it spells it."""
    from transformers import GptOssConfig, Qwen3MoeConfig

    if a.arch == "gpt-oss":
        cfg = GptOssConfig(
            vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.expert_ff, num_hidden_layers=a.layers,
            num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
            num_local_experts=a.experts, num_experts_per_tok=a.experts_used, sliding_window=128,
            max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=0,
            eos_token_id=2, torch_dtype="bfloat16",
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096})
        d = cfg.to_dict()
        d["architectures"] = ["GptOssForCausalLM"]
        return d

    if a.arch == "qwen35moe":
        return hf_config_qwen35(a)
    if a.arch == "qwen4exp":
        return hf_config_qwen4exp(a)
    if a.arch == "deepseek4":
        return hf_config_deepseek4(a)
    if a.arch == "gemma4":
        return hf_config_gemma4(a)
    if a.arch == "minimax-m2":
        return hf_config_minimax(a)
    if a.arch == "mimo2":
        return hf_config_mimo2(a)
    if a.arch == "step35":
        return hf_config_step35(a)
    if a.arch in ("deepseek2", "glm-dsa"):
        return deepseek_config(a)
    cfg = Qwen3MoeConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=6144, moe_intermediate_size=a.expert_ff,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim, num_experts=a.experts, num_experts_per_tok=a.experts_used, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2,
        torch_dtype="bfloat16",
    )
    d = cfg.to_dict()
    d["architectures"] = ["Qwen3MoeForCausalLM"]
    return d


def deepseek_config(a) -> dict:
    """config.json of the deepseek2 (or glm-dsa) bench model, through transformers' DeepseekV3Config
    (GlmMoeDsaConfig), plus the fields llama.cpp's converter reads that transformers does not save."""
    from transformers import DeepseekV3Config, GlmMoeDsaConfig

    glm = a.arch == "glm-dsa"
    extra = dict(GLM_DSA_INDEXER, max_position_embeddings=202752) if glm else dict(max_position_embeddings=32768)
    cfg = (GlmMoeDsaConfig if glm else DeepseekV3Config)(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.dense_ff, moe_intermediate_size=a.expert_ff,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
        n_routed_experts=a.experts, num_experts_per_tok=a.experts_used, n_shared_experts=a.shared,
        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True, first_k_dense_replace=1,
        q_lora_rank=a.q_lora, kv_lora_rank=a.kv_lora, qk_nope_head_dim=a.nope, qk_rope_head_dim=a.rope,
        v_head_dim=a.v_dim, rms_norm_eps=1e-6, rope_theta=1e4,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, torch_dtype="bfloat16", **extra,
    )
    d = cfg.to_dict()
    d.update(architectures=["GlmMoeDsaForCausalLM" if glm else "DeepseekV3ForCausalLM"], scoring_func="sigmoid",
             topk_method="noaux_tc", first_k_dense_replace=1)
    return d


def deepseek_tensor_list(a) -> list[tuple[str, tuple[int, ...]]]:
    """The deepseek2 bench model's tensors: MLA attention, a dense first layer, then MoE layers."""
    qk = a.nope + a.rope
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p, s = f"model.layers.{b}.", f"model.layers.{b}.self_attn."
        t += [(p + "input_layernorm.weight", (a.hidden,)),
              (s + "q_a_proj.weight", (a.q_lora, a.hidden)),
              (s + "q_a_layernorm.weight", (a.q_lora,)),
              (s + "q_b_proj.weight", (a.heads * qk, a.q_lora)),
              (s + "kv_a_proj_with_mqa.weight", (a.kv_lora + a.rope, a.hidden)),
              (s + "kv_a_layernorm.weight", (a.kv_lora,)),
              (s + "kv_b_proj.weight", (a.heads * (a.nope + a.v_dim), a.kv_lora)),
              (s + "o_proj.weight", (a.hidden, a.heads * a.v_dim)),
              (p + "post_attention_layernorm.weight", (a.hidden,))]
        if a.arch == "glm-dsa":   # the lightning indexer
            i, ix = s + "indexer.", GLM_DSA_INDEXER
            t += [(i + "wq_b.weight", (ix["index_n_heads"] * ix["index_head_dim"], a.q_lora)),
                  (i + "wk.weight", (ix["index_head_dim"], a.hidden)),
                  (i + "k_norm.weight", (ix["index_head_dim"],)), (i + "k_norm.bias", (ix["index_head_dim"],)),
                  (i + "weights_proj.weight", (ix["index_n_heads"], a.hidden))]
        m = p + "mlp."
        if b == 0:
            t += [(m + "gate_proj.weight", (a.dense_ff, a.hidden)), (m + "up_proj.weight", (a.dense_ff, a.hidden)),
                  (m + "down_proj.weight", (a.hidden, a.dense_ff))]
            continue
        t += [(m + "gate.weight", (a.experts, a.hidden)), (m + "gate.e_score_correction_bias", (a.experts,))]
        for x in range(a.experts):
            e = m + f"experts.{x}."
            t += [(e + "gate_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "up_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "down_proj.weight", (a.hidden, a.expert_ff))]
        sh = a.expert_ff * a.shared
        t += [(m + "shared_experts.gate_proj.weight", (sh, a.hidden)), (m + "shared_experts.up_proj.weight", (sh, a.hidden)),
              (m + "shared_experts.down_proj.weight", (a.hidden, sh))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


def tensor_list(a) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the checkpoint, with its shape, in the original per-expert layout."""
    if a.arch in ("deepseek2", "glm-dsa"):
        return deepseek_tensor_list(a)
    if a.arch == "qwen35moe":
        return tensor_list_qwen35(a)
    if a.arch == "qwen4exp":
        return tensor_list_qwen4exp(a)
    if a.arch == "deepseek4":
        return tensor_list_deepseek4(a)
    if a.arch == "gpt-oss":
        return gpt_oss_tensor_list(a)
    if a.arch == "gemma4":
        return tensor_list_gemma4(a)
    if a.arch == "minimax-m2":
        return tensor_list_minimax(a)
    if a.arch == "mimo2":
        return tensor_list_mimo2(a)
    if a.arch == "step35":
        return tensor_list_step35(a)
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p = f"model.layers.{b}."
        t += [(p + "input_layernorm.weight", (a.hidden,)),
              (p + "self_attn.q_proj.weight", (q, a.hidden)),
              (p + "self_attn.k_proj.weight", (kv, a.hidden)),
              (p + "self_attn.v_proj.weight", (kv, a.hidden)),
              (p + "self_attn.o_proj.weight", (a.hidden, q)),
              (p + "self_attn.q_norm.weight", (a.head_dim,)),
              (p + "self_attn.k_norm.weight", (a.head_dim,)),
              (p + "post_attention_layernorm.weight", (a.hidden,)),
              (p + "mlp.gate.weight", (a.experts, a.hidden))]
        for x in range(a.experts):
            e = p + f"mlp.experts.{x}."
            t += [(e + "gate_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "up_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "down_proj.weight", (a.hidden, a.expert_ff))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


def gpt_oss_tensor_list(a) -> list[tuple[str, tuple[int, ...]]]:
    """gpt-oss's tensors: biased attention with sinks, a biased router, each layer's experts fused
    (gate and up interleaved in gate_up_proj, matrices as (in, out))."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p = f"model.layers.{b}."
        s, m = p + "self_attn.", p + "mlp."
        t += [(p + "input_layernorm.weight", (a.hidden,)),
              (s + "q_proj.weight", (q, a.hidden)), (s + "q_proj.bias", (q,)),
              (s + "k_proj.weight", (kv, a.hidden)), (s + "k_proj.bias", (kv,)),
              (s + "v_proj.weight", (kv, a.hidden)), (s + "v_proj.bias", (kv,)),
              (s + "o_proj.weight", (a.hidden, q)), (s + "o_proj.bias", (a.hidden,)),
              (s + "sinks", (a.heads,)),
              (p + "post_attention_layernorm.weight", (a.hidden,)),
              (m + "router.weight", (a.experts, a.hidden)), (m + "router.bias", (a.experts,)),
              (m + "experts.gate_up_proj", (a.experts, a.hidden, 2 * a.expert_ff)),
              (m + "experts.gate_up_proj_bias", (a.experts, 2 * a.expert_ff)),
              (m + "experts.down_proj", (a.experts, a.expert_ff, a.hidden)),
              (m + "experts.down_proj_bias", (a.experts, a.hidden))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


def bf16_bytes(x: np.ndarray) -> bytes:
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()  # round to nearest even


def bench_bf16(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> bytes:
    """Norm weights 1 (0 for the Qwen3.5 and Step-3.5 norms that scale by 1 + w), selection biases 0, every other
    weight N(0, 0.02); DeepSeek-V4's token id table (int64) distinct experts per row."""
    if name.endswith("gate.tid2eid"):
        k, rows = shape[1], shape[0]
        return np.stack([rng.permutation(_BENCH_ARGS.experts)[:k] for _ in range(rows)]).astype("<i8").tobytes()
    if name.endswith("norm.weight") and _one_plus_w(name):
        return bf16_bytes(np.zeros(shape, np.float32))
    if name.endswith(("norm.weight", "router.scale", "per_expert_scale", "layer_scalar")):
        return bf16_bytes(np.ones(shape, np.float32))
    if name.endswith(("e_score_correction_bias", "router_bias")):
        return bf16_bytes(np.zeros(shape, np.float32))
    return bf16_bytes(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))


_PLUS_ONE_NORMS = False   # set by main for --arch qwen35moe, qwen4exp and step35
_BENCH_ARGS = None        # main's arguments (the expert count of a token id table)


def _one_plus_w(name: str) -> bool:
    return _PLUS_ONE_NORMS and not name.endswith("linear_attn.norm.weight")


def corpus(max_bytes: int = 8 << 20):
    """Local English text: the GCIDE dictionary when installed, else Python's own sources."""
    gcide = "/usr/share/dictd/gcide.dict.dz"
    if os.path.exists(gcide):
        with gzip.open(gcide, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read(max_bytes)
        yield from text.splitlines()
        return
    n = 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        yield from text.splitlines()
        n += len(text)
        if n > max_bytes:
            return


def write_tokenizer(out: str, n_tokens: int, extra_special: tuple[str, ...] = ()) -> int:
    """A byte-level BPE of Qwen2's split trained on a local corpus; extra_special: special tokens a
    family's converter looks up (GLM's [gMASK], <|user|>, <|observation|> for llama.cpp's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=n_tokens, special_tokens=SPECIAL_TOKENS + list(extra_special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False, "add_eos_token": False,
           "model_max_length": 40960, "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return tok.get_vocab_size()


def write_gemma_tokenizer(out: str, n_tokens: int) -> int:
    """SentencePiece-style BPE as Gemma's: pieces with '▁' for spaces, byte tokens <0xXX> in the
    vocabulary, Gemma's turn markers as special tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=n_tokens, special_tokens=specials + [f"<0x{i:02X}>" for i in range(256)],
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() < n_tokens:   # llama.cpp's converter takes the model's rows from the vocabulary
        tok.add_special_tokens([f"<unused{i}>" for i in range(n_tokens - tok.get_vocab_size())])
    tj = json.loads(tok.to_str())   # the byte tokens are plain pieces of the vocabulary
    tj["added_tokens"] = [t for t in tj["added_tokens"] if not t["content"].startswith("<0x")]
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    template = ("{{ bos_token }}{% for m in messages %}{{ '<|turn>' + ('model' if m['role'] == 'assistant' else "
                "m['role']) + '\\n' + m['content'] + '<turn|>\\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}")
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
           "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
           "model_max_length": 262144, "chat_template": template}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return tok.get_vocab_size()


def check_with_transformers(hf: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(hf)
    ids = tok("The quick brown fox jumps over the lazy dog.", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
    print(f"  transformers: loaded, {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params, "
          f"logits {tuple(logits.shape)} finite", file=sys.stderr)


def convert_all(hf: str, out: str, formats: list[str], threads: int) -> dict[str, str]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source tree
    try:
        from rapidmoe_gguf import convert
    except ImportError as exc:
        raise SystemExit(f"cannot import rapidmoe_gguf.convert ({exc}): build the package, then rerun to convert")
    written = {}
    for name in formats:
        recipe, kw = FORMATS[name]
        path = os.path.join(out, f"bench-{name}.gguf")
        t0 = time.perf_counter()
        convert(hf, path, recipe, n_threads=threads, **kw)
        print(f"  {os.path.basename(path)}: {os.path.getsize(path) / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
        written[name] = path
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (created)")
    ap.add_argument("--arch", choices=sorted(SHAPES), default="qwen3moe",
                    help="qwen3moe: Qwen3-30B-A3B's shapes; qwen35moe: Qwen3.5-35B-A3B's (hybrid); "
                         "deepseek2: DeepSeek-V2-Lite/GLM-4.7-Flash-like; gpt-oss: gpt-oss-20b's; "
                         "gemma4: Gemma-4-26B-A4B's; minimax-m2: MiniMax-M2's; mimo2: MiMo-V2-Flash's; "
                         "step35: Step-3.5-Flash's; glm-dsa: GLM-5's; qwen4exp: Qwen3.8-Flash-Next's; "
                         "deepseek4: DeepSeek-V4-Flash's")
    ap.add_argument("--layers", type=int, default=None,
                    help="default 4 (gemma4: 6, its 5:1 pattern; minimax-m2, mimo2, step35: 2; glm-dsa: 3)")
    ap.add_argument("--experts", type=int, default=None)
    ap.add_argument("--experts-used", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--expert-ff", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=None)
    ap.add_argument("--shared", type=int, default=None, help="deepseek2 (2), glm-dsa (1): shared experts")
    ap.add_argument("--dense-ff", type=int, default=None,
                    help="deepseek2 (10944), glm-dsa (12288): the leading dense layer's FFN")
    ap.add_argument("--q-lora", type=int, default=None)
    ap.add_argument("--kv-lora", type=int, default=None)
    ap.add_argument("--nope", type=int, default=None)
    ap.add_argument("--rope", type=int, default=None)
    ap.add_argument("--v-dim", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=32000, help="config vocab_size (the model's rows)")
    ap.add_argument("--tokenizer-size", type=int, default=8000, help="tokens the BPE learns (<= --vocab)")
    ap.add_argument("--formats", default=None, help=f"comma-separated: {', '.join(FORMATS)}; "
                    "empty writes only the checkpoint (default: q4_0,q8_0,q4_k,q4k-q8; gpt-oss: mxfp4,q8_0)")
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=0, help="quantizer threads (0: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="load the checkpoint with transformers (small models)")
    ap.add_argument("--force", action="store_true", help="rewrite the checkpoint if it exists")
    a = ap.parse_args(argv)
    for k, v in SHAPES[a.arch].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.layers is None:
        a.layers = {"gemma4": 6, "minimax-m2": 2, "mimo2": 2, "step35": 2, "glm-dsa": 3}.get(a.arch, 4)
    global _PLUS_ONE_NORMS, _BENCH_ARGS
    _PLUS_ONE_NORMS = a.arch in ("qwen35moe", "qwen4exp", "step35")
    _BENCH_ARGS = a
    default_formats = DEFAULT_FORMATS.get(a.arch, "q4_0,q8_0,q4_k,q4k-q8")
    formats = [f for f in (default_formats if a.formats is None else a.formats).split(",") if f]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        ap.error(f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}")
    if a.tokenizer_size > a.vocab:
        ap.error("--tokenizer-size must not exceed --vocab")

    hf = os.path.join(a.out, "hf")
    os.makedirs(hf, exist_ok=True)
    tensors = tensor_list(a)
    n_params = sum(math.prod(t[1]) for t in tensors)
    done = os.path.exists(os.path.join(hf, "model.safetensors.index.json"))
    if done and not a.force:
        print(f"{hf}: checkpoint exists (use --force to rewrite)", file=sys.stderr)
    else:
        print(f"{hf}: {n_params / 1e9:.3f} B parameters, {2 * n_params / 1e9:.2f} GB bf16", file=sys.stderr)
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump(hf_config(a), f, indent=2)
        if a.arch == "gemma4":   # as many tokens as rows: llama.cpp's gemma4 converter does not pad
            n_tok = write_gemma_tokenizer(hf, a.vocab)
        else:
            n_tok = write_tokenizer(hf, a.tokenizer_size, GLM_TOKENS if a.arch == "glm-dsa" else ())
        print(f"  tokenizer: {n_tok} tokens (vocab padded to {a.vocab})", file=sys.stderr)
        write_shards(hf, tensors, int(a.shard_gb * 1e9), a.seed, bench_bf16)
    if a.check:
        check_with_transformers(hf)
    if formats:
        convert_all(hf, a.out, formats, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
