"""deepseek4 (DeepSeek-V4-Flash, transformers' DeepseekV4ForCausalLM): the converter writes
llama.cpp's keys and tensors, the loader reads them, and the forward pass (manifold-constrained
hyper-connections, attention with one key-value head over a sliding window, the CSA/HCA compressors
and CSA's lightning indexer, sinks, the grouped output, hash routing, clamped SwiGLUs) gives
transformers' logits.

Tiny random checkpoint made at test time: 4 layers, sliding-only, CSA (ratio 4), HCA (ratio 128),
CSA; the first hash-routed; 2 residual streams; every kind of tensor present; a window of 8 and an
indexer keeping 3 entries, so that 300 positions go past both and past one HCA window of 128.

Oracles: transformers' DeepseekV4ForCausalLM on the same checkpoint (f32); llama.cpp's names and
shapes (its loader, src/models/deepseek4.cpp's load_arch_tensors in llama-cpp-python 0.3.36,
restated here as data) and the checkpoint's own values. llama.cpp's converter does not take a
transformers checkpoint of DeepSeek-V4 (see test_deepseek4_llama_cpp_converter_needs_the_released_form),
so no llama.cpp-made file is compared.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import llamacpp_oracle as llamacpp
import rapidmoe_gguf as rm
from conftest import VOCAB, assert_convert_refuses, logit_rel, make_tiny_tokenizer, state_round_trip

LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
               "compressed_sparse_attention"]
RATIOS = [0, 4, 128, 4]
E, H, HD, ROT, QL, G, OR, HC, NIH, IHD, NE, NU, FF = 64, 4, 32, 8, 32, 2, 16, 2, 2, 16, 4, 2, 32


def make_tiny_deepseek4(out_dir, seed: int = 0, **overrides):
    """A tiny random DeepseekV4ForCausalLM checkpoint (f32), every parameter drawn away from zero."""
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    cfg = dict(vocab_size=VOCAB, hidden_size=E, moe_intermediate_size=FF, num_hidden_layers=4,
               num_attention_heads=H, num_key_value_heads=1, head_dim=HD, q_lora_rank=QL,
               num_experts_per_tok=NU, n_routed_experts=NE, n_shared_experts=1, layer_types=LAYER_TYPES,
               mlp_layer_types=["hash_moe", "moe", "moe", "moe"], hc_mult=HC, hc_sinkhorn_iters=5,
               sliding_window=8, o_groups=G, o_lora_rank=OR, index_n_heads=NIH, index_head_dim=IHD,
               index_topk=3, partial_rotary_factor=ROT / HD, max_position_embeddings=512, rms_norm_eps=1e-6,
               bos_token_id=0, eos_token_id=2, tie_word_embeddings=False)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**cfg)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or name.endswith(("position_bias", "sinks", ".base", "hc_base")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if "norm" in name
                        else 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for layer in model.model.layers:
            if layer.mlp.is_hash:   # a table of distinct experts per token id
                ids = torch.stack([torch.randperm(NE, generator=g)[:NU] for _ in range(VOCAB)])
                layer.mlp.gate.tid2eid.copy_(ids)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    make_tiny_tokenizer(out_dir)
    return model


@pytest.fixture(scope="module")
def deepseek4(tmp_path_factory):
    d = tmp_path_factory.mktemp("deepseek4")
    model = make_tiny_deepseek4(d / "hf")
    out = d / "model.gguf"
    rm.convert(d / "hf", out, recipe="f32", progress=False)
    return d / "hf", out, model


def _llama_cpp_tensors() -> dict[str, tuple[int, ...]]:
    """The tensors llama.cpp's deepseek4 loader creates for the tiny config, with their ne (its
    2-D attn_output_a, which it reshapes to {n_head*head_dim/g, o_lora_rank, g})."""
    t = {"token_embd.weight": (E, VOCAB), "output_norm.weight": (E,), "output.weight": (E, VOCAB),
         "output_hc_fn.weight": (HC * E, HC), "output_hc_base.weight": (HC,), "output_hc_scale.weight": (1,)}
    for i, ratio in enumerate(RATIOS):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": (E,), b + "attn_sinks.weight": (H,), b + "attn_q_a.weight": (E, QL),
                  b + "attn_q_a_norm.weight": (QL,), b + "attn_q_b.weight": (QL, H * HD), b + "attn_kv.weight": (E, HD),
                  b + "attn_kv_a_norm.weight": (HD,), b + "attn_output_a.weight": (H * HD // G, G * OR),
                  b + "attn_output_b.weight": (G * OR, E)})
        for k in ("attn", "ffn"):
            t.update({b + f"hc_{k}_fn.weight": (HC * E, (2 + HC) * HC), b + f"hc_{k}_base.weight": ((2 + HC) * HC,),
                      b + f"hc_{k}_scale.weight": (3,)})
        if ratio:
            coff = 2 if ratio == 4 else 1
            t.update({b + "attn_compressor_kv.weight": (E, coff * HD), b + "attn_compressor_gate.weight": (E, coff * HD),
                      b + "attn_compressor_ape.weight": (coff * HD, ratio), b + "attn_compressor_norm.weight": (HD,)})
        if ratio == 4:
            t.update({b + "indexer.proj.weight": (E, NIH), b + "indexer.attn_q_b.weight": (QL, NIH * IHD),
                      b + "indexer_compressor_kv.weight": (E, 2 * IHD), b + "indexer_compressor_gate.weight": (E, 2 * IHD),
                      b + "indexer_compressor_ape.weight": (2 * IHD, 4), b + "indexer_compressor_norm.weight": (IHD,)})
        t[b + "ffn_gate_inp.weight"] = (E, NE)
        t[b + ("ffn_gate_tid2eid.weight" if i == 0 else "exp_probs_b.bias")] = (NU, VOCAB) if i == 0 else (NE,)
        t.update({b + "ffn_norm.weight": (E,), b + "ffn_gate_exps.weight": (E, FF, NE), b + "ffn_up_exps.weight": (E, FF, NE),
                  b + "ffn_down_exps.weight": (FF, E, NE), b + "ffn_gate_shexp.weight": (E, FF),
                  b + "ffn_down_shexp.weight": (FF, E), b + "ffn_up_shexp.weight": (E, FF)})
    return t


def test_deepseek4_convert_writes_llama_cpp_tensors(deepseek4):
    """Every tensor llama.cpp's loader creates, of its shape, and no other; the integer table I32."""
    with rm.open_gguf(deepseek4[1]) as g:
        got = {n: tuple(t.ne) for n, t in g.tensors.items()}
        types = {n: t.type_name for n, t in g.tensors.items()}
    assert got == _llama_cpp_tensors()
    assert types["blk.0.ffn_gate_tid2eid.weight"] == "I32"


