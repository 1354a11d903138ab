"""GLM-5 (llama.cpp's glm-dsa: DeepSeek-V3's latent attention with DeepSeek sparse attention) and
DeepSeek-V3.2 (deepseek32: the same, the indexer's RoPE in NEOX halves) against transformers'
GlmMoeDsaForCausalLM and DeepseekV32ForCausalLM, on tiny random checkpoints made here.

Each token that sees more than index_topk positions attends to the index_topk positions its
layer's lightning indexer scores best (sum over the indexer's heads of weight * relu(q . k)); the
prompts here run well past index_topk, as one batch (the expanded form for the tokens that see
everything, the picked positions for the rest), in batches of 5, and one token at a time. The
indexer has 16 heads so that no two positions tie on a score of exactly 0 (a token whose heads all
score a key below zero): transformers' topk breaks such ties in no stated order, ours takes the
earlier position. Oracle: transformers at f32, logits within 1e-4 of each position's largest.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import rapidmoe_gguf as rm
import llamacpp_oracle as llamacpp
from conftest import VOCAB as TINY_VOCAB, make_tiny_tokenizer, state_round_trip
from test_arch_deepseek import _kl, _rel, reference_logits

GLM_TOKENS = ["[gMASK]", "<|user|>", "<|observation|>"]
VOCAB = TINY_VOCAB + len(GLM_TOKENS)
N_PROMPT, N_DECODE = 32, 8

_BASE = dict(kv_lora_rank=40, qk_nope_head_dim=24, qk_rope_head_dim=8, v_head_dim=20, q_lora_rank=36,
             n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=52, n_shared_experts=2,
             intermediate_size=88, first_k_dense_replace=1, n_group=1, topk_group=1, routed_scaling_factor=1.8,
             norm_topk_prob=True, index_head_dim=16, index_n_heads=16)

CONFIGS = {
    # every layer its own indexer (GLM-5, 5.1), 8 positions kept
    "glm5": dict(_BASE, index_topk=8),
    # GLM-5.2's sharing: layers 1 and 3 take the positions layers 0 and 2 picked
    "glm5_shared": dict(_BASE, index_topk=12, num_hidden_layers=4, indexer_types=["full", "shared", "full", "shared"]),
    # latents and keys a multiple of 32 (the quantized cache types' blocks): 56 + 8, then 32
    "glm5_blocks": dict(_BASE, index_topk=10, kv_lora_rank=56, index_head_dim=32),
    # keys of 64: llama.cpp rotates the indexer's queries and keys by a Hadamard matrix of at least
    # 64 (llama_kv_cache::build_input_k_rot) and stops on narrower ones (GGML_ASSERT in ggml_mul_mat)
    "glm5_wide": dict(_BASE, index_topk=8, index_head_dim=64),
    "glm5_wide_shared": dict(_BASE, index_topk=12, index_head_dim=64, num_hidden_layers=4,
                             indexer_types=["full", "shared", "full", "shared"]),
    # DeepSeek-V3.2 (llama.cpp's deepseek32): the same sparse attention, the indexer's RoPE in NEOX halves
    "deepseek_v32": dict(_BASE, index_topk=8, index_head_dim=64),
}
# the transformers class of each (GlmMoeDsa where not named)
CLASSES = {"deepseek_v32": "DeepseekV32"}


def make_checkpoint(out, name: str, seed: int = 0, **overrides):
    import torch
    import transformers

    fields = {**dict(vocab_size=VOCAB, hidden_size=72, num_hidden_layers=3, num_attention_heads=3,
                     num_key_value_heads=3, max_position_embeddings=256, rms_norm_eps=1e-6,
                     tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=0),
              **CONFIGS[name], **overrides}
    prefix = CLASSES.get(name, "GlmMoeDsa")
    config = getattr(transformers, prefix + "Config")(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, prefix + "ForCausalLM")(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and "norm" in pname and pname.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_((0.1 if pname.startswith("lm_head") else 0.05) * noise)
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):   # the selection bias: non-zero, comparable to the scores
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    model.save_pretrained(out)
    # the fields llama.cpp's converter reads that transformers does not save, as GLM-5's config has them
    cfg_path = out / "config.json"
    saved = json.loads(cfg_path.read_text())
    saved.update(scoring_func="sigmoid", topk_method="noaux_tc", first_k_dense_replace=fields["first_k_dense_replace"])
    cfg_path.write_text(json.dumps(saved, indent=2))
    make_tiny_tokenizer(out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens(GLM_TOKENS)
    tok.save(str(out / "tokenizer.json"))
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(f"glm-dsa-{name}")
            src = make_checkpoint(d / "hf", name)
            out = d / "model.gguf"
            rm.convert(src, out, recipe="f32", progress=False)
            ids = np.random.default_rng(11).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
            cache[name] = (src, out, ids, reference_logits(src, ids))
        return cache[name]

    return get


def _ours(path, ids, n_batch, **kw):
    """Logits of every position: the prompt in steps of n_batch tokens, then one token at a time."""
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=n_batch, **kw) as m:
        first = m.eval_logits(ids[:N_PROMPT])
        rest = [m.eval([t]) for t in ids[N_PROMPT:]]
    return np.concatenate([first, np.stack(rest)])


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("n_batch", [64, 5, 1])
def test_arch_glm_dsa_f32_matches_transformers_past_top_k(converted, name, n_batch):
    _, path, ids, ref = converted(name)
    rel = _rel(_ours(path, ids, n_batch), ref)
    assert rel.max() <= 1e-4, f"{name}: worst position {rel.argmax()} rel err {rel.max():.2e}"


def test_arch_glm_dsa_the_pick_matters(converted, tmp_path):
    """The same checkpoint with a top_k above the context (every token sees all it sees) differs
    from the sparse one past top_k, and only there: the test above would catch a pick ignored."""
    src, path, ids, ref = converted("glm5")
    dense = tmp_path / "dense.gguf"
    from conftest import write_gguf_like

    write_gguf_like(path, dense, {}, {"glm-dsa.attention.indexer.top_k": 1000})
    with rm.Model(dense, n_ctx=64, n_threads=2) as m:
        all_seen = m.eval_logits(ids)
    rel = _rel(all_seen, ref)
    top_k = CONFIGS["glm5"]["index_topk"]
    assert rel[:top_k].max() <= 1e-4 and rel[top_k + 1:].max() > 1e-2


def test_arch_glm_dsa_indexer_types_written_and_read(converted):
    """GLM-5.2's sharing travels as llama.cpp's attention.indexer.types; the shared layers hold no
    indexer of their own."""
    _, path, _, _ = converted("glm5_shared")
    with rm.open_gguf(path) as g:
        md, names = g.metadata, set(g.tensors)
        hp = g.hparams()
    assert list(md["glm-dsa.attention.indexer.types"]) == [True, False, True, False]
    assert "blk.2.indexer.proj.weight" in names and "blk.1.indexer.proj.weight" not in names
    assert (hp["index_top_k"], hp["index_n_head"], hp["index_head_dim"]) == (12, 16, 16)


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_arch_glm_dsa_cache_types(converted, cache):
    """The indexer's keys are cached beside the latents in the cache's type, and a prompt as one
    batch gives what it gives one token at a time. F16 stays within 3e-3 of transformers; Q8_0's
    keys may pick other positions where two scores are close (measured on this checkpoint: mean KL
    7.8e-3, 1.2e-2 relative before top_k; Q4_0 4.8e-2)."""
    _, path, ids, ref = converted("glm5_blocks")
    kw = dict(cache_type_k=cache, cache_type_v=cache)
    batch, single = _ours(path, ids, 64, **kw), _ours(path, ids, 1, **kw)
    assert _rel(batch, single).max() <= 1e-4
    if cache == "f16":
        assert _rel(batch, ref).max() <= 3e-3
    else:
        assert _rel(batch, ref)[:CONFIGS["glm5_blocks"]["index_topk"]].max() <= 3e-2
        assert _kl(ref, batch).mean() <= 2e-2


def test_arch_glm_dsa_state_round_trip(converted, tmp_path):
    """The indexer's keys travel in the state with the latents: loaded into a fresh session, the
    sequence continues bit for bit past top_k."""
    _, path, ids, _ = converted("glm5")
    want, got, _ = state_round_trip(path, ids[:N_PROMPT], ids[N_PROMPT:], tmp_path / "s.state", n_ctx=64)
    assert np.array_equal(got, want)


def test_arch_glm_dsa_sequences_in_one_batch_equal_each_alone(converted):
    _, path, ids, _ = converted("glm5_shared")
    prompts = [ids[:20], ids[3:30], ids[1:6]]
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=16) as m:
        many = m.generate_many(prompts, max_tokens=6, temperature=0)
        alone = [m.generate_many([p], max_tokens=6, temperature=0)[0] for p in prompts]
    assert many == alone


def test_arch_glm_dsa_planner_counts_the_indexer_keys(converted):
    """A position caches the latent, the rotary key and the indexer's key in every layer."""
    from rapidmoe_gguf import planner

    _, path, _, _ = converted("glm5")
    sizes = planner.ModelSizes.from_files(path)
    c = CONFIGS["glm5"]
    assert sizes.index_head_dim == c["index_head_dim"]
    assert sizes.kv_bytes_per_pos == 4 * 3 * (c["kv_lora_rank"] + c["qk_rope_head_dim"] + c["index_head_dim"])


