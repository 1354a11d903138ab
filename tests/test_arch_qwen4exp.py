"""qwen4exp (Qwen3.8-Flash-Next, transformers' Qwen4ExpForCausalLM): Qwen3.5-MoE's Gated DeltaNet
layers, routed experts and gated shared expert, with hyper-connections in place of every norm: the
residual is hc_count streams, each block's input their gated mean, its output added to each stream
with the stream's own weight, and the output's norm a last such mixer.

Tiny random checkpoints made at test time: 3 Gated DeltaNet layers (2 key heads, 4 value heads),
3 residual streams of a low rank of 8, every norm's gamma away from 1; the same with
output_gate_type sigmoid (the gated norm's gate, silu by default); and one of 4 layers, Gated
DeltaNet and QSA attention alternating (see test_qwen4exp_qsa_matches_transformers); and ones with PLE
(per-layer n-gram embeddings) on two of the 3 layers, or on one (what llama.cpp's converter takes),
with eos tokens inside the prompt that cut the n-grams (see test_qwen4exp_ple_matches_transformers).

Oracles and budgets:
- transformers (f32): our logits within 1e-4 relative (max |diff| / max |logit| per position) over a
  40-token prefill and 6 decode steps (measured 1.6e-6 and 2.0e-6; with the sigmoid gate 2.3e-6
  and 2.3e-6);
- llama.cpp's converter on the same checkpoint (when its source is at hand): its file runs in our
  engine within 1e-5 relative of our own file's logits (measured 1.9e-6 from transformers), so both
  converters write the same layout. llama.cpp's engine itself stops on a file without attention
  layers (GGML_ASSERT(buffer) in ggml-backend.cpp, llama-cpp-python 0.3.36), so it is no oracle here.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import rapidmoe_gguf as rm
import llamacpp_oracle as llamacpp
from conftest import VOCAB, make_tiny_tokenizer
from conftest import logit_rel as _rel
from conftest import assert_convert_refuses, state_round_trip
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


def converted_tiny(tmp_path_factory, name, ids_seed, eos_at=(), **kw):
    """A tiny checkpoint (make_tiny_qwen4exp's keywords) converted to f32: (checkpoint dir, our
    file, token ids (the eos token, 2, at the positions eos_at), transformers' logits)."""
    import torch

    d = tmp_path_factory.mktemp(name)
    model = make_tiny_qwen4exp(d / "hf", **kw)
    out = d / "model.gguf"
    rm.convert(d / "hf", out, recipe="f32", progress=False)
    ids = np.random.default_rng(ids_seed).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    for p in eos_at:
        ids[p] = 2
    with torch.no_grad():
        ref = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    return d / "hf", out, ids, ref


def two_sessions_in_one_batch(path, ids, ref, at_a: int, at_b: int) -> None:
    """Two sessions of the file at path, one after ids[:at_a] and one after ids[:at_b], evaluated in
    one step (eval_batch), a chunk of 3 tokens and a single token: each within 1e-4 relative of
    transformers' logits ref."""
    with rm.Model(path, n_ctx=64, n_threads=2) as m:
        other = m.fork_session()
        m.eval(ids[:at_a])
        other.eval(ids[:at_b])
        a, b = rm.eval_batch([(m, ids[at_a:at_a + 3]), (other, ids[at_b:at_b + 1])], all_logits=True)
    assert _rel(a, ref[at_a:at_a + 3]) < 1e-4
    assert _rel(b, ref[at_b:at_b + 1]) < 1e-4


@pytest.fixture(scope="module")
def qwen4exp(tmp_path_factory):
    """(checkpoint dir, our f32 file, token ids, transformers' logits)."""
    return converted_tiny(tmp_path_factory, "qwen4exp", 7)


def test_qwen4exp_hyper_connections_match_transformers(qwen4exp):
    hf, path, ids, ref = qwen4exp
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=64) as m:
        assert m.info["arch"] == "qwen4exp"
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    print("rel", _rel(first, ref[:N_PROMPT]), _rel(rest, ref[N_PROMPT:]))
    assert _rel(first, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4



def test_qwen4exp_resplit_pair(qwen4exp, tmp_path):
    """A RESplit pair (Q4_0 experts and their Q4_0 residual, Q8_0 elsewhere): with every residual
    nearer the Q8_0 file (the same types but the experts') than its base alone (measured mean
    relative 0.016 against 0.039; the Q8_0 file is 0.043 from the f32 one: this random checkpoint's
    wide hyper-connection gates amplify the activations' rounding). The hyper-connections' rows
    (hc_count * n_embd = 192) are wider than any other product's input here, as in the released
    model (8192 against 4096): a whole batch's quantized activations take them."""
    hf, path, ids, ref = qwen4exp
    q8, pair = tmp_path / "q8.gguf", tmp_path / "pair.gguf"
    rm.convert(hf, q8, recipe="q8_0", progress=False)
    rm.convert(hf, pair, recipe="q4_0-q4_0", progress=False)

    def run(p, **kw):
        with rm.Model(p, n_ctx=64, n_batch=len(ids), n_threads=2, **kw) as m:
            return m.eval_logits(ids)

    exact = run(q8)
    mean_rel = lambda a: (np.abs(a - exact).max(-1) / np.abs(exact).max(-1)).mean()   # noqa: E731
    base, full = mean_rel(run(pair, residual_policy="none")), mean_rel(run(pair, residual_policy="all"))
    print("mean rel", base, full)
    assert full < 0.5 * base

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


# ---- the sigmoid output gate ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen4exp_sigmoid(tmp_path_factory):
    """The tiny checkpoint with output_gate_type sigmoid: the Gated DeltaNet's gated norm
    rmsnorm(o) * w * sigmoid(z). (checkpoint dir, our f32 file, token ids, transformers' logits)."""
    return converted_tiny(tmp_path_factory, "qwen4exp_sigmoid", 8, seed=1, output_gate_type="sigmoid")


def test_qwen4exp_sigmoid_gate_matches_transformers(qwen4exp_sigmoid, tmp_path):
    """The converter writes rapidmoe.ssm.output_gate_func 2 and the layers gate by sigmoid: prefill and
    decode within 1e-4 relative of transformers. The same file read as silu is far off, so the
    key is what the logits follow."""
    import shutil

    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    hf, path, ids, ref = qwen4exp_sigmoid
    with rm.open_gguf(path) as g:
        assert g.metadata["rapidmoe.ssm.output_gate_func"] == 2
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=64) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    print("rel", _rel(first, ref[:N_PROMPT]), _rel(rest, ref[N_PROMPT:]))
    assert _rel(first, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4
    silu = shutil.copy(path, tmp_path / "silu.gguf")
    rewrite_with_kv(str(silu), {"rapidmoe.ssm.output_gate_func": 1})
    with rm.Model(silu, n_ctx=64, n_threads=2) as m:
        wrong = m.eval_logits(ids[:N_PROMPT])
    print("as silu", _rel(wrong, ref[:N_PROMPT]))
    assert _rel(wrong, ref[:N_PROMPT]) > 1e-2


def test_qwen4exp_silu_gate_written(qwen4exp):
    """A checkpoint without output_gate_type gates by hidden_act (silu): the file says 1."""
    with rm.open_gguf(qwen4exp[1]) as g:
        assert g.metadata["rapidmoe.ssm.output_gate_func"] == 1


@pytest.mark.parametrize("value, error", [(3, rm.UnsupportedError), (17, rm.FormatError)])
def test_qwen4exp_bad_gate_file_refused_by_name(qwen4exp_sigmoid, tmp_path, value, error):
    """A file whose output gate is neither silu (1) nor sigmoid (2) is refused at load, by the key's name."""
    import shutil

    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    path = shutil.copy(qwen4exp_sigmoid[1], tmp_path / "m.gguf")
    rewrite_with_kv(str(path), {"rapidmoe.ssm.output_gate_func": value})
    with pytest.raises(error, match="output_gate_func"):
        rm.Model(path, n_ctx=64, n_threads=2)


def test_qwen4exp_bad_gate_config_refused_by_name(qwen4exp_sigmoid, tmp_path):
    """An output gate the layers do not run (neither silu nor sigmoid) is refused by name at conversion."""
    assert_convert_refuses(qwen4exp_sigmoid[0], tmp_path, {"output_gate_type": "gelu"}, rm.UnsupportedError,
                           "output gate 'gelu'")


# ---- QSA attention -------------------------------------------------------------------------------

QSA_BUDGET, QSA_RATIO = 8, 4


def make_tiny_qwen4exp_qsa(out_dir, seed: int = 0, **overrides):
    """4 layers, a QSA layer after each Gated DeltaNet layer: an indexer of 4 heads of 32 keeping
    QSA_BUDGET // QSA_RATIO blocks of QSA_RATIO positions and the tail. The indexer's projection is
    drawn wide, so that its scores' gaps stand well above rounding."""
    import json

    import torch
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
               max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
               eos_token_id=2, pad_token_id=0, hc_count=3, hc_lowrank=8,
               layer_types=["linear_attention", "indexed_attention"] * 2,
               rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
               indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=QSA_BUDGET,
               indexer_compress_ratio=QSA_RATIO)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(Qwen4ExpTextConfig(**cfg)).eval()
    init_hybrid_weights(model, seed, norm_std=0.2, stds=(("input_mix_weight", 0.3), ("block_inject", 0.3),
                                                          ("index_qk_proj", 0.5), ("self_attn.q_proj", 0.15),
                                                          ("self_attn.k_proj", 0.15)))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    make_tiny_tokenizer(out_dir)
    # transformers keeps the pattern in layer_types alone; the real checkpoint's config also says it
    # as full_attention_interval and names its QSA layers full_attention
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["full_attention_interval"] = 2
    config["layer_types"] = ["linear_attention", "full_attention"] * 2
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return model


