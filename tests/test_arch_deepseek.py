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
import subprocess
from pathlib import Path

import numpy as np
import pytest

import rapidmoe_gguf as rm
import llamacpp_oracle as llamacpp
from conftest import VOCAB as TINY_VOCAB, make_tiny_tokenizer, state_round_trip

N_PROMPT, N_DECODE = 24, 8
# the tiny tokenizer and the three tokens llama.cpp's GLM vocabulary code looks up
GLM_TOKENS = ["[gMASK]", "<|user|>", "<|observation|>"]
VOCAB = TINY_VOCAB + len(GLM_TOKENS)

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
    # DeepSeek-V3 with YaRN: factor 4 over an original context of 16, mscale_all_dim 0.707 as V2's
    "deepseek_v3_yarn": ("DeepseekV3", dict(_MLA, **_MOE, q_lora_rank=36, n_group=3, topk_group=2,
                                            routed_scaling_factor=2.5, norm_topk_prob=True,
                                            scoring_func="sigmoid", topk_method="noaux_tc",
                                            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                                 original_max_position_embeddings=16,
                                                                 mscale=0.707, mscale_all_dim=0.707,
                                                                 beta_fast=32, beta_slow=1))),
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
    fields = {**dict(vocab_size=VOCAB, hidden_size=72, num_hidden_layers=3, num_attention_heads=3,
                     num_key_value_heads=3, max_position_embeddings=256, rms_norm_eps=1e-6,
                     tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=0),
              **fields, **overrides}
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
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens(GLM_TOKENS)
    assert tok.get_vocab_size() == VOCAB
    tok.save(str(out / "tokenizer.json"))
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


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2", "glm4_moe_lite", "deepseek_v3_yarn"])
def test_arch_deepseek_mla_absorbed_equals_expanded(converted, name):
    """One token at a time (absorbed) against the prompt as one batch (expanded) and in batches of
    5 (expanded over the latents already cached), and transformers."""
    _, path, ids, ref = converted(name)
    absorbed, expanded = _ours(path, ids, 1), _ours(path, ids, 64)
    assert _rel(absorbed, expanded).max() <= 1e-5
    assert _rel(_ours(path, ids, 5), expanded).max() <= 1e-5
    assert _rel(absorbed, ref).max() <= 1e-4


def test_arch_deepseek_mla_expanded_tiles_match_transformers(tmp_path):
    """The expanded form works in tiles of 8192 floats and blocks of 32 queries and 32 positions
    (mla.c): a latent of 520 (two blocks of Kb_h^T's rows for 24 no-RoPE dims, Vb_h's 20 rows in
    blocks of 15) and an 80-token prompt (batches of 64 and 16: several query and key blocks, the
    second batch over cached latents) against transformers and the absorbed form (plain attention
    over the latent rows, one kv head of 9 query heads, the heads split between the threads)."""
    src = make_checkpoint(tmp_path / "hf", "deepseek_v3", kv_lora_rank=520, num_attention_heads=9, num_key_value_heads=9)
    path = tmp_path / "model.gguf"
    rm.convert(src, path, recipe="f32", progress=False)
    ids = np.random.default_rng(5).integers(3, VOCAB, 80).tolist()
    ref = reference_logits(src, ids)
    with rm.Model(path, n_ctx=96, n_threads=2, n_batch=64) as m:
        expanded = m.eval_logits(ids)
    with rm.Model(path, n_ctx=96, n_threads=2, n_batch=1) as m:
        absorbed = np.stack([m.eval([t]) for t in ids])
    assert _rel(expanded, ref).max() <= 1e-4
    assert _rel(absorbed, expanded).max() <= 1e-5


# ---------------------------------------------------------------------------------------------
# The same checkpoints through llama.cpp's converter, run by llama.cpp and by us
# ---------------------------------------------------------------------------------------------

@llamacpp.needs
@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v3_yarn", "glm4_moe_lite", "glm4_moe"])
def test_arch_deepseek_llama_cpp_file_matches_llama_cpp(converted, tmp_path, name):
    """llama.cpp's converter's file: our logits against llama.cpp's on it, and against transformers."""
    src, _, ids, ref = converted(name)
    path = tmp_path / "llamacpp.gguf"
    llamacpp.convert(src, path, "qwen2")
    theirs = llamacpp.logits(path, ids, tmp_path)
    with rm.Model(path, n_ctx=64, n_threads=2) as m:
        ours = m.eval_logits(ids)
    assert _rel(theirs, ref).max() <= 1e-4, "llama.cpp itself against transformers"
    assert _rel(ours, theirs).max() <= 1e-4
    assert _rel(ours, ref).max() <= 1e-4