def test_deepseek4_convert_writes_llama_cpp_keys(deepseek4):
    from gguf import GGUFReader

    r = GGUFReader(str(deepseek4[1]))

    def kv(key):
        f = r.fields[f"deepseek4.{key}"]
        vals = [f.parts[i][0].item() for i in f.data]
        return vals if len(vals) > 1 else vals[0]

    want = {"attention.head_count_kv": 1, "attention.key_length": HD, "attention.value_length": HD,
            "rope.dimension_count": ROT, "attention.q_lora_rank": QL, "attention.sliding_window": 8,
            "expert_shared_count": 1, "expert_gating_func": 4, "expert_weights_norm": True, "hash_layer_count": 1,
            "attention.indexer.head_count": NIH, "attention.indexer.key_length": IHD, "attention.indexer.top_k": 3,
            "attention.output_group_count": G, "attention.output_lora_rank": OR,
            "attention.compress_ratios": RATIOS, "hyper_connection.count": HC,
            "hyper_connection.sinkhorn_iterations": 5, "embedding_length_out": HC * E,
            "swiglu_clamp_exp": [10.0] * 4, "swiglu_clamp_shexp": [10.0] * 4}
    assert {k: kv(k) for k in want} == want
    assert kv("attention.compress_rope_freq_base") == pytest.approx(160000.0)
    assert kv("hyper_connection.epsilon") == pytest.approx(1e-6)
    assert kv("expert_weights_scale") == pytest.approx(1.5)