def test_arch_glm_dsa_refused_on_a_device(converted):
    """The indexer runs on the CPU backend only: a device session says so."""
    from rapidmoe_gguf import planner

    _, path, _, _ = converted("glm5")
    with pytest.raises(rm.RapidMoEError, match="sparse attention"):
        with rm.Model(path, n_ctx=64, n_threads=2, hardware=planner.Hardware(host_bw_gbps=20.0),
                      gpu_memory=1 << 30, gpu_backend="standin") as m:
            m.eval([1, 2, 3])


@pytest.mark.parametrize("bad, msg", [
    ({"glm-dsa.attention.indexer.types": [False, True, True]}, "layer 0 take the positions"),
    ({"glm-dsa.attention.indexer.key_length": 4}, "key_length"),
])
def test_arch_glm_dsa_damaged_files_refused(converted, tmp_path, bad, msg):
    from conftest import write_gguf_like

    _, path, _, _ = converted("glm5")
    damaged = tmp_path / "bad.gguf"
    write_gguf_like(path, damaged, {}, bad)
    with pytest.raises(rm.RapidMoEError, match=msg):
        rm.Model(damaged, n_ctx=16, n_threads=1)


# ---------------------------------------------------------------------------------------------
# llama.cpp's converter's file, and llama.cpp on it
# ---------------------------------------------------------------------------------------------

