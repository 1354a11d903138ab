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
import llamacpp_oracle as llamacpp
from conftest import VOCAB, make_tiny_tokenizer, state_round_trip, write_gguf_like

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


@pytest.mark.skipif(rm.cpu_isa() not in ("avx2", "avx512"), reason="the stored layout is the x86 sets'")
def test_arch_gpt_oss_mxfp4_experts_repacked_at_load(tmp_path, monkeypatch):
    """MXFP4 experts kept in the kernel set's stored layout from load give the file layout's
    logits bit for bit: rows of 288 (a group of eight blocks and one past it, as gpt-oss's 2,880 end
    two blocks past their groups), prompt batches of 16 (experts meet 1 to 16 tokens: the stored
    one-token form, the groups unpacked for the prefill form, the tiles), then decode."""
    src = make_tiny_gpt_oss(tmp_path / "hf", hidden_size=288, intermediate_size=288)
    path = tmp_path / "m.gguf"
    rm.convert(src, path, recipe="mxfp4", progress=False)
    ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
    repacked = ours(path, ids, n_batch=16)
    monkeypatch.setenv("RAPIDMOE_REPACK", "0")
    np.testing.assert_array_equal(repacked, ours(path, ids, n_batch=16))


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


@pytest.fixture(scope="module")
def split_pair(tmp_path_factory):
    """An F16 base + F32 residual pair (other matrices F32) of a tiny gpt-oss with 8 experts,
    top-4: enough experts per token that a device holding half the bases splits a token's work.
    Float types, so no product quantizes its activations: with a q4k-q8 pair, a sum taken in
    another order (the split adds a token's experts in slot order, the CPU in expert order) now
    and then lands a Q8 rounding on the other side, one step on one token (measured 3e-4 of the
    largest logit on 1 of 45 tokens), which would test the rounding, not the split."""
    src = make_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss-split-hf"), num_local_experts=8,
                            num_experts_per_tok=4, seed=4)
    out = tmp_path_factory.mktemp("gpt-oss-split") / "m.gguf"
    rm.convert(src, out, recipe="q4k-q8", base_type="F16", residual_type="F32", other_type="F32", progress=False)
    return out


def _split_logits(m, ids):
    """A 40-token prompt (two batches of 32, past the window of 8), then five decode steps."""
    return np.concatenate([m.eval_logits(ids)] + [m.eval([t])[None] for t in (5, 17, 29, 41, 53)])


@pytest.mark.parametrize("placement", ["half", "all"])
@pytest.mark.parametrize("policy", ["none", "all"])
def test_arch_gpt_oss_standin_split_equals_cpu(split_pair, placement, policy):
    """The CPU/device split with gpt-oss's router bias, expert biases and clamped SwiGLU (device
    experts, fix slots and host experts) gives the CPU's logits, to the stand-in tests' tolerance
    (1e-4 of the largest logit, the same argmax). Measured: 2.1e-7 for every case."""
    from rapidmoe_gguf import planner

    hw = planner.Hardware(host_bw_gbps=50.0, context_reserve=0)
    kw = dict(n_ctx=96, n_batch=32, n_threads=2, hardware=hw, residual_policy=policy)
    full = planner.plan_files(split_pair, 1 << 34, 96, n_batch=32, hardware=hw)
    bases = full.gpu_parts["expert_bases"]
    budget = full.gpu_bytes - bases + (bases // 2 if placement == "half" else bases)
    ids = np.random.default_rng(11).integers(3, VOCAB, 40).tolist()
    with rm.Model(split_pair, **kw) as cpu, rm.Model(split_pair, gpu_memory=budget, gpu_backend="standin", **kw) as dev:
        assert dev.backend == "standin"
        n_on, total = dev.gpu_info["n_experts_on_gpu"], dev.gpu_info["n_experts_total"]
        assert (0 < n_on < total) if placement == "half" else n_on == total
        got, ref = _split_logits(dev, ids), _split_logits(cpu, ids)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(np.abs(ref).max()))
        assert (got.argmax(-1) == ref.argmax(-1)).all()
        np.testing.assert_array_equal(dev.stats()["residual"], cpu.stats()["residual"])
        assert dev.stats()["residual"].sum() > 0 if policy == "all" else dev.stats()["residual"].sum() == 0