def test_deepseek4_convert_keeps_the_values(deepseek4):
    """The grouped output, a compressor's gate biases, the mHC matrix and the hash table hold the
    checkpoint's values in llama.cpp's layout (the row-major HF matrix as ne = {in, out})."""
    from gguf import GGUFReader

    _, path, model = deepseek4
    r = {t.name: np.array(t.data) for t in GGUFReader(str(path)).tensors}
    layers = model.model.layers
    attn1 = layers[1].self_attn
    np.testing.assert_array_equal(r["blk.1.attn_output_a.weight"], attn1.o_a_proj.weight.detach().numpy())
    np.testing.assert_array_equal(r["blk.1.attn_compressor_ape.weight"],
                                  attn1.compressor.position_bias.detach().numpy())
    np.testing.assert_array_equal(r["blk.2.attn_compressor_ape.weight"],
                                  layers[2].self_attn.compressor.position_bias.detach().numpy())
    np.testing.assert_array_equal(r["blk.1.indexer.attn_q_b.weight"],
                                  attn1.compressor.indexer.q_b_proj.weight.detach().numpy())
    np.testing.assert_array_equal(r["blk.3.hc_ffn_fn.weight"], layers[3].ffn_hc.fn.detach().numpy())
    np.testing.assert_array_equal(r["output_hc_fn.weight"], model.model.hc_head.hc_fn.detach().numpy())
    np.testing.assert_array_equal(r["blk.0.ffn_gate_tid2eid.weight"], layers[0].mlp.gate.tid2eid.numpy())
    experts = layers[2].mlp.experts.gate_up_proj.detach().numpy()      # (experts, 2*ff, embd): gate rows, up rows
    np.testing.assert_array_equal(r["blk.2.ffn_gate_exps.weight"], experts[:, :FF])
    np.testing.assert_array_equal(r["blk.2.ffn_up_exps.weight"], experts[:, FF:])


N_TOK = 300


def untied_prompt(model, n: int = N_TOK):
    """Token ids (the first of seeds 1, 2, ... that serves) and transformers' logits over them, such
    that no token's indexer has a tie at the edge of its top k: an entry every head scores below
    zero scores exactly 0, and such ties are picked in an order torch.topk leaves open (seen: layer 3
    at position 27 of seed 1 with 2 indexer heads, four entries at 0 for the third place; layer 1 at
    position 298 of another checkpoint with 8). The k-th and (k+1)-th best scores of every token
    that sees more than k entries differ by 1e-4 or more."""
    import torch

    k = model.config.index_topk
    scorers = [layer.self_attn.compressor.indexer.scorer for layer in model.model.layers
               if layer.self_attn.compressor is not None and hasattr(layer.self_attn.compressor, "indexer")]
    for seed in range(1, 50):
        ids = torch.randint(3, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))
        scores = []
        hooks = [sc.register_forward_hook(lambda mod, inp, out: scores.append(out[0].numpy())) for sc in scorers]
        with torch.no_grad():
            ref = model(ids).logits[0].float().numpy()
        for h in hooks:
            h.remove()
        margins = [np.diff(np.sort(s[p, :(p + 1) // 4])[::-1][k - 1:k + 1])[0] for s in scores
                   for p in range(4 * (k + 1) - 1, n)]
        if -max(margins) >= 1e-4:
            return ids[0].tolist(), ref
    raise AssertionError("no prompt without a tie at the indexer's top k among 49 seeds")


@pytest.fixture(scope="module")
def deepseek4_run(tmp_path_factory):
    """(our f32 file, token ids, transformers' logits over them) of a checkpoint whose indexer has 8
    heads (fewer ties at 0 than 2: untied_prompt)."""
    d = tmp_path_factory.mktemp("deepseek4_run")
    model = make_tiny_deepseek4(d / "hf", index_n_heads=8)
    path = d / "model.gguf"
    rm.convert(d / "hf", path, recipe="f32", progress=False)
    ids, ref = untied_prompt(model)
    return path, ids, ref


def test_deepseek4_prefill_matches_transformers(deepseek4_run):
    """300 positions in steps of 64 (every HCA window and some CSA ones begun in one step and closed
    in the next), then the same at once."""
    path, ids, ref = deepseek4_run
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=64) as m:
        assert m.info["arch"] == "deepseek4" and m.cache_type_k == "f32"
        stepped = m.eval_logits(ids)
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=512) as m:
        whole = m.eval_logits(ids)
    assert logit_rel(stepped, ref) < 1e-4
    assert logit_rel(whole, ref) < 1e-4


def test_deepseek4_decode_matches_transformers(deepseek4_run):
    """A prompt of 5, then a token at a time to position 299: each window closed by a decoded token."""
    path, ids, ref = deepseek4_run
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=64) as m:
        first = m.eval_logits(ids[:5])
        rest = np.stack([m.eval([t]) for t in ids[5:]])
    assert logit_rel(first, ref[:5]) < 1e-4
    assert logit_rel(rest, ref[5:]) < 1e-4