@llamacpp.needs
@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v3_yarn", "deepseek_v2", "glm4_moe_lite", "glm4_moe"])
def test_arch_deepseek_our_file_runs_in_llama_cpp(converted, tmp_path, name):
    """Our converter's file loads in llama.cpp and gives its logits."""
    _, path, ids, ref = converted(name)
    theirs = llamacpp.logits(path, ids, tmp_path)
    assert _rel(theirs, ref).max() <= 1e-4


# ---------------------------------------------------------------------------------------------
# Devices and the planner
# ---------------------------------------------------------------------------------------------

def test_arch_deepseek_glm4moe_on_the_standin_device_equals_cpu(converted):
    """GLM-4.5's routing (on the host), dense layer and shared experts through a device backend."""
    from rapidmoe_gguf import planner

    _, path, ids, _ = converted("glm4_moe")
    hw = planner.Hardware(host_bw_gbps=20.0)
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw) as cpu, \
            rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw, gpu_memory=1 << 30,
                     gpu_backend="standin") as dev:
        assert dev.backend == "standin"
        ref, got = cpu.eval_logits(ids[:N_PROMPT]), dev.eval_logits(ids[:N_PROMPT])
        ref = np.concatenate([ref, np.stack([cpu.eval([t]) for t in ids[N_PROMPT:]])])
        got = np.concatenate([got, np.stack([dev.eval([t]) for t in ids[N_PROMPT:]])])
    assert _rel(got, ref).max() <= 1e-5


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2", "glm4_moe_lite"])
def test_arch_deepseek_mla_on_the_standin_device_equals_cpu(converted, name):
    """Multi-head latent attention through a device backend (the stand-in runs the backend's
    mla_attention op on the device's copies of the weights and its latent cache): a prompt
    (expanded form) and tokens one at a time (absorbed) give the CPU's logits, and batches of
    sequences run on it too."""
    from rapidmoe_gguf import planner

    _, path, ids, _ = converted(name)
    hw = planner.Hardware(host_bw_gbps=20.0)
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw) as cpu, \
            rm.Model(path, n_ctx=64, n_threads=2, n_batch=16, hardware=hw, gpu_memory=1 << 30,
                     gpu_backend="standin") as dev:
        assert dev.backend == "standin" and dev.gpu_info["used_bytes"] > 0
        ref, got = cpu.eval_logits(ids[:N_PROMPT]), dev.eval_logits(ids[:N_PROMPT])
        ref = np.concatenate([ref, np.stack([cpu.eval([t]) for t in ids[N_PROMPT:]])])
        got = np.concatenate([got, np.stack([dev.eval([t]) for t in ids[N_PROMPT:]])])
        assert _rel(got, ref).max() <= 1e-5
        prompts = [ids[:5], ids[2:9], ids[1:4]]
        assert dev.generate_many(prompts, max_tokens=4, temperature=0) == \
            cpu.generate_many(prompts, max_tokens=4, temperature=0)


def test_arch_deepseek_planner_counts_the_latent_cache(converted):
    """The KV cache of an MLA model is one latent (kv_lora_rank + n_rot floats) per position and
    layer; a model with the same heads caching K and V would hold n_head * (head_dim + head_dim_v)."""
    from rapidmoe_gguf import planner

    _, path, _, _ = converted("deepseek_v3")
    sizes = planner.ModelSizes.from_files(path)
    kv_lora, rope = _MLA["kv_lora_rank"], _MLA["qk_rope_head_dim"]
    assert (sizes.kv_lora_rank, sizes.n_rot) == (kv_lora, rope)
    assert sizes.kv_bytes_per_pos == 4 * 3 * (kv_lora + rope)
    plan = planner.plan(sizes, 1 << 30, 64, hardware=planner.Hardware(host_bw_gbps=20.0))
    assert plan.gpu_parts["kv_cache"] == 64 * sizes.kv_bytes_per_pos
    assert not any("latent attention" in m for m in plan.messages)     # it runs on the device
    mha = planner.ModelSizes(**{**sizes.__dict__, "kv_lora_rank": 0, "n_head_kv": sizes.n_head})
    head_k, head_v = _MLA["qk_nope_head_dim"] + rope, _MLA["v_head_dim"]
    assert planner.session_device_bytes(mha, 1, 1, False)["kv_cache"] == 4 * 3 * 3 * (head_k + head_v)