def test_arch_gpt_oss_split_pair_biases_and_residual_matter(split_pair, tmp_path):
    """The agreement above is not that of terms that do nothing: without the expert biases the
    logits move by more than 1e-2 of the largest logit, and every residual (policy all against
    none) by more than 1e-5 (F16's rounding; the split's own error is 100 times smaller)."""
    import gguf
    import shutil

    ids = np.random.default_rng(11).integers(3, VOCAB, 40).tolist()
    r = gguf.GGUFReader(str(split_pair))
    zero = {x.name: (np.zeros(x.data.shape, np.float32), None) for x in r.tensors if x.name.endswith("_exps.bias")}
    assert len(zero) == 6
    write_gguf_like(split_pair, tmp_path / "x.gguf", zero, {})
    shutil.copy(str(split_pair).replace(".gguf", ".residual.gguf"), tmp_path / "x.residual.gguf")
    out = {}
    for name, path, policy in (("ref", split_pair, "all"), ("none", split_pair, "none"), ("nobias", tmp_path / "x.gguf", "all")):
        with rm.Model(path, n_ctx=96, n_batch=32, n_threads=2, residual_policy=policy) as m:
            out[name] = _split_logits(m, ids)
    scale = float(np.abs(out["ref"]).max())
    assert float(np.abs(out["nobias"] - out["ref"]).max()) > 1e-2 * scale
    assert float(np.abs(out["none"] - out["ref"]).max()) > 1e-5 * scale


def test_arch_gpt_oss_bad_layer_pattern_is_refused(tmp_path):
    src = make_tiny_gpt_oss(tmp_path / "hf", seed=3)
    cfg = json.loads((src / "config.json").read_text())
    cfg["layer_types"] = ["full_attention", "sliding_attention"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(rm.UnsupportedError, match="is not gpt-oss's alternation"):
        rm.convert(src, tmp_path / "m.gguf", recipe="f32", progress=False)
    assert not os.path.exists(tmp_path / "m.gguf")


# ---------------------------------------------------------------------------------------------
# llama.cpp: its own converter on the same kind of checkpoint, its engine on the same file
# ---------------------------------------------------------------------------------------------

def _llama_file(hf_dir, out, ftype=None):
    """llama.cpp's converter writes F32; with ftype, llama.cpp's quantizer then makes that file type."""
    f32 = llamacpp.convert(hf_dir, str(out) + ".f32.gguf", "gpt-4o")
    return str(f32 if ftype is None else llamacpp.quantize(f32, out, ftype))


@llamacpp.needs
def test_arch_gpt_oss_llamacpp_file_matches_both_oracles(tmp_path):
    """llama.cpp's converter on a checkpoint with truncate true (llama.cpp's only reading; GGUF has
    no key for it): our engine on that file against llama.cpp on it and against transformers.
    Measured: 4.6e-7 and 1.0e-6 (llama.cpp against transformers: 1.0e-6)."""
    src = make_tiny_gpt_oss(tmp_path / "hf", truncate=True)
    path = _llama_file(src, tmp_path / "ll.gguf")
    ids = np.random.default_rng(7).integers(3, VOCAB, 40).tolist()
    with rm.Model(path, n_ctx=128, n_threads=2) as m:
        mine = m.eval_logits(ids)
    theirs = llamacpp.logits(path, ids, tmp_path, n_ctx=128)
    assert rel_err(mine, theirs) <= 1e-4, f"against llama.cpp: {rel_err(mine, theirs):.2e}"
    assert rel_err(mine, reference_logits(src, ids)) <= 1e-4


@llamacpp.needs
def test_arch_gpt_oss_llamacpp_mxfp4_file(tmp_path):
    """llama.cpp's MXFP4_MOE file (MXFP4 experts, Q8_0 attention and embeddings) in both engines.
    Every token uses all 4 experts: with top-2 the two engines' float sums, equal to ~1e-6
    elsewhere, pick different experts at a few near-tied positions (measured up to 0.9% on 5 of
    40 positions). Measured: 1.6e-7. Re-split by our converter: the copy (recipe mxfp4) 1.6e-7; a
    Q3_K base alone mean KL 3.5e-2, with every Q8_0 residual 2.5e-4, against llama.cpp's logits."""
    src = make_tiny_gpt_oss(tmp_path / "hf", truncate=True, num_experts_per_tok=4)
    path = _llama_file(src, tmp_path / "mxfp4.gguf", "MXFP4_MOE")
    import gguf

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_up_exps.weight"] == "MXFP4" and types["blk.1.attn_q.weight"] == "Q8_0"
    ids = np.random.default_rng(7).integers(3, VOCAB, 40).tolist()
    with rm.Model(path, n_ctx=128, n_threads=2) as m:
        mine = m.eval_logits(ids)
    theirs = llamacpp.logits(path, ids, tmp_path, n_ctx=128)
    assert rel_err(mine, theirs) <= 1e-4

    # the same file re-split: its MXFP4 experts copied (recipe mxfp4), or a Q3_K base with a
    # residual that restores them (q3k-q8), against llama.cpp on the MXFP4 file
    rep = rm.convert(path, tmp_path / "copy.gguf", recipe="mxfp4", progress=False)
    assert rep.residual_path is None
    copied = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "copy.gguf")).tensors}
    for t in gguf.GGUFReader(path).tensors:
        if "_exps.weight" in t.name:
            assert np.array_equal(np.asarray(copied[t.name].data), np.asarray(t.data)), t.name
    with rm.Model(tmp_path / "copy.gguf", n_ctx=128, n_threads=2) as m:
        assert rel_err(m.eval_logits(ids), theirs) <= 1e-4
    rm.convert(path, tmp_path / "split.gguf", recipe="q3k-q8", progress=False)
    kl = {}
    for policy in ("none", "all"):
        with rm.Model(tmp_path / "split.gguf", n_ctx=128, n_threads=2, residual_policy=policy) as m:
            kl[policy] = float(_kl(theirs, m.eval_logits(ids)).mean())
    assert kl["all"] <= 1e-3 and kl["none"] > 10 * kl["all"], kl   # measured 2.5e-4 and 3.5e-2