@llamacpp.needs
@pytest.mark.parametrize("name", ["glm5_wide", "glm5_wide_shared"])
def test_arch_glm_dsa_llama_cpp_file_matches_transformers(converted, tmp_path, name):
    """llama.cpp's converter's file: our logits against transformers (past top_k) and against
    llama.cpp's own on it. (Its DeepSeek-V3.2 converter stops unless transformers' tokenizer says
    add_bos_token, which transformers 5.23 never does for a checkpoint with a tokenizer.json: it
    drops the key from tokenizer_config.json.)"""
    src, _, ids, ref = converted(name)
    path = tmp_path / "llamacpp.gguf"
    llamacpp.convert(src, path, "glm4")
    with rm.Model(path, n_ctx=64, n_threads=2) as m:
        ours = m.eval_logits(ids)
    assert _rel(ours, ref).max() <= 1e-4
    theirs = llamacpp.logits(path, ids, tmp_path)
    assert _rel(ours, theirs).max() <= 1e-4


@llamacpp.needs
@pytest.mark.parametrize("name", ["glm5_wide_shared", "deepseek_v32"])
def test_arch_glm_dsa_our_file_runs_in_llama_cpp(converted, tmp_path, name):
    """Our converter's file loads in llama.cpp and gives transformers' logits past top_k."""
    _, path, ids, ref = converted(name)
    assert _rel(llamacpp.logits(path, ids, tmp_path), ref).max() <= 1e-4


def test_arch_glm_dsa_resplit_pair(converted, tmp_path):
    """A RESplit pair of the routed experts (from the f32 file): with every residual nearer the f32
    file than its base alone, past top_k too."""
    _, path, ids, _ = converted("glm5_blocks")
    pair = tmp_path / "pair.gguf"
    rm.convert(path, pair, recipe="q4_0-q4_0", progress=False)
    exact = _ours(path, ids, 64)
    mean_rel = lambda a: _rel(a, exact).mean()   # noqa: E731
    assert mean_rel(_ours(pair, ids, 64, residual_policy="all")) < 0.5 * mean_rel(_ours(pair, ids, 64,
                                                                                            residual_policy="none"))


@pytest.mark.parametrize("extra, exc, msg", [
    (dict(indexer_types=["shared", "full", "full"]), rm.FormatError, "layer 0 must run its own indexer"),
    (dict(indexer_types=["full", "sparse", "full"]), rm.FormatError, "must name 'full' or 'shared'"),
    (dict(q_lora_rank=None), rm.errors.UnsupportedError, "without q_lora_rank"),
])
def test_arch_glm_dsa_converter_refuses_what_it_cannot_express(converted, tmp_path, extra, exc, msg):
    import shutil

    src, _, _, _ = converted("glm5")
    shutil.copytree(src, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(dict(cfg, **extra)))
    with pytest.raises(exc, match=msg):
        rm.convert(tmp_path / "hf", tmp_path / "m.gguf", recipe="f32", progress=False)
    assert not (tmp_path / "m.gguf").exists()