def _qsa_reference(model, ids):
    """transformers' logits (use_cache=False), and per QSA layer what its indexer did for each token:
    the positions kept, and the gap between the last block kept and the best block dropped (the
    scores recomputed from the indexer's own inputs, in float64)."""
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import apply_rotary_pos_emb

    seen = []

    def hook(mod, args, out):
        hidden, (cos, sin) = args[0], args[1]
        n_q = mod.index_n_heads * mod.index_head_dim
        qk = mod.index_qk_proj(hidden)[0]
        q = mod.q_layernorm(qk[:, :n_q].reshape(len(ids), -1, mod.index_head_dim))
        q = apply_rotary_pos_emb(q, cos=cos[0], sin=sin[0], unsqueeze_dim=1).double()
        raw, r = qk[:, n_q:], mod.compress_ratio
        gaps = []
        for p in range(len(ids)):
            nb = (p + 1) // r
            if nb <= mod.block_topk:
                continue
            keys = mod.k_layernorm(raw[: nb * r].reshape(nb, r, -1).mean(1))
            starts = torch.arange(nb) * r
            keys = apply_rotary_pos_emb(keys[:, None], cos=cos[0, starts], sin=sin[0, starts])[:, 0].double()
            scores = torch.relu(q[p] @ keys.T).sum(0) / mod.index_head_dim ** 0.5
            best = scores.sort(descending=True).values
            gaps.append(float(best[mod.block_topk - 1] - best[mod.block_topk]))
        causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
        seen.append(((out[0, 0] & causal).sum(-1).numpy(), np.array(gaps)))

    handles = [m.register_forward_hook(hook) for m in model.modules() if type(m).__name__ == "Qwen4ExpTextQSAIndexer"]
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    finally:
        for h in handles:
            h.remove()
    return logits, seen