# ---------------------------------------------------------------------------------------------
# The harmony chat format: the template's reasoning effort, and the reply's channels
# ---------------------------------------------------------------------------------------------

HARMONY_SPECIALS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>",
                    "<|call|>", "<|constrain|>"]
# A template in the harmony layout, written for these tests: the system header with the reasoning
# effort (default medium), developer/user/assistant messages on channels, and an assistant's
# thinking on the analysis channel for the last turn only.
HARMONY_TEMPLATE = (
    "{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else 'medium' -%}"
    "<|start|>system<|message|>A tiny test model.\nReasoning: {{ effort }}\n\n"
    "# Valid channels: analysis, final.<|end|>"
    "{%- for m in messages -%}"
    "{%- if m.role in ('system', 'developer') -%}<|start|>developer<|message|># Instructions\n\n{{ m.content }}<|end|>"
    "{%- elif m.role == 'user' -%}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}"
    "{%- if m.thinking is defined and m.thinking and loop.last -%}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "thinking": "greet back"}, {"role": "user", "content": "2+2?"}]


def make_harmony_tokenizer(out_dir) -> None:
    """The tiny byte-level BPE with harmony's special tokens and the template above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=HARMONY_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Reasoning: low medium high. Answer briefly: 2+2 is 4. Hello!"] * 20, trainer=trainer)
    n = tok.get_vocab_size()
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(VOCAB - n)])
    out = Path(out_dir)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
        "eos_token": "<|return|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
        "chat_template": HARMONY_TEMPLATE}))


@pytest.mark.parametrize("effort", [None, "low", "high"])
def test_arch_gpt_oss_chat_template_matches_transformers(tmp_path, effort):
    import transformers

    from rapidmoe_gguf import chat

    make_harmony_tokenizer(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    kw = {} if effort is None else {"reasoning_effort": effort}
    want = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **kw)
    got = chat.render(HARMONY_TEMPLATE, MESSAGES, True, reasoning_effort=effort) if effort else \
        chat.render(HARMONY_TEMPLATE, MESSAGES, True)
    assert got == want and f"Reasoning: {effort or 'medium'}" in got


@pytest.mark.parametrize("effort", [None, "low", "high"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_arch_gpt_oss_published_template_matches_transformers(tmp_path, effort, add_generation_prompt):
    """gpt-oss's own chat template (llama.cpp ships a copy, models/templates/openai-gpt-oss-120b.jinja;
    the test runs where llama.cpp's source is at hand), with the reasoning effort, a developer
    message and an assistant's thinking, rendered by chat.render as transformers renders it."""
    import transformers

    from rapidmoe_gguf import chat

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships gpt-oss's template, is not at hand (LLAMA_CPP_SRC)")
    path = Path(llamacpp.src()) / "models" / "templates" / "openai-gpt-oss-120b.jinja"
    assert path.is_file(), f"{path}: llama.cpp ships no such template"
    template = path.read_text(encoding="utf-8")
    make_harmony_tokenizer(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    kw = {} if effort is None else {"reasoning_effort": effort}
    want = hf.apply_chat_template(MESSAGES, chat_template=template, tokenize=False,
                                  add_generation_prompt=add_generation_prompt, **kw)
    got = chat.render(template, MESSAGES, add_generation_prompt, **kw)
    assert got == want
    assert f"Reasoning: {effort or 'medium'}" in got and "<|channel|>final<|message|>Hello!" in got


@pytest.fixture(scope="module")
def harmony(tiny, tmp_path_factory):
    """The tiny model with the harmony tokenizer and template: (checkpoint, converted file)."""
    import shutil

    src = tmp_path_factory.mktemp("harmony") / "hf"
    shutil.copytree(tiny[0], src)
    make_harmony_tokenizer(src)
    out = src.parent / "m.gguf"
    rm.convert(src, out, recipe="f32", progress=False)
    return src, out


def test_arch_gpt_oss_chat_prompt_through_the_model(harmony):
    """The converted model carries the template and the harmony end-of-generation rule; the chat
    prompt takes reasoning_effort as transformers' apply_chat_template does, token for token."""
    import transformers

    from rapidmoe_gguf import chat

    src, out = harmony
    hf = transformers.AutoTokenizer.from_pretrained(src)
    with rm.Model(out, n_ctx=256, n_threads=1) as m:
        assert chat.is_harmony(m.tokenizer)
        eog = {m.tokenizer.decode([i]) for i in m.tokenizer.eog_ids}
        assert "<|return|>" in eog and "<|call|>" in eog and "<|end|>" not in eog
        ids = chat.chat_prompt(m, MESSAGES, reasoning_effort="high")
        assert ids == hf.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True,
                                             reasoning_effort="high", return_dict=False)
        reply = m.create_chat_completion(MESSAGES, max_tokens=4, temperature=0, reasoning_effort="low")
        assert reply["choices"][0]["message"]["role"] == "assistant"
        with pytest.raises(rm.InvalidArgumentError, match="reasoning_effort"):
            m.create_chat_completion(MESSAGES, max_tokens=1, reasoning_effort="extreme")


REPLY = ("<|channel|>analysis<|message|>The user asks 2+2. Easy.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>2+2 = 4.")


def test_arch_gpt_oss_reply_channels_whole_and_streamed():
    from rapidmoe_gguf import chat

    assert chat.split_channels(REPLY) == {"analysis": "The user asks 2+2. Easy.", "final": "2+2 = 4."}
    assert chat.split_channels("plain text, no channels") == {"final": "plain text, no channels"}
    tool = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 2}<|call|>"
    assert chat.split_channels(tool) == {"commentary": "{\"a\": 2}"}
    for step in (1, 2, 3, 7):   # tags split across pieces anywhere
        h = chat.HarmonyChannels()
        got: dict[str, str] = {}
        for i in range(0, len(REPLY), step):
            for ch, piece in h.feed(REPLY[i:i + step]):
                got[ch] = got.get(ch, "") + piece
        for ch, piece in h.flush():
            got[ch] = got.get(ch, "") + piece
        assert got == chat.split_channels(REPLY), step


