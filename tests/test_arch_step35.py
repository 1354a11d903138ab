"""Step-3.5-Flash (step35): sliding and full layers with their own query heads, a sigmoid gate per
query head on the attention output, per-head q/k norms, norms that scale by (1 + w), NEOX RoPE on
half of each head in the full layers and on all of it in the sliding ones (a base per kind), sigmoid
routing with a selection bias, a scale and renormalised weights, an ungated shared expert, SwiGLU
limits per layer (the routed experts' and the shared expert's and dense FFN's), leading dense layers.

Tiny random checkpoints made at test time with transformers' Step3p7TextModel (the text model
transformers runs for model_type step3p5; it has no causal-LM class of its own, so the head is a
plain linear layer beside it) and written under the released checkpoints' tensor names and config
keys, the layout llama.cpp's converter reads: 4 layers (full, sliding, sliding, full), the first
dense, 8 experts, top-2, 4 query heads on the full layers and 8 on the sliding ones over 2 kv heads
of 16, a window of 9 positions that a 48-token sequence passes several times over, limits low enough
to bind on layers 0, 2 and 3.

Oracles and budgets:
- transformers (f32): our logits within 1e-4 relative (max |diff| / max |logit| per position) over a
  40-token prefill and 8 decode steps, from our converter's file and from llama.cpp's converter's.
- llama.cpp (F32 cache) on its own file and on ours: within 1e-4 of transformers.
- llama.cpp renormalises the chosen experts' weights only where the config says norm_expert_weight
  (the released config does), transformers always: the checkpoint here says it, as the released one.
- llama.cpp's converter reads the config through transformers' AutoConfig, which drops the released
  keys it indexes (num_attention_groups, moe_num_experts, ...); with a model_type transformers does
  not know it reads config.json as written, and that is how its files are made here.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import rapidmoe_gguf as rm
import llamacpp_oracle as llamacpp
from conftest import VOCAB, make_tiny_tokenizer
from conftest import logit_rel as _rel

N_PROMPT, N_DECODE = 40, 8
LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
HIDDEN = 64

# The released config's spelling (what llama.cpp's converter and the released models' own code read)
RELEASED = {
    "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5",
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 96, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_attention_groups": 2, "head_dim": 16,
    "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 8,
                                "num_attention_groups": 2, "head_dim": 16},
    "layer_types": LAYER_TYPES, "sliding_window": 9,
    "partial_rotary_factors": [0.5 if t == "full_attention" else 1.0 for t in LAYER_TYPES],
    "rope_theta": [500000.0 if t == "full_attention" else 10000.0 for t in LAYER_TYPES],
    "rope_scaling": None, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "moe_layers_enum": "1,2,3", "moe_num_experts": 8, "moe_top_k": 2,
    "moe_intermediate_size": 32, "share_expert_dim": 48,
    "moe_router_activation": "sigmoid", "moe_router_scaling_factor": 2.5, "norm_expert_weight": True,
    "use_moe_router_bias": True, "need_fp32_gate": True, "use_head_wise_attn_gate": True, "use_qk_norm": True,
    "swiglu_limits": [0.0, 0.0, 0.0, 0.25], "swiglu_limits_shared": [0.3, 0.0, 0.3, 0.3],
    "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0,
}


class _Reference:
    """transformers' text model and a linear head: logits of a sequence."""

    def __init__(self, text, head):
        self.text, self.head = text, head

    def __call__(self, ids) -> np.ndarray:
        import torch

        with torch.no_grad():
            h = self.text(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state
            return self.head(h)[0].float().numpy()


def make_tiny_step35(out_dir, seed: int = 0, **overrides) -> _Reference:
    """A checkpoint in the released layout (tensor names and config keys) and its reference."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig
    from transformers.models.step3p7 import Step3p7TextModel

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(dict(RELEASED, **overrides)))
    cfg = AutoConfig.from_pretrained(out_dir)
    torch.manual_seed(seed)
    text = Step3p7TextModel(cfg).eval()
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in text.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(0.1 * noise if p.ndim == 1 else 0.05 * noise)   # norms scale by 1 + w
        for name, b in text.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))   # moves the sigmoid scores' order
        head.weight.copy_(0.1 * torch.randn(head.weight.shape, generator=g))
    sd = {}
    for k, v in text.state_dict().items():   # transformers' names -> the released checkpoints'
        k = "model." + k
        if k.endswith(".mlp.experts.gate_up_proj"):   # (experts, 2 * ff, hidden), the gate rows first
            base = k[: -len(".mlp.experts.gate_up_proj")]
            gate, up = v.chunk(2, dim=1)
            sd[base + ".moe.gate_proj.weight"], sd[base + ".moe.up_proj.weight"] = gate.contiguous(), up.contiguous()
            continue
        if k.endswith(".mlp.experts.down_proj"):
            sd[k[: -len(".mlp.experts.down_proj")] + ".moe.down_proj.weight"] = v.contiguous()
            continue
        k = (k.replace(".mlp.gate.e_score_correction_bias", ".moe.router_bias")
              .replace(".mlp.gate.weight", ".moe.gate.weight").replace(".mlp.shared_experts.", ".share_expert."))
        sd[k] = v.contiguous()
    sd["lm_head.weight"] = head.weight.detach().contiguous()
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    make_tiny_tokenizer(out_dir)
    return _Reference(text, head)


def llamacpp_view(hf_dir, out_dir):
    """hf_dir with a model_type transformers does not know: llama.cpp's converter then reads the
    released keys from config.json as written."""
    shutil.copytree(hf_dir, out_dir)
    cfg = json.loads((out_dir / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps(dict(cfg, model_type="step3p5_released")))
    return out_dir


@pytest.fixture(scope="module")
def step35(tmp_path_factory):
    d = tmp_path_factory.mktemp("step35")
    ref = make_tiny_step35(d / "hf")
    out = d / "model.gguf"
    rm.convert(d / "hf", out, recipe="f32", progress=False)
    ids = np.random.default_rng(5).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    return d / "hf", out, ids, ref(ids), ref


def _run(path, ids, **kw):
    with rm.Model(path, n_ctx=96, n_threads=2, **kw) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    return np.concatenate([first, rest])


def test_step35_logits_match_transformers(step35):
    hf, path, ids, ref, _ = step35
    with rm.open_gguf(path) as g:
        md = g.metadata
        hp = g.hparams()
    assert list(md["step35.attention.head_count"]) == [4, 8, 8, 4]
    assert list(md["step35.attention.sliding_window_pattern"]) == [False, True, True, False]
    assert md["step35.rope.freq_base"] == pytest.approx(500000.0) and md["step35.rope.freq_base_swa"] == 10000.0
    assert list(md["step35.swiglu_clamp_shexp"]) == pytest.approx([0.3, 0.0, 0.3, 0.3])
    assert md["step35.expert_weights_scale"] == pytest.approx(2.5) and md["step35.expert_weights_norm"]
    assert (hp["n_layer_dense_lead"], hp["n_head_swa"], hp["n_layer_swa"], hp["n_ff_shexp"]) == (1, 8, 2, 48)
    for n_batch in (16, 512):   # the prompt in chunks, and whole
        got = _run(path, ids, n_batch=n_batch)
        assert _rel(got[:N_PROMPT], ref[:N_PROMPT]) < 1e-4
        assert _rel(got[N_PROMPT:], ref[N_PROMPT:]) < 1e-4


def test_step35_gate_bias_and_limits_matter(step35):
    """Each of the head gates, the routing bias and the SwiGLU limits moves transformers' logits well
    past the budget (else a runtime that dropped one would pass)."""
    import torch

    _, _, ids, ref, model = step35
    moved = {}
    for what in ("g_proj", "e_score_correction_bias", "limits"):
        saved = {}
        with torch.no_grad():
            for name, t in list(model.text.named_parameters()) + list(model.text.named_buffers()):
                if what in name:
                    saved[name] = t.clone()
                    t.fill_(20.0 if what == "g_proj" else 0.0)   # sigmoid 1: every head ungated
            for mod in model.text.modules():
                if what == "limits" and hasattr(mod, "limit"):
                    saved[mod] = mod.limit
                    mod.limit = float("inf")
        moved[what] = _rel(model(ids), ref)
        with torch.no_grad():
            for key, v in saved.items():
                if isinstance(key, str):
                    dict(list(model.text.named_parameters()) + list(model.text.named_buffers()))[key].copy_(v)
                else:
                    key.limit = v
    assert _rel(model(ids), ref) == 0.0
    assert min(moved.values()) > 1e-2, moved


@llamacpp.needs
def test_step35_llamacpp_converter_and_engine(step35, tmp_path):
    """llama.cpp's converter's file runs with transformers' logits here, and in llama.cpp; llama.cpp
    runs ours with them too."""
    hf, ours, ids, ref, _ = step35
    theirs = llamacpp.convert(llamacpp_view(hf, tmp_path / "hf"), tmp_path / "llamacpp.gguf", "qwen2")
    with rm.open_gguf(theirs) as g:
        md = g.metadata
    assert "step35.rope.dimension_count" not in md   # the loader's default, halved on the full layers
    assert _rel(_run(theirs, ids), ref) < 1e-4
    assert _rel(llamacpp.logits(theirs, ids[:N_PROMPT], tmp_path), ref[:N_PROMPT]) < 1e-4
    assert _rel(llamacpp.logits(ours, ids[:N_PROMPT], tmp_path), ref[:N_PROMPT]) < 1e-4


def test_step35_transformers_spelling(step35, tmp_path):
    """The config as transformers saves it (n_routed_experts, num_key_value_heads, mlp_layer_types,
    rope_parameters per layer kind, ...) gives the same file."""
    from transformers import AutoConfig

    hf, ours, ids, ref, _ = step35
    shutil.copytree(hf, tmp_path / "hf")
    cfg = AutoConfig.from_pretrained(hf).to_dict()
    cfg["architectures"] = ["Step3p5ForCausalLM"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "t.gguf"
    rm.convert(tmp_path / "hf", out, recipe="f32", progress=False)
    assert _rel(_run(out, ids), ref) < 1e-4


def test_step35_kv_cache_types(step35):
    _, path, ids, ref, _ = step35
    for t in ("f16", "bf16"):   # heads of 16: no quantized type's block fits them
        got = _run(path, ids, n_batch=16, cache_type_k=t, cache_type_v=t)
        assert _rel(got, ref) < (2e-3 if t == "f16" else 2e-2), t


def test_step35_on_the_standin_device_equals_cpu(step35):
    from rapidmoe_gguf import planner

    _, path, ids, _, _ = step35
    hw = planner.Hardware(host_bw_gbps=20.0)
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw) as cpu, \
            rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw, gpu_memory=1 << 30,
                     gpu_backend="standin") as dev:
        assert dev.backend == "standin"
        ref, got = cpu.eval_logits(ids[:N_PROMPT]), dev.eval_logits(ids[:N_PROMPT])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_step35_resplit_pair(step35, tmp_path):
    """A RESplit pair: with every residual nearer the f32 file than its base alone."""
    _, path, ids, _, _ = step35
    pair = tmp_path / "pair.gguf"
    rm.convert(path, pair, recipe="q4_0-q4_0", progress=False)
    exact = _run(path, ids)
    mean_rel = lambda a: (np.abs(a - exact).max(-1) / np.abs(exact).max(-1)).mean()   # noqa: E731
    assert mean_rel(_run(pair, ids, residual_policy="all")) < 0.5 * mean_rel(_run(pair, ids, residual_policy="none"))


@pytest.mark.parametrize("extra, msg", [
    (dict(partial_rotary_factors=[1.0, 1.0, 1.0, 1.0]), "partial_rotary_factor 1.0"),
    (dict(attention_other_setting={"num_attention_heads": 8, "num_attention_groups": 1}), "num_attention_groups"),
    (dict(moe_router_activation="softmax"), "moe_router_activation 'softmax'"),
    (dict(moe_layers_enum="1,3"), "only leading dense layers"),
])
def test_step35_converter_refuses_what_it_cannot_express(step35, tmp_path, extra, msg):
    hf, _, _, _, _ = step35
    shutil.copytree(hf, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(dict(cfg, **extra)))
    with pytest.raises(rm.errors.UnsupportedError, match=msg):
        rm.convert(tmp_path / "hf", tmp_path / "m.gguf", recipe="f32", progress=False)
    assert not (tmp_path / "m.gguf").exists()


def test_step35_swiglu_limits_as_the_loader_reads_them(step35, tmp_path):
    """The limits key holds one float for every layer or a float per layer; a negative, non-finite or
    short list is refused by name, and a scalar is every layer's limit (here 0: none, which moves the
    logits as transformers' do without limits)."""
    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    _, path, ids, ref, _ = step35
    cases = [([0.3, -1.0, 0.3, 0.3], "gives layer 1 -1"), ([0.3, float("nan"), 0.3, 0.3], "gives layer 1 nan"),
             ([0.3, 0.3], "an array of at least 4 floats")]
    for i, (bad, msg) in enumerate(cases):
        p = tmp_path / f"bad{i}.gguf"
        shutil.copy(path, p)
        rewrite_with_kv(str(p), {"step35.swiglu_clamp_shexp": bad})
        with pytest.raises(rm.errors.FormatError, match=f"'step35.swiglu_clamp_shexp' {msg}" if i < 2 else msg):
            rm.Model(p, n_ctx=16, n_threads=1)
    p = tmp_path / "scalar.gguf"
    shutil.copy(path, p)
    rewrite_with_kv(str(p), {"step35.swiglu_clamp_shexp": 0.0, "step35.swiglu_clamp_exp": 0.0})
    assert _rel(_run(p, ids), ref) > 1e-2   # no limits: the logits move past the budget


def test_step35_llama3_rope_scaling(tmp_path):
    """The released config's llama3 RoPE scaling (transformers scales the full layers only) becomes
    rope_freqs, frequency divisors over the full layers' rotary pairs, as llama.cpp's converter
    writes it; our file gives transformers' logits past the original context. (llama.cpp's
    converter stops on this config here: loading its tokenizer through transformers 5.23 with the
    unknown model_type it needs and a rope_scaling key raises AttributeError
    'max_position_embeddings'.)"""
    scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    ref = make_tiny_step35(tmp_path / "hf", rope_scaling=scaling)
    ids = np.random.default_rng(6).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    want = ref(ids)
    ours = tmp_path / "ours.gguf"
    rm.convert(tmp_path / "hf", ours, recipe="f32", progress=False)
    import gguf

    div = next(np.asarray(t.data) for t in gguf.GGUFReader(str(ours)).tensors if t.name == "rope_freqs.weight")
    # the fastest pair between the bounds (smoothed), the slower ones divided by the factor, the padding 1
    assert div.shape == (8,) and 1.0 < div[0] < 4.0 and np.all(div[1:4] == 4.0) and np.all(div[4:] == 1.0), div
    assert _rel(_run(ours, ids), want) < 1e-4
    without = make_tiny_step35(tmp_path / "plain", rope_scaling=None)
    assert _rel(without(ids), want) > 1e-2   # the scaling moves transformers' logits