# ---------------------------------------------------------------------------------------------
# Tokenizers and chat templates of these families
# ---------------------------------------------------------------------------------------------

TOKENIZER_TEXT = ("Hello漢字World's 1234567 ÉTÉ été\nカタカナ ひらがな  x  DON'T\n\n\tend 中文，标点。 A1b2")


@llamacpp.needs
@pytest.mark.parametrize("pre", ["kimi-k2", "glm4", "deepseek-v3"])
def test_arch_deepseek_pre_tokenizer_ids_match_llama_cpp(converted, tmp_path, pre):
    """The tiny vocabulary under each family's pre-tokenizer name: our ids are llama.cpp's."""
    from conftest import write_gguf_like

    _, path, _, _ = converted("glm4_moe")
    named = tmp_path / f"{pre}.gguf"
    write_gguf_like(path, named, {}, {"tokenizer.ggml.pre": pre})
    child = (r"import sys, json; from llama_cpp import Llama; "
             r"llm = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False); "
             r"print(json.dumps(llm.tokenize(sys.argv[2].encode(), add_bos=False, special=True)))")
    r = subprocess.run([llamacpp.python(), "-c", child, str(named), TOKENIZER_TEXT], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    with rm.Model(named, n_ctx=16, n_threads=1) as m:
        assert m.tokenizer.encode(TOKENIZER_TEXT, add_special=False) == json.loads(r.stdout)


def test_arch_deepseek_glm_tokenizer_gets_the_glm4_name(converted, tmp_path):
    """GLM's split is llama3's; the converter names it as llama.cpp's GLM files do."""
    import shutil

    from rapidmoe_gguf.tokenizer import _LLAMA3, tokenizer_kv_from_hf

    src, _, _, _ = converted("glm4_moe")
    d = tmp_path / "hf"
    shutil.copytree(src, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": _LLAMA3}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    assert tokenizer_kv_from_hf(d)["tokenizer.ggml.pre"] == "dbrx"   # the first name with this split
    assert tokenizer_kv_from_hf(d, ("glm4",))["tokenizer.ggml.pre"] == "glm4"
    rm.convert(d, tmp_path / "m.gguf", recipe="f32", progress=False)
    with rm.open_gguf(tmp_path / "m.gguf") as g:
        md = g.metadata
    assert md["tokenizer.ggml.pre"] == "glm4"
    # a turn ends at the next user turn or a tool's observation, as llama.cpp's converter names them
    tokens = list(md["tokenizer.ggml.tokens"])
    assert (md["tokenizer.ggml.eot_token_id"], md["tokenizer.ggml.eom_token_id"]) == \
        (tokens.index("<|user|>"), tokens.index("<|observation|>"))
    with rm.Model(tmp_path / "m.gguf", n_ctx=16, n_threads=1) as m:
        assert {tokens.index("<|user|>"), tokens.index("<|observation|>")} <= m.tokenizer.eog_ids


TEMPLATES = ["GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "deepseek-ai-DeepSeek-V3.1.jinja", "moonshotai-Kimi-K2.jinja",
             "Kimi-K2-Instruct.jinja"]
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there 漢字"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Count: 1, 2, 3"}]


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_arch_deepseek_chat_template_matches_transformers(converted, name, add_generation_prompt):
    """The families' published templates (as llama.cpp ships them) rendered by us and by transformers."""
    from transformers import AutoTokenizer

    from rapidmoe_gguf import chat

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    path = Path(llamacpp.src()) / "models" / "templates" / name
    assert path.is_file(), f"{path}: llama.cpp ships no such template"
    template = path.read_text(encoding="utf-8")
    src, _, _, _ = converted("glm4_moe")
    tok = AutoTokenizer.from_pretrained(src)
    want = tok.apply_chat_template(CHAT, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)
    got = chat.render(template, CHAT, add_generation_prompt, bos_token=tok.bos_token, eos_token=tok.eos_token)
    assert got == want