def test_arch_gpt_oss_chat_chunks_show_the_final_channel():
    from rapidmoe_gguf import chat

    def completion():
        for i in range(0, len(REPLY), 5):
            yield {"id": "x", "created": 0, "model": "m", "choices": [{"text": REPLY[i:i + 5], "finish_reason": None}]}
        yield {"id": "x", "created": 0, "model": "m", "choices": [{"text": "", "finish_reason": "stop"}]}

    def joined(show):
        chunks = list(chat.as_chat_chunks(completion(), chat.HarmonyChannels(), show))
        deltas = [c["choices"][0]["delta"] for c in chunks]
        return ("".join(d.get("content", "") for d in deltas), "".join(d.get("reasoning_content", "") for d in deltas),
                chunks[-1]["choices"][0]["finish_reason"])

    assert joined(False) == ("2+2 = 4.", "", "stop")
    assert joined(True) == ("2+2 = 4.", "The user asks 2+2. Easy.", "stop")


def test_arch_gpt_oss_server_request_takes_reasoning_effort(harmony):
    from rapidmoe_gguf import server as srv

    _, out = harmony
    with rm.Model(out, n_ctx=256, n_threads=1) as m:
        body = {"messages": MESSAGES, "max_tokens": 2, "reasoning_effort": "high", "show_reasoning": True}
        req = srv.parse_request("chat", body, m, {"m"})
        assert req.harmony and req.show_reasoning
        assert "Reasoning: high" in m.tokenizer.decode(req.prompt_ids)
        with pytest.raises(srv.ApiError, match="reasoning_effort must be one of none, minimal, low") as e:
            srv.parse_request("chat", dict(body, reasoning_effort="extreme"), m, {"m"})
        assert e.value.param == "reasoning_effort"
        # a level in chat_template_kwargs stays where the request's field is absent, as in llama-server
        kept = srv.parse_request("chat", {"messages": MESSAGES, "max_tokens": 2,
                                          "chat_template_kwargs": {"reasoning_effort": "low"}}, m, {"m"})
        assert "Reasoning: low" in m.tokenizer.decode(kept.prompt_ids)
        chunks = list(req.chunks(m, "m"))
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# ---------------------------------------------------------------------------------------------
# The released form: experts as MXFP4 blocks and scales
# ---------------------------------------------------------------------------------------------

