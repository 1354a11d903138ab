"""DeepSeek-V2/V3, GLM-4.7-Flash (llama.cpp's deepseek2: multi-head latent attention) and GLM-4.5
(glm4moe) against transformers, on tiny random checkpoints made here.

The configs use odd sizes, non-zero selection biases (e_score_correction_bias), more than one
expert group, a routed scaling factor other than 1, leading dense layers and shared experts.
Oracle: transformers at f32; logits within 1e-4 of each position's largest logit, over a prompt
evaluated as one batch (MLA's expanded form) and then one token at a time (its absorbed form).
The same prompt run one token at a time from the start (absorbed only) must give the batch's
logits: the two forms compute the same attention.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import rapidmoe_gguf as rm
from conftest import VOCAB, make_tiny_tokenizer

N_PROMPT, N_DECODE = 24, 8

_MLA = dict(kv_lora_rank=40, qk_nope_head_dim=24, qk_rope_head_dim=8, v_head_dim=20)
_MOE = dict(n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=52, n_shared_experts=2,
            intermediate_size=88, first_k_dense_replace=1)

# name -> (transformers config and model classes, config fields)
CONFIGS = {
    # DeepSeek-V3: q through q_lora_rank, sigmoid scores with a bias, 3 groups of 2, keep 2
    "deepseek_v3": ("DeepseekV3", dict(_MLA, **_MOE, q_lora_rank=36, n_group=3, topk_group=2,
                                       routed_scaling_factor=2.5, norm_topk_prob=True,
                                       scoring_func="sigmoid", topk_method="noaux_tc")),
    # DeepSeek-V2-Lite: a direct q projection, softmax scores, no renormalisation
    "deepseek_v2": ("DeepseekV2", dict(_MLA, **_MOE, q_lora_rank=None, topk_method="greedy",
                                       routed_scaling_factor=1.5)),
    # DeepSeek-V2: grouped softmax routing (a group's best score), q through q_lora_rank
    "deepseek_v2_grouped": ("DeepseekV2", dict(_MLA, **_MOE, q_lora_rank=36, topk_method="group_limited_greedy",
                                               n_group=3, topk_group=2, routed_scaling_factor=1.5)),
    # GLM-4.7-Flash: MLA with sigmoid routing; dense layers from mlp_layer_types
    "glm4_moe_lite": ("Glm4MoeLite", dict(_MLA, **_MOE, q_lora_rank=36, n_group=1, topk_group=1,
                                          routed_scaling_factor=1.8, norm_topk_prob=True,
                                          scoring_func="sigmoid", topk_method="noaux_tc",
                                          mlp_layer_types=["dense", "sparse", "sparse"])),
    # GLM-4.5: plain attention with partial rotary, q/k/v biases, q/k norms, 2 kv heads
    "glm4_moe": ("Glm4Moe", dict(_MOE, head_dim=20, num_attention_heads=4, num_key_value_heads=2, attention_bias=True, use_qk_norm=True,
                                 n_group=2, topk_group=1, routed_scaling_factor=2.0, norm_topk_prob=True)),
}


def make_checkpoint(out, name: str, seed: int = 0, **overrides):
    import torch
    import transformers

    prefix, fields = CONFIGS[name]
    cfg_cls = getattr(transformers, prefix + "Config")
    model_cls = getattr(transformers, prefix + "ForCausalLM")
    fields = dict(dict(vocab_size=VOCAB, hidden_size=72, num_hidden_layers=3, num_attention_heads=3,
                       num_key_value_heads=3, max_position_embeddings=256, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=0),
                  **fields, **overrides)
    config = cfg_cls(**fields)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and "norm" in pname:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_((0.1 if pname.startswith("lm_head") else 0.05) * noise)
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):   # the selection bias: non-zero, comparable to the scores
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    model.save_pretrained(out)
    # transformers does not save the fields llama.cpp's converter reads (scoring_func, topk_method,
    # first_k_dense_replace): write them as the published configs have them
    cfg_path = out / "config.json"
    saved = json.loads(cfg_path.read_text())
    for k in ("scoring_func", "topk_method", "first_k_dense_replace"):
        if k in fields:
            saved[k] = fields[k]
    cfg_path.write_text(json.dumps(saved, indent=2))
    make_tiny_tokenizer(out)
    return out


def reference_logits(hf_dir, ids):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(f"ds-{name}")
            src = make_checkpoint(d / "hf", name)
            out = d / "model.gguf"
            rm.convert(src, out, recipe="f32", progress=False)
            ids = np.random.default_rng(11).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
            cache[name] = (src, out, ids, reference_logits(src, ids))
        return cache[name]

    return get


def _ours(path, ids, n_batch):
    """Logits of every position: the prompt in steps of n_batch tokens, then one token at a time."""
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=n_batch) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = [m.eval([t]) for t in ids[N_PROMPT:]]
    return np.concatenate([first, np.stack(rest)])


def _rel(ours, ref):
    return np.abs(ours - ref).max(-1) / np.abs(ref).max(-1)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_arch_deepseek_f32_matches_transformers(converted, name):
    _, path, ids, ref = converted(name)
    rel = _rel(_ours(path, ids, 64), ref)
    assert rel.max() <= 1e-4, f"{name}: worst position {rel.argmax()} rel err {rel.max():.2e}"


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2", "glm4_moe_lite"])
def test_arch_deepseek_mla_absorbed_equals_expanded(converted, name):
    """One token at a time (absorbed) against the prompt as one batch (expanded), and transformers."""
    _, path, ids, ref = converted(name)
    absorbed, expanded = _ours(path, ids, 1), _ours(path, ids, 64)
    assert _rel(absorbed, expanded).max() <= 1e-5
    assert _rel(absorbed, ref).max() <= 1e-4