TOOL_CHAT = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"},
             {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize("name", ["GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "MiniMax-M2.jinja"])
def test_arch_deepseek_chat_template_tool_call_turn_matches_transformers(converted, name):
    """An assistant turn with tool calls and `content: null`, then the tool's result, rendered as
    transformers renders it. (Our renderer hands such a turn's content on as "": handed None, our
    sandbox would write "None" into these three templates' output, where transformers writes
    nothing.)"""
    from transformers import AutoTokenizer

    from rapidmoe_gguf import chat

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    template = (Path(llamacpp.src()) / "models" / "templates" / name).read_text(encoding="utf-8")
    src, _, _, _ = converted("glm4_moe")
    tok = AutoTokenizer.from_pretrained(src)
    want = tok.apply_chat_template(TOOL_CHAT, chat_template=template, tokenize=False, add_generation_prompt=True)
    got = chat.render(template, TOOL_CHAT, True, bos_token=tok.bos_token, eos_token=tok.eos_token)
    assert got == want


# ---------------------------------------------------------------------------------------------
# RESplit and UMIA on the routed experts only
# ---------------------------------------------------------------------------------------------

def _kl(ref, ours):
    p = np.exp(ref - ref.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lq = ours - ours.max(-1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
    return (p * (np.log(p) - lq)).sum(-1).mean()


def test_arch_deepseek_residual_on_routed_experts_and_budget_over_their_slots(tmp_path):
    """A Q4_0 base with a Q4_0 residual: the sidecar holds the routed experts only, the residual
    brings the model closer to transformers, and after calibration every policy spends its budget
    on the MoE layers' slots (the leading dense layer has none)."""
    import gguf

    from rapidmoe_gguf import evaluate

    src = make_checkpoint(tmp_path / "hf", "deepseek_v3", hidden_size=64, moe_intermediate_size=64,
                          intermediate_size=96)
    rep = rm.convert(src, tmp_path / "m.gguf", recipe="q4_0-q4_0", progress=False)
    names = [t.name for t in gguf.GGUFReader(rep.residual_path).tensors]
    assert sorted(names) == sorted(f"blk.{b}.ffn_{k}_exps.residual" for b in (1, 2) for k in ("gate", "up", "down"))
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    assert types["blk.1.ffn_up_exps.weight"] == "Q4_0"   # the routed experts: the recipe's base
    for name in ("blk.0.ffn_up.weight", "blk.1.ffn_up_shexp.weight", "blk.2.ffn_down_shexp.weight"):
        assert types[name] == "Q8_0", name                # dense FFN and shared experts: its other type
    ids = np.random.default_rng(11).integers(3, VOCAB, 40).tolist()
    ref = reference_logits(src, ids)
    kl = {}
    for policy in ("all", "none"):
        with rm.Model(tmp_path / "m.gguf", n_ctx=64, n_threads=2, residual_policy=policy) as m:
            kl[policy] = _kl(ref, m.eval_logits(ids))
    assert kl["all"] < 0.5 * kl["none"] and kl["all"] <= 1e-3, kl
    evaluate.calibrate(str(tmp_path / "m.gguf"), "The quick brown fox jumps over the lazy dog. " * 20, n_ctx=128)
    for policy in ("umia", "gate", "expert", "layer"):
        with rm.Model(tmp_path / "m.gguf", n_ctx=64, n_threads=2, residual_policy=policy, residual_budget=0.5) as m:
            m.eval_logits(ids)
            stats = m.stats()
        assert not stats["active"][0].any() and not stats["residual"][0].any(), policy   # the dense layer
        assert abs(stats["residual_rate"] - 0.5) <= 0.05, (policy, stats["residual_rate"])


def test_arch_deepseek_old_fused_kv_b_file_is_refused_by_its_missing_key(converted, tmp_path):
    """Files from before llama.cpp split attn_kv_b have no key_length_mla: the error says why."""
    import gguf

    _, path, _, _ = converted("deepseek_v2")
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "old.gguf"), "deepseek2")
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "deepseek2.attention.key_length_mla"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(rm.FormatError, match="key_length_mla' is missing .*split attn_kv_b"):
        rm.Model(tmp_path / "old.gguf", n_ctx=16)


@pytest.mark.parametrize("name", ["deepseek_v3", "glm4_moe_lite"])
def test_arch_deepseek_state_round_trip(converted, name, tmp_path):
    """MLA's latent cache travels in the state (no V rows): loaded into a fresh session, the
    sequence continues bit for bit."""
    _, path, ids, _ = converted(name)
    want, got, _ = state_round_trip(path, ids[:N_PROMPT], ids[N_PROMPT:], tmp_path / "s.state", n_ctx=64)
    assert np.array_equal(got, want)