def make_mxfp4_form(src, dst) -> Path:
    """The checkpoint src rewritten as gpt-oss is released: each expert projection as
    ``*_blocks`` (uint8, experts x out x in/32 x 16, elements 2k and 2k + 1 in byte k's low and
    high nibble) and ``*_scales`` (E8M0 bytes), quantized by gguf-py's MXFP4 (ggml's rules), and
    config.json's quantization_config saying so."""
    import shutil

    from gguf import GGMLQuantizationType
    from gguf import quants as gq
    from safetensors.numpy import load_file, save_file

    dst = Path(dst)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    out = {}
    for k, v in load_file(str(Path(src) / "model.safetensors")).items():
        if not k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[k] = v
            continue
        w = np.ascontiguousarray(v.transpose(0, 2, 1))            # (experts, out, in), nn.Linear's rows
        q = gq.quantize(w, GGMLQuantizationType.MXFP4).reshape(*w.shape[:-1], w.shape[-1] // 32, 17)
        elems = np.concatenate([q[..., 1:] & 15, q[..., 1:] >> 4], axis=-1)   # ggml: 0..15 low, 16..31 high
        out[k + "_blocks"] = (elems[..., 0::2] | (elems[..., 1::2] << 4)).astype(np.uint8)
        out[k + "_scales"] = np.ascontiguousarray(q[..., 0])
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def dequantized_reference(hf_dir, ids):
    """transformers loading the MXFP4 checkpoint dequantized (its CPU path), in f32."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="module")
def mxfp4_form(tmp_path_factory):
    """An MXFP4-form checkpoint whose tokens use all 4 experts (no router near-ties to flip), and
    transformers' logits on it."""
    base = make_tiny_gpt_oss(tmp_path_factory.mktemp("mx-src"), num_experts_per_tok=4)
    src = make_mxfp4_form(base, tmp_path_factory.mktemp("mx") / "hf")
    ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT).tolist()
    return src, ids, dequantized_reference(src, ids)


def test_arch_gpt_oss_mxfp4_form_matches_transformers(mxfp4_form, tmp_path, monkeypatch):
    """Converted to f32, one expert's blocks at a time (never a whole tensor): the logits of
    transformers on the dequantized weights. Measured: 9.0e-7."""
    from rapidmoe_gguf.convert.safetensors_io import SafetensorsCheckpoint

    src, ids, ref = mxfp4_form
    slabs = []
    read_u8 = SafetensorsCheckpoint.read_u8
    monkeypatch.setattr(SafetensorsCheckpoint, "read_u8", lambda self, n, i=None: slabs.append(i) or read_u8(self, n, i))
    rm.convert(src, tmp_path / "m.gguf", recipe="f32", progress=False)
    assert slabs and None not in slabs
    with rm.Model(tmp_path / "m.gguf", n_ctx=128, n_threads=2) as m:
        assert rel_err(m.eval_logits(ids), ref) <= 1e-4