def test_deepseek4_uneven_steps_match_transformers(deepseek4_run):
    """Calls of 7, 3, 11, 1, 130 ... tokens, every position's logits: windows begun and closed
    anywhere in a call."""
    path, ids, ref = deepseek4_run
    sizes, out, at = [7, 3, 11, 1, 130, 5, 2, 9], [], 0
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=256) as m:
        for k in sizes * 4:
            if at >= N_TOK:
                break
            out.append(rm.eval_batch([(m, ids[at:at + k])], all_logits=True)[0])
            at += k
    assert logit_rel(np.concatenate(out), ref[:at]) < 1e-4


def test_deepseek4_two_sessions_in_one_batch(deepseek4_run):
    """Two sessions (one past 128 positions, one not) in one evaluation, 3 tokens and 1, each on its
    own window and compressors."""
    path, ids, ref = deepseek4_run
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=64) as m:
        other = m.fork_session()
        m.eval(ids[:150])
        other.eval(ids[:30])
        a, b = rm.eval_batch([(m, ids[150:153]), (other, ids[30:31])], all_logits=True)
    assert logit_rel(a, ref[150:153]) < 1e-4
    assert logit_rel(b, ref[30:31]) < 1e-4


def test_deepseek4_state_round_trip(deepseek4_run, tmp_path):
    """A saved state holds the compressors' rings and entries: a session loaded from it continues bit
    for bit, past a CSA window's and the first HCA window's close."""
    path, ids, _ = deepseek4_run
    want, got, reusable = state_round_trip(path, ids[:126], ids[126:134], tmp_path / "s.bin", n_ctx=256)
    np.testing.assert_array_equal(got, want)
    assert reusable == 126   # the loaded prompt, all of it reusable


def test_deepseek4_truncate_within_the_rings(deepseek4_run):
    """Going back a few positions keeps what the window and the compressors need (the evaluation
    after it matches transformers); going back past a compressor's ring is refused by name and
    leaves the session as it was."""
    path, ids, ref = deepseek4_run
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=16) as m:
        m.eval(ids[:140])
        m.truncate(137)
        again = rm.eval_batch([(m, ids[137:145])], all_logits=True)[0]
        assert logit_rel(again, ref[137:145]) < 1e-4
        assert m._reusable(ids[:10]) == 0
        with pytest.raises(rm.StateError, match="layer 1's compressor keeps the rows of its last windows only, and "
                                                "cannot go back from 145 to 137"):
            m.truncate(137)   # window 34 (136..139) overlaps window 33 (132..135): 13 positions back, the ring holds 8
        assert m.n_past == 145
        assert logit_rel(rm.eval_batch([(m, ids[145:150])], all_logits=True)[0], ref[145:150]) < 1e-4


