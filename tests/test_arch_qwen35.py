"""Qwen3.5-MoE (qwen35moe) and Qwen3-Next (qwen3next): Gated DeltaNet layers beside gated full
attention, routed experts and a gated shared expert.

Tiny random checkpoints of both transformers classes, made at test time: 4 layers (three Gated
DeltaNet, one gated attention), 2 key heads and 4 value heads in the linear layers (grouped), a
decay that matters (exp(g) well below 1), conv filters large enough to mix neighbouring tokens.

Oracles and budgets:
- transformers (f32): our logits within 1e-4 relative (max |diff| / max |logit| per position) over
  a 100-token prefill (two chunks of the chunked form) and 12 decode steps (the recurrent form);
- the recurrent form against the chunked one: decoding token by token gives the logits of one
  prefill of the same tokens within 3e-5 relative (measured 2.5e-6 to 7.5e-6: the two forms sum in
  different orders, and so do the one-token and the batched matrix products); the kernels alone are
  held to 1e-5 of a double-precision delta rule in native/tests/test_backend_gdn.c;
- llama.cpp (llama-cpp-python, F32 KV cache) on the same files, llama.cpp's converter's and ours:
  within 1e-4 relative, the same argmax at every position (measured 3e-6 to 8.5e-6);
- llama.cpp's converter on the same checkpoint (when its source is at hand: LLAMA_CPP_SRC, or
  the sdist tools/make_llamacpp_files.py unpacks): its file runs in our engine with the logits of
  our own file within 1e-5 relative, so both converters write the same layout.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf.errors import NeedsCPUError, UnsupportedError
import llamacpp_oracle as llamacpp
from conftest import VOCAB, make_tiny_tokenizer, state_round_trip
from conftest import logit_rel as _rel

KINDS = {"qwen3_next": "qwen3next", "qwen3_5_moe": "qwen35moe"}
N_PROMPT, N_DECODE = 100, 12


def init_hybrid_weights(model, seed: int, norm_std: float = 0.1, stds: tuple[tuple[str, float], ...] = ()) -> None:
    """A Gated DeltaNet hybrid's weights drawn in place: decay rates exp(A_log) in [0.5, 3.5), the
    gated norm's scale near 1, the other norms' 1 + w with w of norm_std; stds: (part of a name,
    std) for further weights; the rest 0.05, the output head 0.1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            std = next((v for part, v in stds if part in name), None)
            if name.endswith("A_log"):
                p.copy_(torch.log(0.5 + 3.0 * torch.rand(p.shape, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * noise)
            elif "conv1d" in name:
                p.copy_(0.3 * noise)
            elif name.endswith("linear_attn.norm.weight"):   # the gated norm scales by w
                p.copy_(1.0 + 0.1 * noise)
            elif p.ndim == 1 and "norm" in name:            # the others by 1 + w
                p.copy_(norm_std * noise)
            elif std is not None:
                p.copy_(std * noise)
            else:
                p.copy_((0.1 if name.startswith("lm_head") else 0.05) * noise)


def make_tiny_hybrid(out_dir, model_type: str, seed: int = 0, router_std: float = 0.05, **overrides):
    """A tiny random checkpoint of Qwen3NextForCausalLM or Qwen3_5MoeForCausalLM (f32).
    router_std: the routers' scale; wide routing margins keep rounding from flipping a token's
    experts, for the tests that compare quantized files."""
    import torch
    import transformers

    cfg_cls, model_cls = {
        "qwen3_next": (transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM),
        "qwen3_5_moe": (transformers.Qwen3_5MoeTextConfig, transformers.Qwen3_5MoeForCausalLM),
    }[model_type]
    cfg = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
               max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
               eos_token_id=2, pad_token_id=0)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**cfg)).eval()
    init_hybrid_weights(model, seed, stds=(("mlp.gate.weight", router_std),))
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    make_tiny_tokenizer(out_dir)
    return model


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """model_type -> (checkpoint dir, our f32 file, token ids, transformers' logits)."""
    import torch

    cache = {}

    def get(model_type):
        if model_type not in cache:
            d = tmp_path_factory.mktemp(f"hybrid-{model_type}")
            model = make_tiny_hybrid(d / "hf", model_type)
            out = d / "model.gguf"
            rm.convert(d / "hf", out, recipe="f32", progress=False)
            ids = np.random.default_rng(7).integers(3, VOCAB, N_PROMPT + N_DECODE).tolist()
            with torch.no_grad():
                ref = model(torch.tensor([ids])).logits[0].float().numpy()
            cache[model_type] = (d / "hf", out, ids, ref)
        return cache[model_type]

    return get


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_logits_match_transformers(hybrid, model_type):
    hf, path, ids, ref = hybrid(model_type)
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=128) as m:
        assert m.info["arch"] == KINDS[model_type]
        first = m.eval_logits(ids[:N_PROMPT])
        rest = np.stack([m.eval([t]) for t in ids[N_PROMPT:]])
    assert _rel(first, ref[:N_PROMPT]) < 1e-4
    assert _rel(rest, ref[N_PROMPT:]) < 1e-4


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_decode_equals_prefill(hybrid, model_type):
    """The recurrent form (one token per step) against the chunked one (one prefill)."""
    _, path, ids, _ = hybrid(model_type)
    ids = ids[:80]
    with rm.Model(path, n_ctx=128, n_threads=2, n_batch=128) as m:
        once = m.eval_logits(ids)
        m.reset()
        steps = np.stack([m.eval([t]) for t in ids])
        again = m.eval_logits(ids)   # after a reset: no state left from the run before
    assert _rel(steps, once) < 3e-5
    np.testing.assert_array_equal(again, once)


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_prefill_in_batches_equals_one(hybrid, model_type):
    """A prompt in several steps (the states carried between them) gives one prefill's logits."""
    _, path, ids, _ = hybrid(model_type)
    with rm.Model(path, n_ctx=128, n_threads=1, n_batch=128) as one, \
            rm.Model(path, n_ctx=128, n_threads=1, n_batch=24) as parts:
        a = one.eval_logits(ids[:N_PROMPT])
        b = parts.eval_logits(ids[:N_PROMPT])
    assert _rel(b, a) < 1e-5