def test_arch_gpt_oss_mxfp4_recipe_copies_the_experts(mxfp4_form, tmp_path):
    """Recipe mxfp4: the experts go into the file as ggml MXFP4 unchanged, which dequantize to
    transformers' weights exactly; the logits then match it as the f32 file does."""
    import gguf
    import torch
    import transformers

    src, ids, ref = mxfp4_form
    rep = rm.convert(src, tmp_path / "m.gguf", recipe="mxfp4", progress=False)
    assert rep.residual_path is None
    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True))
    t = {x.name: x for x in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    up = t["blk.1.ffn_up_exps.weight"]
    assert up.tensor_type == gguf.GGMLQuantizationType.MXFP4
    want = model.model.layers[1].mlp.experts.gate_up_proj.detach().numpy()[..., 1::2].transpose(0, 2, 1)
    assert np.array_equal(gguf.quants.dequantize(up.data, up.tensor_type), want)
    with rm.Model(tmp_path / "m.gguf", n_ctx=128, n_threads=2) as m:
        assert _kl(ref, m.eval_logits(ids)).mean() <= 1e-3   # the attention's Q8_0 rounding only


# The split of an MXFP4 source against the MXFP4 model itself (docs/QUALITY.md). Measured on this
# model: weight error of base + residual 6.6e-4 (q3k-q8) and 1.3e-3 (q2k-q8) relative to MXFP4,
# against 5.8e-3 for Q8_0 rounding of the MXFP4 weights; see the test for the logits.
@pytest.mark.parametrize("recipe", ["q3k-q8", "q2k-q8"])
def test_arch_gpt_oss_mxfp4_source_split(mxfp4_form, tmp_path, recipe):
    from rapidmoe_gguf import quants
    from safetensors.numpy import load_file

    from rapidmoe_gguf.convert.sources import mxfp4_from_hf

    src, ids, ref = mxfp4_form
    num = den = 0.0
    for k, b in load_file(str(src / "model.safetensors")).items():
        if k.endswith("_blocks"):
            shape = (b.shape[0] * b.shape[1], b.shape[2] * 32)
            w = quants.dequantize("MXFP4", mxfp4_from_hf(b, load_file(str(src / "model.safetensors"))[k[:-7] + "_scales"]), shape)
            q = quants.dequantize("Q8_0", quants.quantize("Q8_0", w), shape)
            num, den = num + float(((q - w) ** 2).sum()), den + float((w ** 2).sum())
    q8_error = (num / den) ** 0.5
    rep = rm.convert(src, tmp_path / "m.gguf", recipe=recipe, progress=False)
    assert rep.bpw_base < 3.5 and rep.error_total < q8_error < rep.error_base
    kl = {}
    for policy in ("none", "all"):
        with rm.Model(tmp_path / "m.gguf", n_ctx=128, n_threads=2, residual_policy=policy) as m:
            kl[policy] = float(_kl(ref, m.eval_logits(ids)).mean())
    assert kl["all"] <= 1e-3 and kl["none"] > 5 * kl["all"], kl


def test_arch_gpt_oss_bench_model_writes_mxfp4(tmp_path):
    """tools/make_bench_model.py --arch gpt-oss, at toy sizes: a GptOssForCausalLM checkpoint and
    its mxfp4 file (MXFP4 experts, Q8_0 attention), which runs."""
    import sys

    import gguf

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import make_bench_model

    assert make_bench_model.main([str(tmp_path), "--arch", "gpt-oss", "--layers", "2", "--experts", "4",
                                  "--hidden", "256", "--expert-ff", "512", "--heads", "4", "--kv-heads", "2",
                                  "--vocab", "1000", "--tokenizer-size", "600", "--formats", "mxfp4"]) == 0
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["GptOssForCausalLM"] and cfg["sliding_window"] == 128
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "bench-mxfp4.gguf")).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "MXFP4" and types["blk.0.attn_q.weight"] == "Q8_0"
    with rm.Model(tmp_path / "bench-mxfp4.gguf", n_ctx=64, n_threads=1) as m:
        assert np.all(np.isfinite(m.eval_logits([1, 2, 3])))