def test_deepseek4_compress_yarn_matches_transformers(tmp_path):
    """YaRN on the compressed layers (the released config's factor 16 over 65536 positions, here 4
    over 64, so that 300 positions run past it), without YaRN's magnitude (transformers sets its
    attention_factor to 1); the sliding layers' RoPE plain. Written in the rope.scaling keys."""
    from gguf import GGUFReader

    rot = ROT / HD
    rope = {"main": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": rot},
            "compress": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "rope_theta": 1.6e5, "partial_rotary_factor": rot, "attention_factor": 1.0}}
    model = make_tiny_deepseek4(tmp_path / "hf", index_n_heads=8, rope_parameters=rope)
    path = tmp_path / "m.gguf"
    rm.convert(tmp_path / "hf", path, recipe="f32", progress=False)
    f = GGUFReader(str(path)).fields
    assert bytes(f["deepseek4.rope.scaling.type"].parts[-1]).decode() == "yarn"
    assert f["deepseek4.rope.scaling.factor"].parts[-1][0] == 4.0
    assert f["deepseek4.rope.scaling.original_context_length"].parts[-1][0] == 64
    # a released config's form: the thetas at the top and YaRN as rope_scaling, which transformers
    # reads as the compressed layers' (its attention_factor 1): the same keys
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    del cfg["rope_parameters"]
    cfg.update(rope_theta=1e4, compress_rope_theta=1.6e5, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1})
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    rm.convert(tmp_path / "hf", tmp_path / "flat.gguf", recipe="f32", progress=False)
    g = GGUFReader(str(tmp_path / "flat.gguf")).fields
    for key in ("rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.yarn_beta_fast",
                "rope.scaling.yarn_beta_slow", "rope.freq_base", "attention.compress_rope_freq_base"):
        assert g["deepseek4." + key].parts[-1][0] == f["deepseek4." + key].parts[-1][0], key
    ids, ref = untied_prompt(model)
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=64) as m:
        first = m.eval_logits(ids[:290])
        rest = np.stack([m.eval([t]) for t in ids[290:]])
    assert logit_rel(first, ref[:290]) < 1e-4
    assert logit_rel(rest, ref[290:]) < 1e-4
    plain = tmp_path / "plain.gguf"   # the same file read without YaRN is off: the keys are what carry it
    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    shutil.copy(path, plain)
    rewrite_with_kv(str(plain), {"deepseek4.rope.scaling.factor": 1.0})
    with rm.Model(plain, n_ctx=512, n_threads=2, n_batch=64) as m:
        assert logit_rel(m.eval_logits(ids[:290]), ref[:290]) > 1e-2


def test_deepseek4_resplit_pair(deepseek4_run, tmp_path):
    """A RESplit pair (Q4_0 experts and their Q4_0 residual, Q8_0 elsewhere): with every residual
    nearer the Q8_0 file (the same types but the experts') than its base alone (measured mean
    relative 0.098 against 0.34; the Q8_0 file is 0.15 from the f32 one: the random hyper-connection
    weights amplify the rounding, and the indexer's picks flip with it)."""
    path, ids, _ = deepseek4_run
    hf = path.parent / "hf"
    q8, pair = tmp_path / "q8.gguf", tmp_path / "pair.gguf"
    rm.convert(hf, q8, recipe="q8_0", progress=False)
    rm.convert(hf, pair, recipe="q4_0-q4_0", progress=False)

    def run(p, **kw):
        with rm.Model(p, n_ctx=256, n_threads=2, **kw) as m:
            return m.eval_logits(ids[:200])

    exact = run(q8)
    base, full = _per_row(run(pair, residual_policy="none"), exact), _per_row(run(pair, residual_policy="all"), exact)
    print("mean rel", base.mean(), full.mean())
    assert full.mean() < 0.5 * base.mean()