def test_hybrid_fork_has_its_own_state(hybrid):
    _, path, ids, _ = hybrid("qwen3_5_moe")
    with rm.Model(path, n_ctx=64, n_threads=1) as m:
        want = m.eval_logits(ids[:20])
        m.eval(ids[20:40])                       # the parent's state moves on
        fork = m.fork_session()
        np.testing.assert_array_equal(fork.eval_logits(ids[:20]), want)
        np.testing.assert_array_equal(m.eval_logits(ids[:20]), want)


def test_hybrid_decay_matters(hybrid):
    """exp(g) = exp(-exp(A_log) softplus(a + dt_bias)) at a = 0 is well below 1: the decay is
    not close to the identity, so a wrong decay shows in the logits."""
    import torch

    hf, *_ = hybrid("qwen3_next")
    from safetensors.torch import load_file

    w = load_file(str(hf / "model.safetensors"))
    a_log = torch.stack([w[k] for k in w if k.endswith("A_log")])
    dt = torch.stack([w[k] for k in w if k.endswith("dt_bias")])
    decay = torch.exp(-a_log.exp() * torch.nn.functional.softplus(dt))
    assert decay.mean() < 0.6 and decay.max() < 0.95


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_moe"])
def test_hybrid_on_the_standin_device_equals_cpu(hybrid, kind):
    """The Gated DeltaNet layers and the gated attention through a device backend (the stand-in
    runs the backend's gdn, copy_rows and mul_sigmoid ops on the device's weights, with the
    recurrent states in its memory): a prompt, then tokens one at a time, give the CPU's logits;
    batches of sequences, a rewind to a checkpoint and a state saved and loaded run on it too."""
    from rapidmoe_gguf import planner

    _, path, ids, _ = hybrid(kind)
    hw = planner.Hardware(host_bw_gbps=20.0)
    n = len(ids) // 2
    ctx = len(ids) + 16
    with rm.Model(path, n_ctx=ctx, n_threads=2, n_batch=16, hardware=hw) as cpu, \
            rm.Model(path, n_ctx=ctx, n_threads=2, n_batch=16, hardware=hw, gpu_memory=1 << 30,
                     gpu_backend="standin") as dev:
        assert dev.backend == "standin" and dev.gpu_info["used_bytes"] > 0
        ref, got = cpu.eval_logits(ids[:n]), dev.eval_logits(ids[:n])
        ref = np.concatenate([ref, np.stack([cpu.eval([t]) for t in ids[n:]])])
        got = np.concatenate([got, np.stack([dev.eval([t]) for t in ids[n:]])])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
        prompts = [ids[:5], ids[2:9], ids[1:4]]
        assert dev.generate_many(prompts, max_tokens=4, temperature=0) == \
            cpu.generate_many(prompts, max_tokens=4, temperature=0)
        first = [m.create_completion(ids[:n], max_tokens=3, temperature=0) for m in (cpu, dev)]
        again = [m.create_completion(ids[:n + 3], max_tokens=3, temperature=0) for m in (cpu, dev)]
        assert [c["choices"][0]["text"] for c in first] == [c["choices"][0]["text"] for c in first[:1]] * 2
        assert again[0]["choices"][0]["text"] == again[1]["choices"][0]["text"]
        assert dev.last_timings["prompt_reused"] > 0     # the states' checkpoint at the first prompt's end