def test_arch_gpt_oss_mxfp4_form_repacked_as_llamacpp_does(mxfp4_form, tmp_path):
    """The released MXFP4 form through llama.cpp's converter and through ours (recipe mxfp4): the
    same expert bytes, so the nibble and scale repack is llama.cpp's reading of the blocks."""
    import gguf

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's converter is not at hand (LLAMA_CPP_SRC)")
    src = mxfp4_form[0]
    theirs = llamacpp.convert(src, tmp_path / "ll.gguf", "gpt-4o")
    rm.convert(src, tmp_path / "ours.gguf", recipe="mxfp4", progress=False)
    a = {t.name: t for t in gguf.GGUFReader(str(theirs)).tensors}
    b = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "ours.gguf")).tensors}
    experts = [n for n in a if "_exps.weight" in n]
    assert len(experts) == 6
    for n in experts:
        assert a[n].tensor_type == b[n].tensor_type == gguf.GGMLQuantizationType.MXFP4, n
        assert np.array_equal(np.asarray(a[n].data), np.asarray(b[n].data)), n


def test_arch_gpt_oss_sliding_layers_keep_a_ring():
    """A sliding layer's KV cache holds its window plus one step of tokens, not the context: with
    gpt-oss's window of 128, a step of 512 and a context of 32768, half the layers keep 640
    positions. (The logits tests above run rings of 9, 13 and 72 positions, wrapping in decode.)"""
    from rapidmoe_gguf._native import check, ffi, lib

    def kv(n_layer_swa):
        p = ffi.new("rm_size_params *")
        p.struct_size = ffi.sizeof("rm_size_params")
        for k, v in dict(n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_expert=32, n_expert_used=4,
                         n_ff_exp=2880, n_vocab=201088, n_ctx=32768, n_batch=512, n_swa=128,
                         n_layer_swa=n_layer_swa).items():
            setattr(p, k, v)
        out = ffi.new("rm_session_sizes *")
        out.struct_size = ffi.sizeof("rm_session_sizes")
        check(lib.rm_session_sizes_get(p, out))
        return out.kv_cache

    per_pos = 2 * 4 * 8 * 64   # K and V floats of one position and layer
    assert kv(0) == 24 * 32768 * per_pos
    assert kv(12) == (12 * 32768 + 12 * (128 + 512)) * per_pos


def test_arch_gpt_oss_planner_counts_the_rings(split_pair):
    """`rapidmoe plan` sizes a sliding layer's KV cache as the library allocates it: a ring of the
    window plus one batch (8 + 32 positions here), the full layer at n_ctx; K and V f32 rows of
    n_head_kv * head_dim = 128 floats. The stand-in's allocations then match the plan's sums."""
    from rapidmoe_gguf import planner

    hw = planner.Hardware(host_bw_gbps=50.0, context_reserve=0)
    sizes = planner.ModelSizes.from_files(split_pair)
    assert (sizes.n_swa, sizes.n_layer_swa) == (WINDOW, 1)
    row = 2 * 4 * 2 * 64
    for n_ctx in (96, 4096):
        p = planner.plan_files(split_pair, 1 << 34, n_ctx, n_batch=32, hardware=hw)
        assert p.gpu_parts["kv_cache"] == row * (n_ctx + WINDOW + 32)
    p = planner.plan_files(split_pair, 1 << 34, 20, n_batch=32, hardware=hw)
    assert p.gpu_parts["kv_cache"] == row * (20 + 20)        # the ring never exceeds the context
    with rm.Model(split_pair, n_ctx=4096, n_batch=32, n_threads=2, hardware=hw, gpu_memory=1 << 34,
                  gpu_backend="standin") as dev:
        used, plan = dev.gpu_info["used_bytes"], dev.plan
        assert used <= plan.gpu_bytes and plan.gpu_bytes - used < 0.01 * plan.gpu_bytes


def test_arch_gpt_oss_state_round_trip_with_a_wrapped_ring(tiny, tmp_path):
    """A state saved after the sliding-window layers' rings have wrapped (prompt longer than the
    window plus n_batch) continues bit for bit once loaded; a session whose ring is of another
    size (another n_batch) refuses it, naming the layer."""
    _, path, ids, _ = tiny
    assert N_PROMPT > WINDOW + 8
    want, got, _ = state_round_trip(path, ids[:N_PROMPT], ids[N_PROMPT:], tmp_path / "s.state", n_batch=8)
    assert np.array_equal(got, want)
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=16) as m3:
        with pytest.raises(rm.errors.StateError, match="ring"):
            m3.load_state(tmp_path / "s.state")
        assert m3.n_past == 0