def test_deepseek4_plan_counts_the_compressors(deepseek4_run):
    """The planner's sizes (rm_session_sizes) count each compressed layer's entries and its rows of
    the last windows, as dsv4.c allocates them; a GPU budget is refused by name (the layers run on
    the CPU backend only)."""
    import dataclasses

    from rapidmoe_gguf import planner

    s = planner.ModelSizes.from_files(deepseek4_run[0])
    assert (s.n_layer_csa, s.n_layer_hca, s.hc_count) == (2, 1, HC)
    kv = planner.session_device_bytes(s, 512, 64, upload_residuals=False)["kv_cache"]
    flat = planner.session_device_bytes(dataclasses.replace(s, n_layer_csa=0, n_layer_hca=0), 512, 64,
                                        upload_residuals=False)["kv_cache"]
    csa = (512 // 4 + 1) * (HD + IHD) + 2 * 8 * (2 * HD + 2 * IHD)   # entries; two windows' kv and gate rows
    hca = (512 // 128 + 1) * HD + 2 * 128 * HD
    assert kv - flat == 4 * (2 * csa + hca)
    with pytest.raises(planner.PlanError, match="hyper-connections .*run on the CPU backend only"):
        planner.plan(s, "8GiB", 512)


def test_deepseek4_refusals_by_name(deepseek4, tmp_path):
    """A KV cache type other than F32, and a hash table naming an expert the layer lacks."""
    with pytest.raises(rm.UnsupportedError, match="deepseek4 keeps its window's keys in F32 only"):
        rm.Model(deepseek4[1], n_ctx=64, n_threads=2, cache_type_k="f16")
    from gguf import GGUFReader

    bad = shutil.copy(deepseek4[1], tmp_path / "m.gguf")
    t = next(t for t in GGUFReader(str(bad), "r+").tensors if t.name == "blk.0.ffn_gate_tid2eid.weight")
    t.data[5, 1] = NE
    del t
    with pytest.raises(rm.FormatError, match=f"blk.0.ffn_gate_tid2eid.weight names expert {NE} for token 5: the layer "
                                             f"has {NE} experts"):
        rm.Model(bad, n_ctx=64, n_threads=2)


@pytest.mark.parametrize("kv, error, words", [
    ({"deepseek4.attention.compress_ratios": [0, 4, 8, 4]}, rm.UnsupportedError,
     "gives layer 2 the ratio 8: the layers compress by 0, 4 or 128"),
    ({"deepseek4.attention.compress_ratios": [0, 4]}, rm.FormatError,
     "'deepseek4.attention.compress_ratios' must be an array of 32-bit integers of at least block_count"),
    ({"deepseek4.expert_gating_func": 2}, rm.UnsupportedError, r"DeepSeek-V4 routes by sqrt\(softplus\)"),
])
def test_deepseek4_file_refused_by_name(deepseek4, tmp_path, kv, error, words):
    from rapidmoe_gguf.gguf_rewrite import rewrite_with_kv

    path = shutil.copy(deepseek4[1], tmp_path / "m.gguf")
    rewrite_with_kv(str(path), kv)
    with pytest.raises(error, match=words):
        rm.Model(path, n_ctx=64, n_threads=2)


@pytest.mark.parametrize("change, error, words", [
    ({"quantization_config": {"quant_method": "fp8"}}, rm.UnsupportedError, "quantized checkpoint .*fp8"),
    ({"compress_rates": {"compressed_sparse_attention": 2, "heavily_compressed_attention": 128}},
     rm.UnsupportedError, "compress by 4 .* and 128"),
    ({"scoring_func": "softmax"}, rm.UnsupportedError, "scoring_func 'softmax'"),
    ({"mlp_layer_types": ["moe", "hash_moe", "moe", "moe"]}, rm.UnsupportedError, "only leading hash_moe layers"),
    ({"rope_parameters": {"main": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4},
                          "compress": {"rope_type": "default", "rope_theta": 1.6e5}}},
     rm.UnsupportedError, "main RoPE 'yarn' is not supported"),
    ({"rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4},
                          "compress": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1.6e5}}},
     rm.UnsupportedError, r"compress YaRN with attention_factor None: .*1 only"),
    ({"rope_parameters": {"main": {"rope_type": "default", "rope_theta": 1e4},
                          "compress": {"rope_type": "longrope", "rope_theta": 1.6e5}}},
     rm.UnsupportedError, r"compress RoPE 'longrope' is not supported \(default or yarn\)"),
])
def test_deepseek4_config_refused_by_name(deepseek4, tmp_path, change, error, words):
    assert_convert_refuses(deepseek4[0], tmp_path, change, error, words)