def test_hybrid_converter_refuses_other_layer_patterns(tmp_path):
    d = tmp_path / "hf"
    make_tiny_hybrid(d, "qwen3_5_moe")
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"] = ["full_attention", "linear_attention", "linear_attention", "full_attention"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match="not the pattern of full_attention_interval=4"):
        rm.convert(d, tmp_path / "m.gguf", recipe="f32", progress=False)


def test_hybrid_mtp_block_is_skipped(tmp_path, caplog):
    """A checkpoint with an MTP block (mtp.* tensors) converts without it, saying so."""
    import torch
    from safetensors.torch import load_file, save_file

    d = tmp_path / "hf"
    make_tiny_hybrid(d, "qwen3_5_moe")
    w = load_file(str(d / "model.safetensors"))
    w["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level("INFO", logger="rapidmoe_gguf.convert"):
        rm.convert(d, tmp_path / "m.gguf", recipe="f32", progress=False)
    assert "multi-token-prediction block" in caplog.text
    with rm.open_gguf(tmp_path / "m.gguf") as g:
        assert not any("mtp" in n or "nextn" in n for n in g.tensors)


# ---- llama.cpp's converter on the same checkpoints --------------------------------------------

def llama_cpp_convert(hf_dir, out, mtp=False):
    """llama.cpp's own converter (--no-mtp unless mtp: transformers' checkpoints have no MTP
    block); the test skips where its source is not at hand."""
    if llamacpp.src() is None:
        pytest.skip("llama.cpp's converter is not at hand (LLAMA_CPP_SRC)")
    return llamacpp.convert(hf_dir, out, "qwen35", extra=() if mtp else ("--no-mtp",))


def add_mtp_block(hf_dir):
    """Gives a checkpoint an MTP block as Qwen3.5's published ones have it: mtp.fc, its norms, and
    one decoder layer (here a copy of the last, full-attention one) under mtp.layers.0."""
    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    n, e = cfg["num_hidden_layers"], cfg["hidden_size"]
    w = load_file(str(hf_dir / "model.safetensors"))
    last = f"model.layers.{n - 1}."
    w.update({"mtp.layers.0." + k[len(last):]: v.clone() for k, v in w.items() if k.startswith(last)})
    g = torch.Generator().manual_seed(5)
    w["mtp.fc.weight"] = 0.05 * torch.randn(e, 2 * e, generator=g)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        w[f"mtp.{name}.weight"] = 0.1 * torch.randn(e, generator=g)
    save_file(w, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg["mtp_num_hidden_layers"] = 1
    (hf_dir / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_llama_cpp_file_runs_as_ours(hybrid, model_type, tmp_path):
    hf, path, ids, ref = hybrid(model_type)
    theirs = llama_cpp_convert(hf, tmp_path / "llamacpp.gguf")
    with rm.open_gguf(theirs) as g:
        assert g.hparams()["arch"] == KINDS[model_type]
    resplit = tmp_path / "resplit.gguf"   # llama.cpp's file through our converter (a GGUF source)
    rm.convert(theirs, resplit, recipe="f32", progress=False)
    with rm.Model(theirs, n_ctx=128, n_threads=2) as m, rm.Model(path, n_ctx=128, n_threads=2) as ours, \
            rm.Model(resplit, n_ctx=128, n_threads=2) as again:
        a = m.eval_logits(ids[:N_PROMPT])
        b = ours.eval_logits(ids[:N_PROMPT])
        c = again.eval_logits(ids[:N_PROMPT])
    assert _rel(a, b) < 1e-5
    assert _rel(a, ref[:N_PROMPT]) < 1e-4
    np.testing.assert_array_equal(c, a)


# ---- llama.cpp's engine on the same files -----------------------------------------------------

def llama_cpp_logits(path, ids, tmp_path):
    if llamacpp.python() is None:
        pytest.skip("llama-cpp-python is not installed (LLAMA_CPP_PYTHON)")
    return llamacpp.logits(path, ids, tmp_path)


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_logits_match_llama_cpp(hybrid, model_type, tmp_path):
    """Same file, two engines: llama.cpp's file (its converter) and ours, each in llama.cpp and here."""
    hf, path, ids, ref = hybrid(model_type)
    theirs = llama_cpp_convert(hf, tmp_path / "llamacpp.gguf")
    ids = ids[:N_PROMPT]
    for f in (theirs, path):
        lc = llama_cpp_logits(f, ids, tmp_path)
        with rm.Model(f, n_ctx=128, n_threads=2) as m:
            ours = m.eval_logits(ids)
        assert _rel(ours, lc) < 1e-4, f
        assert (ours.argmax(-1) == lc.argmax(-1)).all(), f


def test_hybrid_session_sizes_count_the_states():
    """rm_session_sizes_get: the KV cache of the attention layers only, and the linear layers'
    conv and delta-rule states beside it (with their scratch, and the four checkpoint copies of
    both that prefix reuse keeps)."""
    from rapidmoe_gguf._native import check, ffi, lib

    p = ffi.new("rm_size_params *")
    p.struct_size = ffi.sizeof("rm_size_params")
    shape = dict(n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_expert=256, n_expert_used=8,
                 n_ff_exp=512, n_ff_shexp=512, n_vocab=248320, n_ctx=32768, n_batch=256)
    for k, v in shape.items():
        setattr(p, k, v)
    out = ffi.new("rm_session_sizes *")
    out.struct_size = ffi.sizeof("rm_session_sizes")
    check(lib.rm_session_sizes_get(p, out))
    all_layers, no_state = out.kv_cache, out.recurrent_state
    assert all_layers == 2 * 4 * 40 * 32768 * 2 * 256 and no_state == 0
    # Qwen3.5-35B-A3B: 30 Gated DeltaNet layers, 16 key and 32 value heads of 128, a 4-tap conv
    p.n_layer_linear, p.ssm_d_conv, p.ssm_n_v, p.ssm_d_state, p.ssm_head_v = 30, 4, 32, 128, 128
    p.ssm_conv_dim = 2 * 16 * 128 + 32 * 128
    check(lib.rm_session_sizes_get(p, out))
    assert out.kv_cache == all_layers // 4
    # per value head: the d_k x d_v state at its chunk's start, and the unfinished chunk's keys, u
    # and log-decays (64 rows of d_k + d_v + 1)
    head = 128 * 128 + 64 * (128 + 128 + 1)
    states = 4 * 30 * (3 * p.ssm_conv_dim + 32 * head)
    kept = 5 * states   # the states and their four checkpoints
    assert kept < out.recurrent_state < kept + 4 * 256 * (2 * 8192 + 5 * 4096 + 4 * 32) + (64 << 20)


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_residual_split_acts_on_the_routed_experts(model_type, tmp_path):
    """A RESplit pair of a hybrid (Q4_0 experts and a Q4_0 residual, everything else F32): every
    residual brings the logits much nearer transformers' than the base alone (errors relative to
    the largest logit of all positions). The residuals are
    the routed experts' only; the linear layers, the attention and the shared expert are the base
    file's."""
    import torch

    model = make_tiny_hybrid(tmp_path / "hf", model_type, router_std=1.0)
    ids = np.random.default_rng(7).integers(3, VOCAB, 48).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    out = tmp_path / "pair.gguf"
    rep = rm.convert(tmp_path / "hf", out, recipe="q4_0-q4_0", other_type="F32", progress=False)   # only the experts rounded
    with rm.open_gguf(rep.residual_path) as g:
        assert g.tensors and all("_exps.residual" in n for n in g.tensors)
    errs = {}
    with rm.Model(out, n_ctx=64, n_threads=2) as m:
        for policy in ("none", "all"):
            m.set_residual(policy)
            errs[policy] = np.abs(m.eval_logits(ids) - ref).max() / np.abs(ref).max()
    assert errs["all"] < 0.5 * errs["none"], errs


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_hybrid_qwen35_chat_template_matches_transformers(hybrid, add_generation_prompt):
    """Qwen3.5's own chat template (llama.cpp keeps a copy, models/templates/Qwen3.5-4B.jinja; the
    test runs where llama.cpp's source is at hand) rendered by chat.render as transformers does."""
    from transformers import AutoTokenizer

    from rapidmoe_gguf import chat

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships Qwen3.5's template, is not at hand (LLAMA_CPP_SRC)")
    path = os.path.join(llamacpp.src(), "models", "templates", "Qwen3.5-4B.jinja")
    template = open(path, encoding="utf-8").read()
    hf, model_path, *_ = hybrid("qwen3_5_moe")
    tok = AutoTokenizer.from_pretrained(hf)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello experts"},
        {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nThe quick brown fox."},
        {"role": "user", "content": "Ünïcödé ✓ 漢字, again"},
    ]
    want = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)
    with rm.Model(model_path, n_ctx=16, n_threads=1) as m:
        t = m.tokenizer
        got = chat.render(template, messages, add_generation_prompt, bos_token=t.token_to_piece(t.bos_id).decode(),
                          eos_token=t.token_to_piece(t.eos_id).decode())
    assert got == want
    assert got.startswith("<|im_start|>system\nYou are terse.<|im_end|>") and "漢字" in got


def test_hybrid_llama_cpp_file_with_mtp_block(tmp_path):
    """llama.cpp's file of a checkpoint with an MTP block (block_count counts it, nextn_predict_layers
    says so): the block is skipped, the logits are those of the file without it."""
    d = tmp_path / "hf"
    make_tiny_hybrid(d, "qwen3_5_moe")
    plain = llama_cpp_convert(d, tmp_path / "plain.gguf")
    add_mtp_block(d)
    with_mtp = llama_cpp_convert(d, tmp_path / "mtp.gguf", mtp=True)
    with rm.open_gguf(with_mtp) as g:
        assert any(n.startswith("blk.4.") for n in g.tensors)   # the MTP block is there
    ids = np.random.default_rng(3).integers(3, VOCAB, 40).tolist()
    with rm.Model(plain, n_ctx=64, n_threads=1) as a, rm.Model(with_mtp, n_ctx=64, n_threads=1) as b:
        assert b.info["n_layer"] == 4
        np.testing.assert_array_equal(b.eval_logits(ids), a.eval_logits(ids))
    rm.convert(d, tmp_path / "ours.gguf", recipe="f32", progress=False)   # ours skips it at conversion
    with rm.open_gguf(tmp_path / "ours.gguf") as g:
        assert not any(n.startswith("blk.4.") for n in g.tensors)


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_other_head_shapes_match_transformers(model_type, tmp_path):
    """One key head serving four value heads twice its width (which llama.cpp's loader refuses,
    and transformers and this runtime run), with every second layer full attention."""
    import torch

    model = make_tiny_hybrid(tmp_path / "hf", model_type, linear_num_key_heads=1, linear_num_value_heads=4,
                             linear_key_head_dim=16, linear_value_head_dim=32, full_attention_interval=2,
                             layer_types=["linear_attention", "full_attention"] * 2)
    rm.convert(tmp_path / "hf", tmp_path / "m.gguf", recipe="f32", progress=False)
    ids = np.random.default_rng(11).integers(3, VOCAB, 70).tolist()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float().numpy()
    with rm.Model(tmp_path / "m.gguf", n_ctx=96, n_threads=2) as m:
        first = m.eval_logits(ids[:66])
        rest = np.stack([m.eval([t]) for t in ids[66:]])
    assert _rel(first, ref[:66]) < 1e-4
    assert _rel(rest, ref[66:]) < 1e-4


def _copy_with(src, dst, kv: dict):
    """src's GGUF with keys replaced or added: kv maps a key to an int or a list of bools."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in kv:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for name, value in kv.items():
        if isinstance(value, list):
            w.add_array(name, value)
        else:
            w.add_uint32(name, value)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_hybrid_bad_files_are_refused_by_name(hybrid, tmp_path):
    from rapidmoe_gguf.errors import FormatError

    _, path, *_ = hybrid("qwen3_5_moe")
    cases = [
        ({"qwen35moe.ssm.time_step_rank": 3}, FormatError,
         r"ssm.time_step_rank 3 must be a multiple of ssm.group_count 2"),
        ({"qwen35moe.attention.recurrent_layers": [True, False, True, False]}, UnsupportedError,
         r"'qwen35moe.attention.recurrent_layers' makes layer 1 full attention, but the forward pass runs only "
         r"the pattern of full_attention_interval = 4"),
        ({"qwen35moe.full_attention_interval": 2}, FormatError, r"tensor 'blk.1.attn_q.weight' is missing"),
    ]
    for i, (kv, exc, msg) in enumerate(cases):
        bad = _copy_with(path, tmp_path / f"bad{i}.gguf", kv)
        with pytest.raises(exc, match=msg):
            rm.Model(bad, n_ctx=16, n_threads=1)
    same = _copy_with(path, tmp_path / "same.gguf", {"qwen35moe.attention.recurrent_layers": [True, True, True, False]})
    with rm.Model(same, n_ctx=16, n_threads=1) as m:   # a list that agrees with the pattern loads
        assert m.info["n_layer"] == 4


@pytest.mark.parametrize("model_type", KINDS)
def test_hybrid_state_round_trip(hybrid, model_type, tmp_path):
    """The recurrent states (conv and delta rule) travel in the state: loaded into a fresh session,
    the sequence continues bit for bit, and a prompt that repeats it reuses all of it."""
    _, path, ids, _ = hybrid(model_type)
    want, got, reusable = state_round_trip(path, ids[:N_PROMPT], ids[N_PROMPT:], tmp_path / "s.state", n_ctx=256)
    assert np.array_equal(got, want) and reusable == N_PROMPT