@pytest.fixture(scope="module")
def qwen4exp_qsa(tmp_path_factory):
    """(checkpoint dir, our f32 file, token ids, transformers' logits, what its indexers did)."""
    d = tmp_path_factory.mktemp("qwen4exp_qsa")
    model = make_tiny_qwen4exp_qsa(d / "hf", seed=2)   # a draw whose picks have no near ties
    out = d / "model.gguf"
    rm.convert(d / "hf", out, recipe="f32", progress=False)
    ids = np.random.default_rng(13).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    ref, seen = _qsa_reference(model, ids)
    return d / "hf", out, ids, ref, seen


def test_qwen4exp_qsa_matches_transformers(qwen4exp_qsa):
    """QSA attention against transformers (f32): logits within 1e-4 relative over a 40-token prefill
    and 6 decode steps, one token per call, at a context of 46 positions, well past the indexer's
    budget of 8 (2 blocks of 4, and the tail): from position 11 on, a token keeps at most 11 of the
    positions it sees. transformers keeps whole blocks and the tail; llama.cpp's graph keeps
    budget + ratio - 1 positions however the tail falls, which differs; we follow transformers. The
    drawn checkpoint's picks have no near ties (the gap at the boundary is checked), so the result
    does not hang on how either side breaks them. Measured: 1.4e-6 (prefill), 1.9e-6 (decode), 1.9e-6
    (every token a step of its own)."""
    hf, path, ids, ref, seen = qwen4exp_qsa
    assert len(seen) == 2
    for kept, gaps in seen:
        late = np.arange(len(ids)) >= 2 * QSA_BUDGET
        assert (kept[late] < np.arange(len(ids))[late] + 1).all()   # blocks were dropped
        assert (kept <= QSA_BUDGET + QSA_RATIO - 1).all()
        assert gaps.min() > 1e-3, gaps.min()
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=64) as m:
        assert m.info["arch"] == "qwen4exp"
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=64) as m:   # every token a step of its own
        single = np.stack([m.eval([t]) for t in ids])
    print("rel", _rel(first, ref[:N_PROMPT]), _rel(rest, ref[N_PROMPT:]), _rel(single, ref))
    assert _rel(first, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4
    assert _rel(single, ref) < 1e-4


def test_qwen4exp_qsa_rope_whole_head_by_default(tmp_path):
    """transformers' Qwen4ExpTextConfig rotates the whole head when rope_parameters name no
    partial_rotary_factor (Qwen3.5's default is a quarter), and so does our converter's file: logits
    within 1e-4 relative of transformers' until the first token that drops a block."""
    import torch

    model = make_tiny_qwen4exp_qsa(tmp_path / "hf", seed=2, rope_parameters=dict(rope_type="default",
                                                                                   rope_theta=10000.0))
    rm.convert(tmp_path / "hf", tmp_path / "m.gguf", recipe="f32", progress=False)
    dense = (QSA_BUDGET // QSA_RATIO + 1) * QSA_RATIO - 1
    ids = np.random.default_rng(13).integers(3, VOCAB, dense).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    with rm.Model(tmp_path / "m.gguf", n_ctx=64, n_threads=2) as m:
        assert _rel(m.eval_logits(ids), ref) < 1e-4


def test_qwen4exp_qsa_sequences_in_one_batch(qwen4exp_qsa):
    """Two sessions past the budget in one evaluation (eval_batch), a chunk of 3 tokens and a single
    token: each picks from its own indexer keys, within 1e-4 relative of transformers."""
    hf, path, ids, ref, seen = qwen4exp_qsa
    two_sessions_in_one_batch(path, ids, ref, 30, 20)


@pytest.mark.parametrize("change, error, words", [
    (dict(indexer_kv_heads=2), rm.UnsupportedError, "2 key heads"),
    (dict(indexer_budget=None), rm.FormatError, "indexer_budget"),
])
def test_qwen4exp_qsa_config_refused_by_name(qwen4exp_qsa, tmp_path, change, error, words):
    """A QSA config the runtime cannot run, or that lacks the indexer's sizes, is refused by name."""
    assert_convert_refuses(qwen4exp_qsa[0], tmp_path, change, error, words)


@pytest.mark.parametrize("kv, words", [
    ({"qwen4exp.attention.compress_ratios": [0.0, 2.5, 0.0, 4.0]}, "layer 1 is a QSA layer, and attention.compress_ratios gives it 2.5"),
    ({"qwen4exp.attention.indexer.head_count": 0}, "layer 1 is a QSA layer, and the indexer's keys give head_count 0"),
])
def test_qwen4exp_qsa_file_refused_by_name(qwen4exp_qsa, tmp_path, kv, words):
    """A file whose QSA layers have blocks of no whole length, or an indexer without heads, is
    refused by name at load."""
    import shutil

    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    path = shutil.copy(qwen4exp_qsa[1], tmp_path / "m.gguf")
    rewrite_with_kv(str(path), kv)
    with pytest.raises(rm.FormatError, match=words):
        rm.Model(path, n_ctx=64, n_threads=2)


def test_qwen4exp_qsa_kv_cache_bytes_count_the_indexer_keys(qwen4exp_qsa):
    """The KV cache's bytes (rm_session_sizes, as the planner reads them) count each QSA layer's
    indexer keys beside its K and V: 2 layers of 64 positions of K and V (2 kv heads of 32) and of a
    key of 32, all F32."""
    with rm.Model(qwen4exp_qsa[1], n_ctx=64, n_threads=2) as m:
        assert m.kv_cache_bytes == 2 * 64 * (2 * 2 * 32 + 32) * 4


def test_qwen4exp_qsa_state_round_trip(qwen4exp_qsa, tmp_path):
    """A saved state holds the QSA layers' indexer keys: a session loaded from it picks the blocks
    the one that saved it picks, bit for bit."""
    hf, path, ids, ref, seen = qwen4exp_qsa
    want, got, _ = state_round_trip(path, ids[:N_PROMPT], ids[N_PROMPT:], tmp_path / "s.state", n_ctx=64)
    assert np.array_equal(want, got)
    assert _rel(got, ref[N_PROMPT:]) < 1e-4


def test_qwen4exp_qsa_llama_cpp_file_runs_as_llama_cpp(qwen4exp_qsa, tmp_path):
    """llama.cpp's converter on the QSA checkpoint (its indexer's projection split into q_proj and
    k_proj, as ours): llama.cpp 0.3.36's converter writes each layer's compress ratio from the config's
    layer types as transformers loads them (indexed_attention) and so writes 0 for every layer, which
    llama.cpp's graph runs as dense attention; we read the file alike. So our engine on its file
    gives our own file's logits (and transformers') until the first token that drops a block
    (position 11), within 1e-5 and 1e-4 relative (measured 4.4e-7 and 1.7e-6). llama.cpp's engine
    (llama-cpp-python 0.3.36) on that file is off transformers from the first token (2.0 relative),
    so it is no oracle here."""
    hf, path, ids, ref, seen = qwen4exp_qsa
    if llamacpp.src() is None:
        pytest.skip("llama.cpp's converter is not at hand (LLAMA_CPP_SRC)")
    theirs = llamacpp.convert(hf, tmp_path / "llamacpp.gguf", "qwen35")
    with rm.Model(theirs, n_ctx=64, n_threads=2) as m, rm.Model(path, n_ctx=64, n_threads=2) as ours:
        assert m.info["arch"] == "qwen4exp"
        a = m.eval_logits(ids)
        b = ours.eval_logits(ids)
    dense = (QSA_BUDGET // QSA_RATIO + 1) * QSA_RATIO - 1   # the first token that drops a block
    print("rel", _rel(a[:dense], b[:dense]), _rel(a[:dense], ref[:dense]), _rel(a, ref))
    assert _rel(a[:dense], b[:dense]) < 1e-5
    assert _rel(a[:dense], ref[:dense]) < 1e-4


def test_qwen4exp_bench_model_loads_in_transformers_and_runs(tmp_path):
    """tools/make_bench_model.py --arch qwen4exp, at toy sizes: every tensor it writes is one
    transformers' Qwen4ExpForCausalLM loads (none missing, none unused), its config names the QSA
    layer full_attention as the released one does, and our converter's f32 file of it keeps the
    QSA layer (compress ratio 4) and runs within 1e-4 relative of transformers (measured 3.3e-7)."""
    import json
    import sys
    from pathlib import Path

    import gguf
    import torch
    from transformers.models.qwen4_exp import Qwen4ExpForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import make_bench_model

    assert make_bench_model.main([str(tmp_path), "--arch", "qwen4exp", "--experts", "12", "--hidden", "256",
                                  "--heads", "4", "--kv-heads", "1", "--head-dim", "64", "--vocab", "1000",
                                  "--tokenizer-size", "600", "--formats", ""]) == 0
    hf = tmp_path / "hf"
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] and cfg["num_experts_per_tok"] == 10
    model, info = Qwen4ExpForCausalLM.from_pretrained(hf, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    path = tmp_path / "bench-f32.gguf"
    rm.convert(hf, path, recipe="f32", progress=False)
    ratios = gguf.GGUFReader(str(path)).fields["qwen4exp.attention.compress_ratios"]
    assert [float(ratios.parts[i][0]) for i in ratios.data] == [0, 0, 0, 4]
    ids = [5, 17, 300, 42, 7, 99, 123, 8]
    with torch.no_grad():
        ref = model.eval()(torch.tensor([ids])).logits[0].numpy()
    with rm.Model(path, n_ctx=64, n_threads=2) as m:
        got = m.eval_logits(ids)
    print("rel", _rel(got, ref))
    assert _rel(got, ref) < 1e-4


# ---- PLE: per-layer n-gram embeddings -----------------------------------------------------------

# small n-gram heads (prime vocabularies from 97 on, the table in 2 shards as transformers saves it),
# a dilated conv of 3 taps (dilation 3: a state of 6 positions), eos tokens inside the prompt (where
# the n-grams are cut) and in the decoded tail
PLE = dict(ple_conv_kernel_size=3, ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=97,
           make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2)
PLE_EOS = (5, 6, 17, 30, 31, 42)


@pytest.fixture(scope="module")
def qwen4exp_ple(tmp_path_factory):
    """PLE on layers 1 and 3 of 3 (transformers' 1-based ple_layer_ids): (checkpoint dir, our f32
    file, token ids, transformers' logits)."""
    return converted_tiny(tmp_path_factory, "qwen4exp_ple", 9, eos_at=PLE_EOS, seed=3, ple_layer_ids=[1, 3], **PLE)


def _eval_steps(path, ids, steps):
    """ids fed in calls of the given sizes (cycled): our logits at the last position of each call,
    and those positions."""
    out, ends, at, i = [], [], 0, 0
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=64) as m:
        while at < len(ids):
            k = min(steps[i % len(steps)], len(ids) - at)
            out.append(m.eval(ids[at:at + k]))
            at, i = at + k, i + 1
            ends.append(at - 1)
    return np.stack(out), ends


def test_qwen4exp_ple_matches_transformers(qwen4exp_ple):
    """Two PLE layers against transformers (f32), the prompt holding eos tokens that cut the
    n-grams: logits within 1e-4 relative over a 40-token prefill and 6 decode steps, with every
    token a step of its own, in calls of 7, 3 and 11 tokens, and as one prefill in steps of 5 (the
    n-gram history and the conv's state cross the steps). The n-gram keys (the hash constants, the eos token) are what the logits
    follow: the file read with another eos token, or with one layer's multipliers changed, is far
    off (1.3 and 1.7 relative). Measured 6.1e-7 (prefill), 4.2e-7 (decode), 6.1e-7 (every token a step),
    4.0e-7 (calls of 7, 3 and 11), 6.1e-7 (steps of 5)."""
    import shutil

    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    hf, path, ids, ref = qwen4exp_ple
    with rm.open_gguf(path) as g:
        assert list(g.metadata["qwen4exp.ple.layers"]) == [0, 2]
        assert g.metadata["qwen4exp.ple.eos_token_id"] == 2
        mult = np.asarray(g.metadata["qwen4exp.ple.layer_multipliers"], dtype=np.uint64)
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=64) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    single, _ = _eval_steps(path, ids, [1])
    chunks, ends = _eval_steps(path, ids, [7, 3, 11])
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=5) as m:   # a prefill in steps of 5
        steps5 = m.eval_logits(ids)
    print("rel", _rel(first, ref[:N_PROMPT]), _rel(rest, ref[N_PROMPT:]), _rel(single, ref),
          _rel(chunks, ref[ends]), _rel(steps5, ref))
    assert _rel(first, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4
    assert _rel(single, ref) < 1e-4
    assert _rel(chunks, ref[ends]) < 1e-4
    assert _rel(steps5, ref) < 1e-4
    for name, kv in (("eos", {"qwen4exp.ple.eos_token_id": 3}),
                     ("mult", {"qwen4exp.ple.layer_multipliers": mult + np.uint64(2)})):
        other = shutil.copy(path, hf.parent / f"{name}.gguf")
        rewrite_with_kv(str(other), kv)
        with rm.Model(other, n_ctx=64, n_threads=2) as m:
            wrong = m.eval_logits(ids[:N_PROMPT])
        print(name, _rel(wrong, ref[:N_PROMPT]))
        assert _rel(wrong, ref[:N_PROMPT]) > 1e-3


def test_qwen4exp_ple_sequences_in_one_batch(qwen4exp_ple):
    """Two sessions in one evaluation (eval_batch), a chunk of 3 tokens and a single token, each on
    its own n-gram history and conv state: within 1e-4 relative of transformers."""
    hf, path, ids, ref = qwen4exp_ple
    two_sessions_in_one_batch(path, ids, ref, 30, 18)


def test_qwen4exp_ple_state_round_trip_and_reset(qwen4exp_ple, tmp_path):
    """A saved state holds the n-gram history and the PLE conv states: a session loaded from it
    continues bit for bit; a reset session starts over as a fresh one (its history emptied)."""
    hf, path, ids, ref = qwen4exp_ple
    want, got, _ = state_round_trip(path, ids[:N_PROMPT], ids[N_PROMPT:], tmp_path / "s.state", n_ctx=64)
    assert np.array_equal(want, got)
    assert _rel(got, ref[N_PROMPT:]) < 1e-4
    with rm.Model(path, n_ctx=64, n_threads=2) as m:
        m.eval(ids[10:25])
        m.reset()
        again = m.eval_logits(ids[:N_PROMPT])
    assert _rel(again, ref[:N_PROMPT]) < 1e-4


def test_qwen4exp_ple_state_counted_in_session_sizes():
    """rm_session_sizes' recurrent state counts PLE's: per PLE layer (kernel - 1) * ngram positions of
    hc_count * n_embd floats, and the ngram - 1 tokens, in the state and each of its 4 checkpoints."""
    from rapidmoe_gguf._native import ffi, lib

    def recurrent(**ple):
        p = ffi.new("rm_size_params *")
        p.struct_size = ffi.sizeof("rm_size_params")
        for k, v in dict(n_layer=3, n_embd=64, n_head=4, n_head_kv=2, head_dim=32, n_expert=4, n_expert_used=2,
                         n_ff_exp=32, n_vocab=128, n_ctx=64, n_batch=8, n_layer_linear=3, ssm_d_conv=4,
                         ssm_conv_dim=96, ssm_n_v=4, ssm_d_state=16, ssm_head_v=16, hc_count=3, hc_low_rank=8,
                         **ple).items():
            setattr(p, k, v)
        out = ffi.new("rm_session_sizes *")
        out.struct_size = ffi.sizeof("rm_session_sizes")
        assert lib.rm_session_sizes_get(p, out) == 0
        return out.recurrent_state

    plain = recurrent()
    with_ple = recurrent(n_layer_ple=2, ple_ngram=3, ple_conv_kernel=3, ple_embd=64)
    assert with_ple - plain == 5 * 4 * (2 * 2 * 3 * 3 * 64 + 2)



def test_qwen4exp_planner_reads_ple_and_hyper_sizes(qwen4exp_ple):
    """The planner's model sizes (ModelSizes.from_files) carry the hyper-connections' and PLE's
    fields as the loader reads them, so its session bytes count the streams' activations and the
    PLE state: the PLE layers' conv states and the tokens, as above."""
    from rapidmoe_gguf import planner

    hf, path, ids, ref = qwen4exp_ple
    s = planner.ModelSizes.from_files(path)
    assert (s.hc_count, s.hc_low_rank, s.n_layer_ple, s.ple_ngram) == (3, 8, 2, PLE["ngram_size"])
    with_ple = planner.session_device_bytes(s, 64, 8, upload_residuals=False)
    without = planner.session_device_bytes(dataclasses.replace(s, n_layer_ple=0), 64, 8, upload_residuals=False)
    per_layer = (s.ple_conv_kernel - 1) * s.ple_ngram * s.hc_count * s.n_embd
    assert with_ple["recurrent_state"] - without["recurrent_state"] == 5 * 4 * (2 * per_layer + s.ple_ngram - 1)
    flat = planner.session_device_bytes(dataclasses.replace(s, n_layer_ple=0, hc_count=0, hc_low_rank=0), 64, 8,
                                        upload_residuals=False)
    assert without["activations"] > flat["activations"]

@pytest.fixture(scope="module")
def qwen4exp_ple_one(tmp_path_factory):
    """PLE on layer 2 only, as llama.cpp supports it: (checkpoint dir, our f32 file, token ids,
    transformers' logits)."""
    return converted_tiny(tmp_path_factory, "qwen4exp_ple_one", 10, eos_at=PLE_EOS, seed=4, ple_layer_ids=[2],
                          **PLE)


def test_qwen4exp_ple_llama_cpp_file_matches_transformers(qwen4exp_ple_one, tmp_path):
    """llama.cpp's converter on a one-PLE-layer checkpoint: its file (the same keys and tensor names
    as ours, which the test checks) runs in our engine within 1e-4 relative of transformers over a
    prefill and decode steps, and within 1e-5 of our own file. Measured 6.6e-7 (prefill) and 4.7e-7
    (decode) from transformers, 2.2e-7 from ours."""
    hf, path, ids, ref = qwen4exp_ple_one
    if llamacpp.src() is None:
        pytest.skip("llama.cpp's converter is not at hand (LLAMA_CPP_SRC)")
    theirs = llamacpp.convert(hf, tmp_path / "llamacpp.gguf", "qwen35")
    with rm.open_gguf(theirs) as g, rm.open_gguf(path) as o:
        keys = {k for k in g.metadata if ".ple." in k or k.endswith("per_layer_input")}
        assert len(keys) == 9 and keys <= set(o.metadata)
        for k in keys:
            assert list(np.atleast_1d(g.metadata[k])) == list(np.atleast_1d(o.metadata[k])), k
        assert {t for t in g.tensors if "ple" in t or "per_layer" in t} == \
            {t for t in o.tensors if "ple" in t or "per_layer" in t}
    with rm.Model(theirs, n_ctx=64, n_threads=2, n_batch=64) as m, rm.Model(path, n_ctx=64, n_threads=2) as ours:
        assert m.info["arch"] == "qwen4exp"
        a = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
        b = ours.eval_logits(ids[:N_PROMPT])
    print("rel", _rel(a, ref[:N_PROMPT]), _rel(rest, ref[N_PROMPT:]), _rel(a, b))
    assert _rel(a, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4
    assert _rel(a, b) < 1e-5


def test_qwen4exp_ple_bf16_checkpoint(tmp_path):
    """A bf16 checkpoint with PLE layers (its hash constants int64 beside bf16 weights): our f32 file
    within 1e-4 relative of transformers on the same bf16 weights in f32 (measured 4.9e-7)."""
    import torch

    model = make_tiny_qwen4exp(tmp_path / "hf", seed=3, ple_layer_ids=[1, 3], **PLE).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "hf")
    rm.convert(tmp_path / "hf", tmp_path / "m.gguf", recipe="f32", progress=False)
    ids = np.random.default_rng(9).integers(3, VOCAB, N_PROMPT).tolist()
    for p in PLE_EOS[:-1]:
        ids[p] = 2
    with torch.no_grad():
        ref = model.float()(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    with rm.Model(tmp_path / "m.gguf", n_ctx=64, n_threads=2) as m:
        assert _rel(m.eval_logits(ids), ref) < 1e-4


def _copy_without(src, dst, key=None, tensor=None):
    """src written to dst without one key or one tensor."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", key):
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        w.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for t in r.tensors:
        if t.name != tensor:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("drop, kv, words", [
    (dict(key="qwen4exp.ple.ngram_size"), {}, "'qwen4exp.ple.ngram_size' is missing"),
    (dict(key="qwen4exp.ple.head_offsets"), {}, "'qwen4exp.ple.head_offsets' is missing"),
    (dict(key="qwen4exp.ple.layers"), {}, "'per_layer_token_embd.weight' is present but the file has no ple.layers"),
    (dict(tensor="blk.2.ple_conv1d.weight"), {}, "tensor 'blk.2.ple_conv1d.weight' is missing"),
    (dict(tensor="per_layer_token_embd.weight"), {}, "tensor 'per_layer_token_embd.weight' is missing"),
    ({}, {"qwen4exp.ple.layers": [2, 0]}, "lists layer 0 after 2"),
    ({}, {"qwen4exp.ple.layer_multipliers": np.array([3, 5], dtype=np.uint64)},
     "'qwen4exp.ple.layer_multipliers' is not such an array"),
    ({}, {"qwen4exp.ple.head_vocab_sizes": np.array([97, 101, 103, 10**6] * 2, dtype=np.uint64)},
     "past per_layer_token_embd.weight's"),
    ({}, {"qwen4exp.ple.ngram_size": 4}, "'qwen4exp.ple.layer_multipliers' is not such an array"),
    ({}, {"qwen4exp.embedding_length_per_layer_input": 8}, "tensor 'blk.0.ple_key.weight' has ne"),
])
def test_qwen4exp_ple_file_refused_by_name(qwen4exp_ple, tmp_path, drop, kv, words):
    """A file whose PLE keys or tensors are missing or do not fit together is refused at load, by
    the key's or the tensor's name."""
    import shutil

    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    path = qwen4exp_ple[1]
    if drop:
        path = _copy_without(path, tmp_path / "m.gguf", **drop)
    else:
        path = shutil.copy(path, tmp_path / "m.gguf")
        rewrite_with_kv(str(path), kv)
    with pytest.raises(rm.FormatError, match=words):
        rm.Model(path, n_ctx=64, n_threads=2)


@pytest.mark.parametrize("change, error, words", [
    (dict(ple_layer_ids=[2], layer_types=["linear_attention", "full_attention", "linear_attention"],
          full_attention_interval=2), rm.FormatError, r"ple_layer_ids \[2\] name no linear-attention layer"),
    (dict(eos_token_id=None), rm.FormatError, "need eos_token_id"),
    (dict(ngram_size=12), rm.UnsupportedError, "ngram_size 12"),
])
def test_qwen4exp_ple_config_refused_by_name(qwen4exp_ple, tmp_path, change, error, words):
    """A PLE config the runtime cannot run, or that lacks what PLE needs, is refused by name at
    conversion."""
    assert_convert_refuses(qwen4exp_ple[0], tmp_path, change, error, words)


def test_qwen4exp_ple_conv_in_f16_read_as_floats(qwen4exp_ple, tmp_path):
    """A file whose PLE conv taps were written in F16 (as llama.cpp's quantizer may write any 2-D
    tensor) runs: the loader makes F32 copies of the tensors the forward pass reads as floats. Its
    logits are the F32 file's within the taps' F16 rounding."""
    import gguf

    from conftest import write_gguf_like

    hf, path, ids, ref = qwen4exp_ple
    name = "blk.0.ple_conv1d.weight"
    conv = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}[name]
    data = np.asarray(conv.data, dtype=np.float32).astype(np.float16)
    write_gguf_like(path, tmp_path / "f16.gguf", {name: (data, gguf.GGMLQuantizationType.F16)})
    with rm.Model(path, n_ctx=64, n_threads=1) as m:
        f32 = m.eval_logits(ids[:N_PROMPT])
    with rm.Model(tmp_path / "f16.gguf", n_ctx=64, n_threads=1) as m:
        f16 = m.eval_logits(ids[:N_PROMPT])
    assert 0 < _rel(f16, f32) < 1e-2