def _per_row(a, b):
    return np.abs(a - b).max(-1) / np.abs(b).max(-1)


@llamacpp.needs
def test_deepseek4_llama_cpp_runs_our_file(tmp_path):
    """llama.cpp 0.3.36 reads our f32 file of a checkpoint of the shapes its graph takes (4 streams,
    rotary half of a 128-wide head, the indexer's heads as wide; it stops on an assertion with 2
    streams) and gives transformers' logits over 200 positions, past the window of 128, the indexer's
    16 and an HCA window, as we do. On the Q8_0 file its quantizer makes of it (which quantizes the
    compressors' gate biases too: we read them as floats) we are as near transformers as it is."""
    model = make_tiny_deepseek4(tmp_path / "hf", index_n_heads=8, hc_mult=4, head_dim=128, partial_rotary_factor=0.5,
                                index_head_dim=128, num_attention_heads=8, o_groups=4, sliding_window=128,
                                index_topk=16)
    path = tmp_path / "m.gguf"
    rm.convert(tmp_path / "hf", path, recipe="f32", progress=False)
    ids, ref = untied_prompt(model, 200)
    with rm.Model(path, n_ctx=256, n_threads=2) as m:
        ours = m.eval_logits(ids)
    theirs = llamacpp.logits(path, ids, tmp_path, n_ctx=256)
    print("llama.cpp vs transformers", logit_rel(theirs, ref), "ours", logit_rel(ours, ref))
    assert logit_rel(ours, ref) < 1e-4
    assert logit_rel(theirs, ref) < 1e-4
    q8 = llamacpp.quantize(path, tmp_path / "q8_0.gguf", "Q8_0")
    with rm.Model(q8, n_ctx=256, n_threads=2) as m:
        ours_q8 = m.eval_logits(ids)
    theirs_q8 = llamacpp.logits(q8, ids, tmp_path, n_ctx=256)
    # per position, max |a - b| / max |b|: Q8_0's rounding, which these tiny random weights amplify
    # (seen: both engines 0.04 from transformers at the median, 0.45 at worst), is no misread tensor
    ours_hf, theirs_hf, apart = _per_row(ours_q8, ref), _per_row(theirs_q8, ref), _per_row(ours_q8, theirs_q8)
    print("Q8_0 medians: ours-transformers", np.median(ours_hf), "llama.cpp-transformers", np.median(theirs_hf),
          "ours-llama.cpp", np.median(apart))
    assert np.median(ours_hf) < 1.2 * np.median(theirs_hf)
    assert np.median(apart) < np.median(theirs_hf)


@llamacpp.needs
def test_deepseek4_llama_cpp_converter_needs_the_released_form(deepseek4, tmp_path):
    """llama.cpp 0.3.36's converter reads DeepSeek-V4's released layout only: config keys that
    transformers' DeepseekV4Config does not save (num_hash_layers, compress_ratios), tensor names
    without transformers' "model." and MXFP4 experts with their scales. On a transformers checkpoint
    it stops at the first; when it converts one, compare its file with ours here."""
    with pytest.raises(AssertionError, match="KeyError: 'num_hash_layers'"):
        llamacpp.convert(deepseek4[0], tmp_path / "llama.gguf", pre="qwen2")
