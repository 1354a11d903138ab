"""Converter tests on tiny random checkpoints of every architecture (see conftest.py).

Oracles: the checkpoint's own weights (read with safetensors + torch), gguf-py's GGUFReader and
dequantizers, and tables of the names/shapes/keys llama.cpp expects per architecture, written
below from llama.cpp's conventions rather than from rapidmoe_gguf.arch.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys

import gguf
import gguf.quants
import numpy as np
import pytest

from rapidmoe_gguf import convert, open_gguf, resplit
from rapidmoe_gguf.cli import main as cli_main
from rapidmoe_gguf.errors import FormatError, InvalidArgumentError, RapidMoEError, UnsupportedError
from rapidmoe_gguf.gguf_header import ggml_layout_problems, read_header
from rapidmoe_gguf.convert.safetensors_io import SafetensorsCheckpoint, SafetensorsFile
from conftest import GGUF_ARCH, TINY_ARCHS, random_iq_weights, write_gguf_like

from rapidmoe_gguf import quants

# ---------------------------------------------------------------------------------------------
# What llama.cpp expects, per architecture, for the tiny configs of conftest.py
# ---------------------------------------------------------------------------------------------

# D embd, Q n_head*head_dim, KV n_kv*head_dim, H head_dim, E experts, F expert FF, S shared FF, V vocab
DIMS = {
    "mixtral": dict(D=256, Q=256, KV=128, H=64, E=4, F=512, V=320),
    "qwen2_moe": dict(D=256, Q=256, KV=128, H=64, E=4, F=256, S=512, V=320),
    "qwen3_moe": dict(D=256, Q=256, KV=128, H=64, E=4, F=256, V=320),
    "olmoe": dict(D=256, Q=256, KV=256, H=64, E=4, F=256, V=320),
}

GLOBAL_NE = {"token_embd.weight": "D V", "output_norm.weight": "D", "output.weight": "D V"}
LAYER_NE = {
    "attn_norm.weight": "D", "attn_q.weight": "D Q", "attn_k.weight": "D KV", "attn_v.weight": "D KV",
    "attn_output.weight": "Q D", "ffn_norm.weight": "D", "ffn_gate_inp.weight": "D E",
    "ffn_gate_exps.weight": "D F E", "ffn_up_exps.weight": "D F E", "ffn_down_exps.weight": "F D E",
}
LAYER_NE_EXTRA = {
    "mixtral": {},
    "qwen2_moe": {"attn_q.bias": "Q", "attn_k.bias": "KV", "attn_v.bias": "KV",
                  "ffn_gate_inp_shexp.weight": "D", "ffn_gate_shexp.weight": "D S",
                  "ffn_up_shexp.weight": "D S", "ffn_down_shexp.weight": "S D"},
    "qwen3_moe": {"attn_q_norm.weight": "H", "attn_k_norm.weight": "H"},
    "olmoe": {"attn_q_norm.weight": "D", "attn_k_norm.weight": "D"},
}

# GGUF tensor suffix -> HF tensor suffix under model.layers.N. ({x}: the expert)
_ATTN_HF = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
            "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
            "attn_output.weight": "self_attn.o_proj.weight", "ffn_norm.weight": "post_attention_layernorm.weight"}
_QWEN_MOE_HF = {"ffn_gate_inp.weight": "mlp.gate.weight",
                "ffn_gate_exps.weight": "mlp.experts.{x}.gate_proj.weight",
                "ffn_up_exps.weight": "mlp.experts.{x}.up_proj.weight",
                "ffn_down_exps.weight": "mlp.experts.{x}.down_proj.weight"}
HF_LAYER = {
    "mixtral": {**_ATTN_HF, "ffn_gate_inp.weight": "block_sparse_moe.gate.weight",
                "ffn_gate_exps.weight": "block_sparse_moe.experts.{x}.w1.weight",
                "ffn_up_exps.weight": "block_sparse_moe.experts.{x}.w3.weight",
                "ffn_down_exps.weight": "block_sparse_moe.experts.{x}.w2.weight"},
    "qwen2_moe": {**_ATTN_HF, **_QWEN_MOE_HF,
                  "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
                  "attn_v.bias": "self_attn.v_proj.bias",
                  "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
                  "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
                  "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
                  "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight"},
    "qwen3_moe": {**_ATTN_HF, **_QWEN_MOE_HF, "attn_q_norm.weight": "self_attn.q_norm.weight",
                  "attn_k_norm.weight": "self_attn.k_norm.weight"},
    "olmoe": {**_ATTN_HF, **_QWEN_MOE_HF, "attn_q_norm.weight": "self_attn.q_norm.weight",
              "attn_k_norm.weight": "self_attn.k_norm.weight"},
}
HF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}


def _kv_expected(arch: str) -> dict:
    a = GGUF_ARCH[arch]
    d = DIMS[arch]
    kv = {
        "general.architecture": a, f"{a}.vocab_size": 320, f"{a}.context_length": 512,
        f"{a}.embedding_length": 256, f"{a}.block_count": 2, f"{a}.attention.head_count": 4,
        f"{a}.attention.head_count_kv": d["KV"] // 64, f"{a}.attention.key_length": 64,
        f"{a}.attention.value_length": 64, f"{a}.rope.dimension_count": 64,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.expert_count": 4,
        f"{a}.expert_used_count": 2,
    }
    kv.update({
        "mixtral": {"llama.feed_forward_length": 512, "llama.rope.freq_base": 1e6,
                    "llama.expert_weights_norm": True},
        "qwen2_moe": {"qwen2moe.feed_forward_length": 512, "qwen2moe.expert_feed_forward_length": 256,
                      "qwen2moe.expert_shared_feed_forward_length": 512, "qwen2moe.rope.freq_base": 1e4,
                      "qwen2moe.expert_weights_norm": False},
        "qwen3_moe": {"qwen3moe.feed_forward_length": 512, "qwen3moe.expert_feed_forward_length": 256,
                      "qwen3moe.rope.freq_base": 1e4, "qwen3moe.expert_weights_norm": True},
        "olmoe": {"olmoe.feed_forward_length": 256, "olmoe.rope.freq_base": 1e4,
                  "olmoe.expert_weights_norm": False},
    }[arch])
    return kv


def _expected_tensors(arch: str, n_layer: int = 2) -> dict[str, tuple[int, ...]]:
    d = DIMS[arch]
    ne = lambda spec: tuple(d[k] for k in spec.split())  # noqa: E731
    out = {name: ne(s) for name, s in GLOBAL_NE.items()}
    for b in range(n_layer):
        for name, s in {**LAYER_NE, **LAYER_NE_EXTRA[arch]}.items():
            out[f"blk.{b}.{name}"] = ne(s)
    return out


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _hf_weights(d) -> dict[str, np.ndarray]:
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update({k: v.to(torch.float32).numpy() for k, v in load_file(os.path.join(d, f)).items()})
    return out


def _hf_tensor(hf: dict, arch: str, gguf_name: str) -> np.ndarray:
    """The HF weight a GGUF tensor comes from (experts stacked), before any permutation."""
    if not gguf_name.startswith("blk."):
        return hf[HF_GLOBAL[gguf_name]]
    _, b, suffix = gguf_name.split(".", 2)
    hf_suffix = HF_LAYER[arch][suffix]
    if "{x}" in hf_suffix:
        return np.stack([hf[f"model.layers.{b}." + hf_suffix.format(x=x)] for x in range(DIMS[arch]["E"])])
    w = hf[f"model.layers.{b}." + hf_suffix]
    return w.reshape(-1) if suffix == "ffn_gate_inp_shexp.weight" else w


def _f32(t) -> np.ndarray:
    """A GGUFReader tensor as float32 in numpy order."""
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        tuple(int(x) for x in reversed(t.shape)))


def _tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _kv(path) -> dict:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    n_out, n_in = w.shape
    return w.reshape(n_head, n_out // n_head // 2, 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)


def _check_ggml_rules(path) -> None:
    """What llama.cpp's ggml reader requires: dense ordered offsets, names < 64 bytes, no nested
    arrays, standard type ids (our native reader checks what ggml checks); and gguf-py opens it."""
    with open_gguf(path) as g:
        assert len(g.tensors) == len(gguf.GGUFReader(path).tensors)
    h = read_header(path)
    assert ggml_layout_problems(h) == []
    reader = gguf.GGUFReader(path)
    for f in reader.fields.values():
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
            assert len(f.types) == 1 or f.types[1] != gguf.GGUFValueType.ARRAY, f.name
    assert len(reader.tensors) == len(h.tensors)
    if any(t.type_name not in ("F32", "F16", "BF16") for t in h.tensors):
        assert h.get("general.quantization_version") == 2


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def _listing(d) -> list[str]:
    return sorted(os.listdir(d))


def _copy_ckpt(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_config(d, **changes):
    p = os.path.join(d, "config.json")
    cfg = json.load(open(p))
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    json.dump(cfg, open(p, "w"))


# ---------------------------------------------------------------------------------------------
# Layout: names, shapes, keys, ggml rules
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_convert_layout_matches_llama_cpp(arch, tiny_hf, tmp_path):
    out = tmp_path / "m.gguf"
    rep = convert(tiny_hf(arch), out, "q4_0-q4_0")
    _check_ggml_rules(out)
    _check_ggml_rules(rep.residual_path)

    tensors = _tensors(out)
    expected = _expected_tensors(arch)
    assert {n: tuple(int(x) for x in t.shape) for n, t in tensors.items()} == expected
    for name, t in tensors.items():
        kind = t.tensor_type.name
        if name.endswith(("_exps.weight",)):
            assert kind == "Q4_0", name
        elif len(t.shape) == 1 or name.endswith("ffn_gate_inp.weight"):
            assert kind == "F32", name  # norms, biases, shared gate and the router stay F32
        else:
            assert kind == "Q8_0", name

    kv = _kv(out)
    for key, want in _kv_expected(arch).items():
        assert key in kv, key
        if isinstance(want, float):
            assert kv[key] == pytest.approx(want, rel=1e-6), key
        else:
            assert kv[key] == want, key
    a = GGUF_ARCH[arch]
    if a in ("llama", "olmoe"):
        assert f"{a}.expert_feed_forward_length" not in kv  # the experts use feed_forward_length
    fields = gguf.GGUFReader(out).fields
    assert fields[f"{a}.block_count"].types == [gguf.GGUFValueType.UINT32]
    assert fields[f"{a}.rope.freq_base"].types == [gguf.GGUFValueType.FLOAT32]
    assert fields[f"{a}.expert_weights_norm"].types == [gguf.GGUFValueType.BOOL]
    assert kv["general.quantization_version"] == 2
    assert kv["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert len(kv["tokenizer.ggml.tokens"]) == 320
    assert kv["tokenizer.ggml.eos_token_id"] == 2
    assert "<|im_start|>" in kv["tokenizer.chat_template"]
    ours = sorted(k for k in kv if k.startswith("rapidmoe."))
    assert ours == ["rapidmoe.format_version", "rapidmoe.recipe", "rapidmoe.uuid"]
    assert kv["rapidmoe.format_version"] == 1 and kv["rapidmoe.recipe"] == "q4_0-q4_0"

    side = _tensors(rep.residual_path)
    assert rep.residual_path == str(tmp_path / "m.residual.gguf")
    want_res = {n[:-len(".weight")] + ".residual": s for n, s in expected.items() if n.endswith("_exps.weight")}
    assert {n: tuple(int(x) for x in t.shape) for n, t in side.items()} == want_res
    skv = _kv(rep.residual_path)
    assert skv["general.architecture"] == a
    assert skv["rapidmoe.format_version"] == 1
    assert skv["rapidmoe.base_type"] == "Q4_0" and skv["rapidmoe.residual_type"] == "Q4_0"
    assert skv["rapidmoe.base.uuid"] == kv["rapidmoe.uuid"]
    assert skv["rapidmoe.base.tensor_info_sha256"] == resplit.base_identity(out)[1]
    resplit.check_pair(out, rep.residual_path)
    assert not resplit.is_split_name(rep.residual_path)


# Names llama.cpp's loader reads for an architecture though gguf-py's list for it lacks them: its
# gemma4 loader takes the experts' gate and up apart where the fused ffn_gate_up_exps is absent
# (src/models/gemma4.cpp; test_arch_gemma4 runs llama.cpp on such a file).
ALSO_READ = {"gemma4": {"blk.{bid}.ffn_gate_exps", "blk.{bid}.ffn_up_exps"}}
# Keys llama.cpp 0.3.36 reads (src/llama-arch.cpp) that the gguf-py release on PyPI does not list yet.
ALSO_KEYS = {"{arch}.attention.value_scale", "{arch}.attention.indexer.types"}
# Architectures llama.cpp 0.3.36 loads that that gguf-py release does not list, with the one whose
# names they share (src/models/deepseek32.cpp binds glm-dsa's tensors and keys).
ALSO_ARCHS = {"deepseek32": "glm-dsa"}


def _vendored_gguf_constants():
    """gguf-py's constants as llama.cpp 0.3.36's source ships them (a module of enums alone), or
    None where that source is not at hand."""
    import importlib.util

    import llamacpp_oracle as llamacpp

    if llamacpp.src() is None:
        return None
    spec = importlib.util.spec_from_file_location("vendored_gguf_constants",
                                                  os.path.join(llamacpp.src(), "gguf-py", "gguf", "constants.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_convert_names_and_keys_are_gguf_py_names():
    """Every tensor name and key in the ArchSpec table is one gguf-py knows for that arch: the
    release on PyPI, or for an architecture it does not list yet (qwen4exp) the gguf-py that
    llama.cpp 0.3.36's source ships; where that source is not at hand such architectures are
    skipped, by name, after the others are checked."""
    from rapidmoe_gguf.arch import ARCHS

    vendored, unchecked = None, []
    for spec in ARCHS.values():
        known_as = ALSO_ARCHS.get(spec.name, spec.name)
        names = gguf
        if known_as not in gguf.MODEL_ARCH_NAMES.values():
            vendored = vendored or _vendored_gguf_constants()
            if vendored is None:
                unchecked.append(spec.name)
                continue
            names = vendored
        arch_enum = next(k for k, v in names.MODEL_ARCH_NAMES.items() if v == known_as)
        known = {names.TENSOR_NAMES[t] for t in names.MODEL_TENSORS[arch_enum]} | ALSO_READ.get(spec.name, set())
        assert known & ALSO_READ.get(spec.name, set()) <= set(names.TENSOR_NAMES.values())
        for t in spec.tensors:
            base = t.gguf if t.gguf in known else t.gguf.rsplit(".", 1)[0]   # "blk.{bid}.ssm_a" has no suffix
            assert base in known, (spec.name, t.gguf)
            assert len(t.gguf.format(bid=999)) + len(".residual") < 64
        classes = [c for c in vars(names.Keys).values() if isinstance(c, type)]
        classes += [n for c in classes for n in vars(c).values() if isinstance(n, type)]   # Attention.Indexer
        all_keys = {v for cls in classes for v in vars(cls).values() if isinstance(v, str)} | ALSO_KEYS
        for h in spec.hparams:
            # our own keys (rapidmoe.*) carry what GGUF has no key for: YaRN's truncate, the Gated
            # DeltaNet's output gate
            assert h.key is None or h.key in all_keys or h.key.startswith(("rapidmoe.rope.", "rapidmoe.ssm.")), \
                (spec.name, h.key)
    if unchecked:
        pytest.skip(f"{', '.join(unchecked)}: gguf-py {getattr(gguf, '__version__', '')} does not list them and "
                    "llama.cpp's source (LLAMA_CPP_SRC), whose gguf-py does, is not at hand")


# ---------------------------------------------------------------------------------------------
# Values: exact for f32, reconstruction bounds for the split recipes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_convert_f32_reproduces_weights_exactly(arch, tiny_hf, tmp_path):
    src = tiny_hf(arch)
    out = tmp_path / "m.gguf"
    rep = convert(src, out, "f32")
    assert rep.residual_path is None and not os.path.exists(tmp_path / "m.residual.gguf")
    assert rep.error_base == 0.0 and rep.bpw_base == 32.0
    hf = _hf_weights(src)
    for name, t in _tensors(out).items():
        assert t.tensor_type.name == "F32", name
        got, want = _f32(t), _hf_tensor(hf, arch, name)
        if arch == "mixtral" and name.endswith(("attn_q.weight", "attn_k.weight")):
            n_head = 4 if "attn_q" in name else 2
            assert not np.array_equal(got, want)  # llama.cpp's interleaved RoPE order
            got = _unpermute(got, n_head)
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_convert_bf16_checkpoint_is_read_exactly(tiny_hf, tmp_path):
    src = tiny_hf("qwen3_moe", "bfloat16")
    st = SafetensorsFile(os.path.join(src, "model.safetensors"))
    assert {e.dtype for e in st.entries.values()} == {"BF16"}
    st.close()
    out = tmp_path / "m.gguf"
    convert(src, out, "f32")
    hf = _hf_weights(src)  # torch's bf16 -> f32
    for name, t in _tensors(out).items():
        np.testing.assert_array_equal(_f32(t), _hf_tensor(hf, "qwen3_moe", name), err_msg=name)
    # f16 recipe from bf16: the experts are F16 within half precision
    rep = convert(src, tmp_path / "h.gguf", "f16")
    assert rep.error_base < 1e-3 and rep.base_types["F16"].count > 0


# Relative Frobenius error bounds over all expert tensors (Gaussian weights, std 0.05), and how many
# times smaller base+residual must be than base alone. Measured on these checkpoints (base / total):
# q4k-q8 0.071 / 0.00030, q3k-q8 0.151 / 0.00066, q2k-q4 0.297 / 0.0223, q4_0-q4_0 0.086 / 0.0059,
# q8_0 0.0054, f16 0.0002, iq2xxs-q4 0.346 / 0.0244, iq3xxs-q8 0.179 / 0.00101; the bounds leave
# 20-50% headroom (10-30% for the IQ recipes).
RECIPE_BOUNDS = {
    #  recipe       base<=  total<=  factor>=  bpw_base  bpw_total
    "q4k-q8":      (0.09,   0.0005,  100.0,    4.5,      13.0),
    "q3k-q8":      (0.18,   0.001,   100.0,    3.4375,   11.9375),
    "q2k-q4":      (0.35,   0.03,    10.0,     2.625,    7.125),
    "q4_0-q4_0":   (0.10,   0.008,   10.0,     4.5,      9.0),
    "q8_0":        (0.007,  0.007,   1.0,      8.5,      8.5),
    "f16":         (5e-4,   5e-4,    1.0,      16.0,     16.0),
    "iq2xxs-q4":   (0.38,   0.03,    10.0,     2.0625,   6.5625),
    "iq3xxs-q8":   (0.20,   0.0013,  100.0,    3.0625,   11.5625),
}


@pytest.mark.parametrize("recipe", list(RECIPE_BOUNDS))
def test_convert_reconstruction_within_bounds(recipe, tiny_hf, tmp_path):
    base_max, total_max, factor, bpw_base, bpw_total = RECIPE_BOUNDS[recipe]
    arch = "qwen3_moe"
    src = tiny_hf(arch)
    out = tmp_path / "m.gguf"
    rep = convert(src, out, recipe)
    assert rep.bpw_base == pytest.approx(bpw_base) and rep.bpw_total == pytest.approx(bpw_total)
    hf = _hf_weights(src)
    base = _tensors(out)
    side = _tensors(rep.residual_path) if rep.residual_path else {}
    num_b = num_t = den = 0.0
    for name, t in base.items():
        if not name.endswith("_exps.weight"):
            continue
        w = _hf_tensor(hf, arch, name)
        b = _f32(t)
        bt = b + _f32(side[name[:-len(".weight")] + ".residual"]) if side else b
        num_b += float(np.sum((b - w) ** 2))
        num_t += float(np.sum((bt - w) ** 2))
        den += float(np.sum(w ** 2))
        assert _rel(bt, w) <= total_max, name
    err_b, err_t = (num_b / den) ** 0.5, (num_t / den) ** 0.5
    assert err_b <= base_max and err_t <= total_max
    assert err_t * factor <= err_b or factor == 1.0
    # the report measures the same thing the file holds
    assert rep.error_base == pytest.approx(err_b, rel=1e-3)
    assert rep.error_total == pytest.approx(err_t, rel=1e-3)


def test_convert_fallback_types_for_odd_rows(tiny_hf, tmp_path, caplog):
    """Expert FF 200: down_exps rows (ne[0] = 200) fit no 32-block type, so base and residual
    fall back to F16; gate/up (ne[0] = 256) keep the recipe's types. Reported and logged."""
    src = tiny_hf("qwen3_moe", moe_intermediate_size=200)
    out = tmp_path / "m.gguf"
    with caplog.at_level(logging.WARNING, logger="rapidmoe_gguf"):
        rep = convert(src, out, "q4_0-q4_0")
    base, side = _tensors(out), _tensors(rep.residual_path)
    assert base["blk.0.ffn_down_exps.weight"].tensor_type.name == "F16"
    assert base["blk.0.ffn_up_exps.weight"].tensor_type.name == "Q4_0"
    assert side["blk.0.ffn_down_exps.residual"].tensor_type.name == "F16"
    got = {(f.tensor, f.wanted, f.used) for f in rep.fallbacks}
    for b in (0, 1):
        assert (f"blk.{b}.ffn_down_exps.weight", "Q4_0", "F16") in got
        assert (f"blk.{b}.ffn_down_exps.residual", "Q4_0", "F16") in got
    assert len(rep.fallbacks) == 4
    assert all("row length 200" in f.reason for f in rep.fallbacks)
    assert sum("blk.0.ffn_down_exps.weight" in r.message for r in caplog.records) == 1
    _check_ggml_rules(out)
    resplit.check_pair(out, rep.residual_path)


def test_convert_fallback_k_quant_to_32_block(tiny_hf, tmp_path):
    src = tiny_hf("qwen3_moe", moe_intermediate_size=288)  # 288 % 256 != 0, 288 % 32 == 0
    rep = convert(src, tmp_path / "m.gguf", "q4k-q8")
    base = _tensors(tmp_path / "m.gguf")
    assert base["blk.1.ffn_down_exps.weight"].tensor_type.name == "Q5_0"
    assert base["blk.1.ffn_gate_exps.weight"].tensor_type.name == "Q4_K"
    assert {(f.wanted, f.used) for f in rep.fallbacks} == {("Q4_K", "Q5_0")}
    assert rep.error_total < 0.012


def test_convert_sharded_checkpoint_same_as_single(tiny_hf, tmp_path):
    single = tiny_hf("mixtral")
    sharded = tiny_hf("mixtral", max_shard_size="300KB")
    names = os.listdir(sharded)
    assert "model.safetensors.index.json" in names and sum(n.endswith(".safetensors") for n in names) > 2
    convert(single, tmp_path / "a.gguf", "f32")
    convert(sharded, tmp_path / "b.gguf", "f32")
    a, b = _tensors(tmp_path / "a.gguf"), _tensors(tmp_path / "b.gguf")
    assert list(a) == list(b)
    for n in a:
        np.testing.assert_array_equal(np.asarray(a[n].data), np.asarray(b[n].data), err_msg=n)


def test_convert_tied_embeddings(tiny_hf, tmp_path):
    """Without lm_head: qwen3moe/llama omit output.weight (llama.cpp reuses token_embd);
    olmoe/qwen2moe need it, so it is written from the embeddings."""
    for arch, has_output in (("qwen3_moe", False), ("olmoe", True)):
        src = tiny_hf(arch, tie_word_embeddings=True)
        assert "lm_head.weight" not in _hf_weights(src)
        out = tmp_path / f"{arch}.gguf"
        convert(src, out, "f32")
        t = _tensors(out)
        assert ("output.weight" in t) == has_output
        if has_output:
            np.testing.assert_array_equal(np.asarray(t["output.weight"].data),
                                          np.asarray(t["token_embd.weight"].data))


# ---------------------------------------------------------------------------------------------
# GGUF input
# ---------------------------------------------------------------------------------------------

def test_convert_gguf_input_resplits(tiny_hf, tmp_path):
    src = tiny_hf("qwen2_moe")
    q8 = tmp_path / "q8.gguf"
    convert(src, q8, "q8_0")
    recipe = "q4k-q8"
    out = tmp_path / "pair.gguf"
    rep = convert(q8, out, recipe)
    _check_ggml_rules(out)
    resplit.check_pair(out, rep.residual_path)

    kin, kout = _kv(q8), _kv(out)
    for k, v in kin.items():  # metadata (hparams, tokenizer, name) is kept
        if k.startswith("rapidmoe.") or k in ("general.file_type",):
            continue
        assert kout[k] == v, k
    assert kout["rapidmoe.uuid"] != kin["rapidmoe.uuid"]
    assert kout["rapidmoe.recipe"] == recipe

    tin, tout, side = _tensors(q8), _tensors(out), _tensors(rep.residual_path)
    assert list(tin) == list(tout)
    for name, t in tout.items():
        if name.endswith("_exps.weight"):
            w = _f32(tin[name])  # the input's weights are what the pair reconstructs
            r = _f32(side[name[:-len(".weight")] + ".residual"])
            assert _rel(_f32(t) + r, w) < 0.012, name
            assert _rel(_f32(t), w) > 5 * _rel(_f32(t) + r, w), name
        else:  # Q8_0 / F32 already at least as precise as other_type: bytes kept
            assert t.tensor_type == tin[name].tensor_type, name
            np.testing.assert_array_equal(np.asarray(t.data), np.asarray(tin[name].data), err_msg=name)


def test_convert_gguf_input_same_base_type_copies_expert_bytes(tiny_hf, tmp_path):
    src = tiny_hf("mixtral")
    q8 = tmp_path / "q8.gguf"
    convert(src, q8, "q8_0")
    out = tmp_path / "same.gguf"
    # base type equals the input's expert type: B is the input itself, R would be zero, so no
    # residual tensor (and here no sidecar at all) is written
    rep = convert(q8, out, "q4_0-q4_0", base_type="Q8_0")
    assert rep.residual_path is None and not os.path.exists(tmp_path / "same.residual.gguf")
    assert rep.error_base is None
    tin, tout = _tensors(q8), _tensors(out)
    for name in tin:
        assert tout[name].tensor_type == tin[name].tensor_type
        np.testing.assert_array_equal(np.asarray(tout[name].data), np.asarray(tin[name].data), err_msg=name)
    assert _kv(out)["rapidmoe.recipe"] == "q4_0-q4_0[base=Q8_0,residual=Q4_0,other=Q8_0]"


def test_convert_gguf_input_with_iq_experts_resplits(tiny_hf, tmp_path):
    """A llama.cpp-style file whose experts are IQ2_XXS (random valid blocks) becomes a pair
    whose base + residual reconstruct gguf-py's dequantization of them, and the pair runs."""
    import rapidmoe_gguf as rm

    q8 = tmp_path / "q8.gguf"
    convert(tiny_hf("qwen3_moe"), q8, "q8_0")
    iq, want = {}, {}
    for k, t in enumerate(gguf.GGUFReader(q8).tensors):
        if t.name.endswith("_exps.weight"):
            data, want[t.name] = random_iq_weights("IQ2_XXS", tuple(int(x) for x in reversed(t.shape)), seed=k)
            iq[t.name] = (data, gguf.GGMLQuantizationType.IQ2_XXS)
    assert len(iq) == 6
    src = tmp_path / "iq2.gguf"
    write_gguf_like(q8, src, iq)
    out = tmp_path / "pair.gguf"
    rep = convert(src, out, "q4k-q8")
    resplit.check_pair(out, rep.residual_path)
    tout, side = _tensors(out), _tensors(rep.residual_path)
    for name, w in want.items():
        assert tout[name].tensor_type.name == "Q4_K"
        r = _f32(side[name[:-len(".weight")] + ".residual"])
        assert _rel(_f32(tout[name]) + r, w.reshape(r.shape)) < 0.012, name
    with rm.Model(out, n_ctx=32, n_threads=2) as m:
        assert np.all(np.isfinite(m.eval_logits([1, 2, 3])))


def test_convert_gguf_input_lifts_less_precise_tensors(tiny_hf, tmp_path):
    """Non-expert tensors less precise than other_type are converted up to it."""
    src = tiny_hf("olmoe")
    q4 = tmp_path / "q4.gguf"
    convert(src, q4, "q4_0-q4_0", residual_type="none", other_type="Q4_0")
    out = tmp_path / "o.gguf"
    convert(q4, out, "q8_0")
    tin, tout = _tensors(q4), _tensors(out)
    assert tin["blk.0.attn_q.weight"].tensor_type.name == "Q4_0"
    assert tout["blk.0.attn_q.weight"].tensor_type.name == "Q8_0"
    assert _rel(_f32(tout["blk.0.attn_q.weight"]), _f32(tin["blk.0.attn_q.weight"])) < 0.01


# ---------------------------------------------------------------------------------------------
# Bad inputs: a clear error, and nothing left behind
# ---------------------------------------------------------------------------------------------

def _assert_fails_clean(tmp_path, src, exc_type, match, recipe="q4_0-q4_0"):
    outdir = tmp_path / "out"
    outdir.mkdir()
    with pytest.raises(exc_type, match=match):
        convert(src, outdir / "m.gguf", recipe)
    assert _listing(outdir) == []


def test_convert_error_unknown_architecture(tiny_hf, tmp_path):
    d = _copy_ckpt(tiny_hf("qwen3_moe"), tmp_path / "src")
    _edit_config(d, architectures=["FooMoeForCausalLM"])
    _assert_fails_clean(tmp_path, d, UnsupportedError, r"unknown architecture FooMoeForCausalLM")


def test_convert_error_missing_config_key(tiny_hf, tmp_path):
    d = _copy_ckpt(tiny_hf("qwen3_moe"), tmp_path / "src")
    _edit_config(d, moe_intermediate_size=None)
    _assert_fails_clean(tmp_path, d, FormatError, r"config.json: missing 'moe_intermediate_size'")


def test_convert_error_tensor_shape_mismatch(tiny_hf, tmp_path):
    d = _copy_ckpt(tiny_hf("mixtral"), tmp_path / "src")
    _edit_config(d, intermediate_size=768)
    _assert_fails_clean(tmp_path, d, FormatError,
                        r"tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' has shape "
                        r"\[512, 256\] but config.json implies \[768, 256\]")


def test_convert_error_unused_tensors(tiny_hf, tmp_path):
    d = _copy_ckpt(tiny_hf("qwen3_moe"), tmp_path / "src")
    _edit_config(d, num_hidden_layers=1)
    _assert_fails_clean(tmp_path, d, FormatError, r"tensor\(s\) that the qwen3moe layout does not use")


def test_convert_error_truncated_safetensors(tiny_hf, tmp_path):
    d = _copy_ckpt(tiny_hf("olmoe"), tmp_path / "src")
    p = d / "model.safetensors"
    size = p.stat().st_size
    with open(p, "r+b") as f:
        f.truncate(size - 1000)
    _assert_fails_clean(tmp_path, d, FormatError, r"model.safetensors: tensor '[^']+': data ends at byte "
                        rf"\d+ but the file has only {size - 1000} bytes \(truncated\?\)")


def test_convert_error_dense_layers_unsupported(tiny_hf, tmp_path):
    d = _copy_ckpt(tiny_hf("qwen3_moe"), tmp_path / "src")
    _edit_config(d, mlp_only_layers=[1])
    _assert_fails_clean(tmp_path, d, UnsupportedError, r"dense layers")


def test_convert_error_residual_of_another_base(tiny_hf, tmp_path):
    src = tiny_hf("qwen3_moe")
    a = convert(src, tmp_path / "a.gguf", "q4_0-q4_0")
    b = convert(src, tmp_path / "b.gguf", "q4_0-q4_0")
    resplit.check_pair(a.base_path, a.residual_path)
    with pytest.raises(FormatError, match=r"b.residual.gguf does not belong to .*a.gguf: it was made for base uuid"):
        resplit.check_pair(a.base_path, b.residual_path)
    # another base of the same model (other recipe, other uuid): refused too
    c = convert(src, tmp_path / "c.gguf", "q8_0")
    with pytest.raises(FormatError, match="does not belong"):
        resplit.check_pair(c.base_path, a.residual_path)
    with pytest.raises(FormatError, match="not a RESplit residual file"):
        resplit.check_pair(a.base_path, c.base_path)


def test_convert_error_unwritable_out(tiny_hf, tmp_path):
    src = tiny_hf("qwen3_moe")
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    with pytest.raises(InvalidArgumentError, match=r"file.txt is not an existing directory"):
        convert(src, afile / "m.gguf", "q8_0")
    with pytest.raises(InvalidArgumentError, match=r"no/such is not an existing directory"):
        convert(src, tmp_path / "no" / "such" / "m.gguf", "q8_0")
    (tmp_path / "d.gguf").mkdir()
    with pytest.raises(InvalidArgumentError, match=r"d.gguf: it is a directory"):
        convert(src, tmp_path / "d.gguf", "q8_0")
    with pytest.raises(InvalidArgumentError, match=r"must be a NAME.gguf path"):
        convert(src, tmp_path / "m.bin", "q8_0")
    assert _listing(tmp_path) == ["d.gguf", "file.txt"]


def test_convert_error_write_failure_leaves_nothing(tiny_hf, tmp_path, monkeypatch):
    import importlib

    convert_mod = importlib.import_module("rapidmoe_gguf.convert.pipeline")  # the module, not the function
    real = convert_mod._Out.write
    calls = {"n": 0}

    def failing_write(self, data):
        calls["n"] += 1
        if calls["n"] == 10:
            raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(convert_mod._Out, "write", failing_write)
    _assert_fails_clean(tmp_path, tiny_hf("qwen3_moe"), RapidMoEError, r"cannot write .*m.gguf: No space left on device")


def test_convert_interrupt_keeps_existing_out(tiny_hf, tmp_path, monkeypatch):
    src = tiny_hf("qwen3_moe")
    out = tmp_path / "m.gguf"
    side = tmp_path / "m.residual.gguf"
    out.write_bytes(b"old base")
    side.write_bytes(b"old residual")
    real = quants.quantize
    calls = {"n": 0}

    def interrupted(*a, **k):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(quants, "quantize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(src, out, "q4_0-q4_0")
    assert _listing(tmp_path) == ["m.gguf", "m.residual.gguf"]
    assert out.read_bytes() == b"old base" and side.read_bytes() == b"old residual"
    monkeypatch.setattr(quants, "quantize", real)
    # success replaces both; then a recipe without residual sets the now stale sidecar aside
    rep = convert(src, out, "q4_0-q4_0")
    resplit.check_pair(out, side)
    assert rep.residual_path == str(side)
    rep = convert(src, out, "q8_0")
    assert _listing(tmp_path) == ["m.gguf", os.path.basename(rep.kept_sidecar)]


def test_convert_error_bad_recipe_and_type():
    with pytest.raises(InvalidArgumentError, match="unknown recipe 'q9'"):
        convert("x", "y.gguf", "q9")
    with pytest.raises(InvalidArgumentError, match="base type 'Q7_K' is not supported"):
        convert("x", "y.gguf", base_type="Q7_K")


def test_convert_error_gguf_input_not_moe(tmp_path):
    p = tmp_path / "dense.gguf"
    w = gguf.GGUFWriter(p, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    _assert_fails_clean(tmp_path, p, UnsupportedError, r"llama.expert_count is 0; not an MoE model")
    p2 = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(p2, "gemma")
    w.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match=r"architecture 'gemma' is not supported"):
        convert(p2, tmp_path / "o.gguf")


# ---------------------------------------------------------------------------------------------
# The safetensors reader
# ---------------------------------------------------------------------------------------------

def _write_st(path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + data)


def test_convert_safetensors_reader_checks_header(tmp_path):
    p = tmp_path / "x.safetensors"
    good = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "BF16", "shape": [2], "data_offsets": [16, 20]}}
    data = np.arange(4, dtype="<f4").tobytes() + np.array([0x3F80, 0xC000], "<u2").tobytes()
    _write_st(p, good, data)
    with SafetensorsFile(p) as st:
        np.testing.assert_array_equal(st.read_f32("a"), np.arange(4, dtype=np.float32).reshape(2, 2))
        np.testing.assert_array_equal(st.read_f32("b"), np.array([1.0, -2.0], np.float32))
    cases = [
        ({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, r"tensor 'a': data_offsets span 12 bytes"),
        ({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}, r"tensor 'a': unknown dtype 'Q9'"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}}, r"tensor 'a': bad shape"),
        ({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, r"overlaps"),
        ({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}, r"tensor 'a': data ends at byte .* \(truncated"),
    ]
    for header, match in cases:
        _write_st(p, header, data)
        with pytest.raises(FormatError, match=match) as info:
            SafetensorsFile(p)
        assert str(p) in str(info.value)
    p.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(FormatError, match=r"x.safetensors: header length"):
        SafetensorsFile(p)
    p.write_bytes((5).to_bytes(8, "little") + b"{nope")
    with pytest.raises(FormatError, match=r"x.safetensors: header is not valid JSON"):
        SafetensorsFile(p)


def test_convert_safetensors_index_must_match_shards(tiny_hf, tmp_path):
    d = _copy_ckpt(tiny_hf("mixtral", max_shard_size="300KB"), tmp_path / "src")
    idx = json.load(open(d / "model.safetensors.index.json"))
    with SafetensorsCheckpoint(d) as ck:
        assert set(ck.names) == set(idx["weight_map"])
    name = next(iter(idx["weight_map"]))
    other = sorted(set(idx["weight_map"].values()) - {idx["weight_map"][name]})[0]
    idx["weight_map"][name] = other
    json.dump(idx, open(d / "model.safetensors.index.json", "w"))
    with pytest.raises(FormatError, match=rf"tensor '{name}' is listed in {other}"):
        SafetensorsCheckpoint(d)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def test_convert_cli_convert_and_inspect(tiny_hf, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert cli_main(["convert", str(tiny_hf("qwen2_moe")), str(out), "--recipe", "q4_0-q4_0", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "m.residual.gguf" in text and "9.000 base+residual" in text
    assert cli_main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "qwen2moe" and info["kind"] == "base"
    assert info["hparams"]["expert_count"] == 4
    assert info["rapidmoe"]["rapidmoe.recipe"] == "q4_0-q4_0"
    assert info["sidecar"]["matches"] is True
    assert info["experts"]["bpw_base"] == pytest.approx(4.5)
    assert info["experts"]["bpw_base_residual"] == pytest.approx(9.0)
    assert info["types"]["Q4_0"]["count"] == 6
    assert cli_main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "qwen2moe" in text and "matches" in text and "4.500 bits/weight base" in text
    assert cli_main(["inspect", str(tmp_path / "m.residual.gguf")]) == 0
    assert "residual" in capsys.readouterr().out


def test_convert_cli_errors_are_one_line(tiny_hf, tmp_path, capsys):
    d = _copy_ckpt(tiny_hf("qwen3_moe"), tmp_path / "src")
    _edit_config(d, architectures=["NopeForCausalLM"])
    assert cli_main(["convert", str(d), str(tmp_path / "m.gguf")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "NopeForCausalLM" in err and "Traceback" not in err
    assert cli_main(["inspect", str(tmp_path / "missing.gguf")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_convert_progress_bar(tiny_hf, tmp_path, capsys):
    convert(tiny_hf("olmoe"), tmp_path / "m.gguf", "q8_0", progress=True)
    assert "100%" in capsys.readouterr().err
    convert(tiny_hf("olmoe"), tmp_path / "m.gguf", "q8_0", progress=False)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------
# tools/make_big_checkpoint.py at a small size
# ---------------------------------------------------------------------------------------------

def test_convert_make_big_checkpoint_small(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "big"
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "make_big_checkpoint.py"), str(out),
                        "--size-gb", "0.004", "--shard-mb", "1", "--hidden", "256", "--heads", "4",
                        "--kv-heads", "2", "--head-dim", "64", "--experts", "4", "--expert-ff", "256"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=root))
    assert r.returncode == 0, r.stderr
    idx = json.load(open(out / "model.safetensors.index.json"))
    shards = set(idx["weight_map"].values())
    assert len(shards) >= 3
    total = sum((out / s).stat().st_size for s in shards)
    assert total >= 0.004e9
    with SafetensorsCheckpoint(out) as ck:
        assert {ck.entry(n).dtype for n in ck.names} == {"BF16"}
    rep = convert(out, tmp_path / "big.gguf", "q4_0-q4_0")
    assert rep.error_total < 0.012


_PEAK_RSS_SCRIPT = """
import resource, sys
from rapidmoe_gguf import convert
convert(sys.argv[1], sys.argv[2], "q4_0-q4_0", progress=False)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_convert_streaming_peak_memory(tmp_path):
    """A 0.32 GB bf16 checkpoint (2.6 MB per expert matrix in float32) converts within ~100 MB of
    peak RSS over the interpreter's own: memory follows one tensor, not the model."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    subprocess.run([sys.executable, os.path.join(root, "tools", "make_big_checkpoint.py"), str(tmp_path / "ck"),
                    "--size-gb", "0.3", "--shard-mb", "100"], check=True, env=env, capture_output=True)
    base = subprocess.run([sys.executable, "-c", "import resource, numpy, gguf, rapidmoe_gguf; "
                           "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"],
                          check=True, env=env, capture_output=True, text=True, cwd=root)
    r = subprocess.run([sys.executable, "-c", _PEAK_RSS_SCRIPT, str(tmp_path / "ck"), str(tmp_path / "m.gguf")],
                       check=True, env=env, capture_output=True, text=True, cwd=root)
    extra = int(r.stdout.split()[-1]) - int(base.stdout.split()[-1])
    assert extra < 100e6, f"peak RSS grew by {extra / 1e6:.0f} MB"


# ---------------------------------------------------------------------------------------------
# Never lose the source, a sidecar, or a half-written file
# ---------------------------------------------------------------------------------------------

def _digest(*paths) -> list[str]:
    import hashlib

    return [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths]


def test_convert_refuses_out_that_is_the_source_or_its_sidecar(tiny_hf, tmp_path):
    src = convert(tiny_hf("qwen3_moe"), tmp_path / "x.gguf", "q4_0-q4_0")
    x, xr = src.base_path, src.residual_path
    before = _digest(x, xr)
    os.symlink(x, tmp_path / "link.gguf")                       # OUT is SRC through a link
    os.link(xr, tmp_path / "hard.residual.gguf")                # OUT's sidecar is SRC's sidecar
    os.symlink(xr, tmp_path / "side.gguf")                      # OUT is SRC's sidecar
    listing = _listing(tmp_path)
    for out in (x, tmp_path / "link.gguf", tmp_path / "hard.gguf", tmp_path / "side.gguf"):
        with pytest.raises(InvalidArgumentError, match=r"is the same file as the source"):
            convert(x, out, "q8_0")
        assert _digest(x, xr) == before and _listing(tmp_path) == listing
    # converting the sidecar's own base elsewhere is fine, and leaves the source pair alone
    convert(x, tmp_path / "y.gguf", "q8_0")
    assert _digest(x, xr) == before


def test_convert_keeps_a_sidecar_the_new_base_cannot_use(tiny_hf, tmp_path, caplog):
    src = tiny_hf("qwen3_moe")
    out, side = tmp_path / "m.gguf", tmp_path / "m.residual.gguf"
    convert(src, out, "q4_0-q4_0")
    old = side.read_bytes()
    with caplog.at_level(logging.WARNING, logger="rapidmoe_gguf.convert"):
        rep = convert(src, out, "q8_0")          # no residual: the old sidecar fits no base now
    assert not side.exists()
    assert rep.kept_sidecar is not None and os.path.dirname(rep.kept_sidecar) == str(tmp_path)
    assert open(rep.kept_sidecar, "rb").read() == old
    assert os.path.basename(rep.kept_sidecar) in caplog.text
    assert _listing(tmp_path) == sorted(["m.gguf", os.path.basename(rep.kept_sidecar)])


def _fsync_log(monkeypatch) -> list[str]:
    """Every path fsync'd from now on (through /proc/self/fd)."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        fd = fd if isinstance(fd, int) else fd.fileno()
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_convert_fsyncs_files_and_folder(tiny_hf, tmp_path, monkeypatch):
    synced = _fsync_log(monkeypatch)
    convert(tiny_hf("qwen3_moe"), tmp_path / "m.gguf", "q4_0-q4_0")
    names = [os.path.basename(p) for p in synced]
    assert sum(".m.gguf.partial-" in n for n in names) == 1
    assert sum(".m.residual.gguf.partial-" in n for n in names) == 1
    assert str(tmp_path) in synced[2:], synced     # the folder, after the renames


def test_convert_temp_files_are_unpredictable_and_never_follow_links(tiny_hf, tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    # the names an older converter would have used
    for name in (f".m.gguf.partial-{os.getpid()}", f".m.residual.gguf.partial-{os.getpid()}"):
        os.symlink(victim, tmp_path / name)
    seen = []
    real = resplit.check_pair
    monkeypatch.setattr(resplit, "check_pair", lambda b, r: (seen.append((b, r)), real(b, r))[1])
    convert(tiny_hf("qwen3_moe"), tmp_path / "m.gguf", "q4_0-q4_0")
    assert victim.read_bytes() == b"precious"
    assert not os.path.islink(tmp_path / "m.gguf") and not os.path.islink(tmp_path / "m.residual.gguf")
    (tmp_base, tmp_res), = seen
    assert re_full(r"\.m\.gguf\.partial-\d+-[0-9a-f]{16}", os.path.basename(tmp_base))
    assert re_full(r"\.m\.residual\.gguf\.partial-\d+-[0-9a-f]{16}", os.path.basename(tmp_res))


def re_full(pattern: str, s: str) -> bool:
    import re

    return re.fullmatch(pattern, s) is not None


_KILLED_RUN = """
import os, sys, time
sys.path.insert(0, {root!r})
from rapidmoe_gguf import convert, quants
real, calls = quants.quantize, [0]
def slow(*a, **k):
    calls[0] += 1
    if calls[0] == 6:
        open({ready!r}, "w").close()
        time.sleep(600)
    return real(*a, **k)
quants.quantize = slow
convert({src!r}, {out!r}, "q4_0-q4_0", progress=False)
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_convert_next_run_removes_leftovers_of_a_killed_one(tiny_hf, tmp_path, sig):
    import signal
    import time

    src, out, ready = tiny_hf("qwen3_moe"), tmp_path / "m.gguf", tmp_path.parent / f"ready-{sig}"
    # the package this test runs against (the source tree, or the installed one)
    root = os.path.dirname(os.path.dirname(os.path.abspath(resplit.__file__)))
    code = _KILLED_RUN.format(root=root, ready=str(ready), src=str(src), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 120
        while not ready.exists():
            assert proc.poll() is None and time.time() < deadline, "the conversion did not start"
            time.sleep(0.05)
        proc.send_signal(getattr(signal, sig))
        proc.wait(30)
    finally:
        proc.kill()
    leftovers = [n for n in _listing(tmp_path) if ".partial-" in n]
    assert leftovers, _listing(tmp_path)
    # a conversion that is still running (this process) keeps its temporaries
    live = tmp_path / f".other.gguf.partial-{os.getpid()}-0123456789abcdef"
    live.write_bytes(b"in progress")
    convert(src, out, "q4_0-q4_0")
    assert _listing(tmp_path) == sorted(["m.gguf", "m.residual.gguf", live.name])


# ---------------------------------------------------------------------------------------------
# Typed and finite metadata
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("rope_parameters", {"rope_theta": float("inf"), "rope_type": "default"}),
                                        ("rms_norm_eps", float("nan")), ("rms_norm_eps", 1e300)])
def test_convert_refuses_non_finite_hyperparameters_in_config(tiny_hf, tmp_path, key, value):
    d = _copy_ckpt(tiny_hf("mixtral"), tmp_path / "src")
    _edit_config(d, **{key: value})                 # json writes Infinity / NaN, and reads them back
    _assert_fails_clean(tmp_path, d, FormatError, rf"{key}.*not a finite number")


def _gguf_with(tiny_hf, tmp_path, kv) -> str:
    from rapidmoe_gguf.evaluate import rewrite_with_kv

    rep = convert(tiny_hf("qwen3_moe"), tmp_path / "in.gguf", "q8_0")
    rewrite_with_kv(rep.base_path, kv)
    return rep.base_path


@pytest.mark.parametrize("key, value, match", [
    ("qwen3moe.rope.freq_base", float("inf"), r"qwen3moe.rope.freq_base: inf is not a finite number"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", float("nan"),
     r"qwen3moe.attention.layer_norm_rms_epsilon: nan is not a finite number"),
    ("qwen3moe.expert_count", "4", r"qwen3moe.expert_count: expected an integer, found a string"),
    ("general.name", 5, r"general.name: expected a string, found an integer"),
])
def test_convert_gguf_input_with_bad_keys_is_refused(tiny_hf, tmp_path, key, value, match):
    src = _gguf_with(tiny_hf, tmp_path, {key: value})
    _assert_fails_clean(tmp_path, src, FormatError, match)


@pytest.mark.parametrize("key, value", [("qwen3moe.rope.freq_base", float("inf")),
                                        ("qwen3moe.rope.freq_base", float("nan")),
                                        ("qwen3moe.attention.layer_norm_rms_epsilon", float("inf"))])
def test_convert_model_load_refuses_non_finite_hyperparameters(tiny_hf, tmp_path, key, value):
    import rapidmoe_gguf as rm

    path = _gguf_with(tiny_hf, tmp_path, {key: value})
    with pytest.raises(FormatError, match=rf"'{re.escape(key)}' = (inf|nan) is not a finite positive number"):
        rm.Model(path, n_ctx=16, n_threads=1)


# -- IQ bases and importance matrices ------------------------------------------------------------

def _write_imatrix(path, sums: dict[str, np.ndarray], counts: dict[str, np.ndarray], kind="imatrix"):
    """An importance-matrix GGUF laid out as llama-imatrix writes it: NAME.in_sum2, ne {n_in, n_mat};
    NAME.counts, ne {1, n_mat}."""
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_string("general.type", kind)
    for name, s in sums.items():
        w.add_tensor(name + ".in_sum2", np.ascontiguousarray(s, np.float32))
        w.add_tensor(name + ".counts", np.asarray(counts[name], np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tiny_imatrix(path, n_layer=2, n_expert=4, n_in=256, n_ff=256, seed=0, skip=()):
    """Skewed importances (a few columns matter far more), expert 3 of each tensor never routed."""
    r = np.random.default_rng(seed)
    sums, counts, imp = {}, {}, {}
    for b in range(n_layer):
        for part, cols in (("gate", n_in), ("up", n_in), ("down", n_ff)):
            name = f"blk.{b}.ffn_{part}_exps.weight"
            if name in skip:
                continue
            n = np.array([100.0, 50.0, 7.0, 0.0])[:n_expert]
            per = (r.gamma(0.4, 1.0, (n_expert, cols)) ** 2).astype(np.float32)
            sums[name], counts[name] = per * n[:, None], n
            imp[name] = per
    _write_imatrix(path, sums, counts)
    return imp


@pytest.mark.parametrize("recipe", ["iq2xxs-q4", "iq3xxs-q8"])
def test_convert_iq_recipe_with_imatrix(recipe, tiny_hf, tmp_path):
    """With --imatrix the IQ base's error, weighted by the importance, drops against the same
    conversion without it; the unrouted expert (count 0) is quantized without weights; llama-
    quantize's keys name the file; the pair decodes as gguf-py decodes it and runs."""
    import rapidmoe_gguf as rm

    arch = "qwen3_moe"
    src = tiny_hf(arch)
    imx = tmp_path / "tiny.imatrix.gguf"
    imp = _tiny_imatrix(imx)
    plain = convert(src, tmp_path / "plain.gguf", recipe)
    rep = convert(src, tmp_path / "imx.gguf", recipe, imatrix=imx)
    assert plain.imatrix_tensors == 0 and rep.imatrix_tensors == 6
    kv = _kv(tmp_path / "imx.gguf")
    assert kv["quantize.imatrix.file"] == "tiny.imatrix.gguf" and kv["quantize.imatrix.entries_count"] == 6
    assert "quantize.imatrix.file" not in _kv(tmp_path / "plain.gguf")
    hf = _hf_weights(src)
    base_type = {"iq2xxs-q4": "IQ2_XXS", "iq3xxs-q8": "IQ3_XXS"}[recipe]
    with_imx, without = _tensors(tmp_path / "imx.gguf"), _tensors(tmp_path / "plain.gguf")
    for name, w_imp in imp.items():
        t = with_imx[name]
        assert t.tensor_type.name == base_type
        w = _hf_tensor(hf, arch, name)          # (n_expert, rows, cols)
        got, ref = _f32(t), _f32(without[name])
        assert np.array_equal(got, gguf.quants.dequantize(t.data, t.tensor_type).reshape(got.shape))
        for e in range(3):                      # routed experts: the importance is used
            def werr(y):
                return float((((w[e] - y[e]) ** 2) * w_imp[e]).sum())
            assert werr(got) < 0.9 * werr(ref), (name, e)
        assert np.array_equal(got[3], ref[3])   # never routed: quantized as without an imatrix
    resplit.check_pair(tmp_path / "imx.gguf", rep.residual_path)
    _check_ggml_rules(tmp_path / "imx.gguf")
    with rm.Model(tmp_path / "imx.gguf", n_ctx=32, n_threads=2) as m:
        assert np.all(np.isfinite(m.eval_logits([1, 2, 3])))


def test_convert_iq_base_falls_back_for_rows_not_of_256(tiny_hf, tmp_path):
    src = tiny_hf("qwen3_moe", moe_intermediate_size=288)  # down_exps rows of 288
    imx = tmp_path / "i.gguf"
    _tiny_imatrix(imx, n_ff=288)
    rep = convert(src, tmp_path / "m.gguf", "iq2xxs-q4", imatrix=imx)
    base = _tensors(tmp_path / "m.gguf")
    assert base["blk.1.ffn_down_exps.weight"].tensor_type.name == "Q4_0"
    assert base["blk.1.ffn_gate_exps.weight"].tensor_type.name == "IQ2_XXS"
    assert ("IQ2_XXS", "Q4_0") in {(f.wanted, f.used) for f in rep.fallbacks}
    assert rep.imatrix_tensors == 4   # gate and up of 2 layers; Q4_0 takes no importance


def test_convert_imatrix_missing_entries_and_unused(tiny_hf, tmp_path, caplog):
    src = tiny_hf("qwen3_moe")
    imx = tmp_path / "i.gguf"
    _tiny_imatrix(imx, skip=("blk.1.ffn_up_exps.weight",))
    with caplog.at_level(logging.WARNING, logger="rapidmoe_gguf"):
        rep = convert(src, tmp_path / "m.gguf", "iq3xxs-q8", imatrix=imx)
    assert rep.imatrix_tensors == 5
    assert any("blk.1.ffn_up_exps.weight: no entry in the imatrix" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rapidmoe_gguf"):
        rep = convert(src, tmp_path / "k.gguf", "q4k-q8", imatrix=imx)
    assert rep.imatrix_tensors == 0
    assert any("is not used" in r.message for r in caplog.records)


def test_convert_imatrix_errors(tiny_hf, tmp_path):
    src = tiny_hf("qwen3_moe")
    out = tmp_path / "m.gguf"
    dat = tmp_path / "old.dat"
    dat.write_bytes(b"\x01\x00\x00\x00" + b"\0" * 64)
    with pytest.raises(FormatError, match="not a GGUF imatrix .*legacy .dat"):
        convert(src, out, "iq2xxs-q4", imatrix=dat)
    with pytest.raises(InvalidArgumentError, match="no such file"):
        convert(src, out, "iq2xxs-q4", imatrix=tmp_path / "missing.gguf")
    other = tmp_path / "notimx.gguf"
    _write_imatrix(other, {"blk.0.ffn_up_exps.weight": np.ones((4, 256))},
                   {"blk.0.ffn_up_exps.weight": np.ones(4)}, kind="model")
    with pytest.raises(FormatError, match="general.type is not 'imatrix'"):
        convert(src, out, "iq2xxs-q4", imatrix=other)
    wrong = tmp_path / "wrong.gguf"   # made for a model with 8 experts
    _write_imatrix(wrong, {"blk.0.ffn_up_exps.weight": np.ones((8, 256))},
                   {"blk.0.ffn_up_exps.weight": np.ones(8)})
    with pytest.raises(FormatError, match="made for another model"):
        convert(src, out, "iq2xxs-q4", imatrix=wrong)
    neg = tmp_path / "neg.gguf"
    _write_imatrix(neg, {"blk.0.ffn_up_exps.weight": -np.ones((4, 256))},
                   {"blk.0.ffn_up_exps.weight": np.ones(4)})
    with pytest.raises(FormatError, match="negative or non-finite"):
        convert(src, out, "iq2xxs-q4", imatrix=neg)
    assert not out.exists()


def test_convert_cli_iq_recipe_with_imatrix(tiny_hf, tmp_path, capsys):
    src = tiny_hf("qwen3_moe")
    imx = tmp_path / "i.gguf"
    _tiny_imatrix(imx)
    assert cli_main(["convert", str(src), str(tmp_path / "m.gguf"), "--recipe", "iq2xxs-q4",
                     "--imatrix", str(imx), "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "recipe iq2xxs-q4" in out and "2.062 bits/weight base" in out
    assert _tensors(tmp_path / "m.gguf")["blk.0.ffn_up_exps.weight"].tensor_type.name == "IQ2_XXS"


def test_convert_pre_tokenizer_names_a_rule_the_fingerprint_misses(tiny_hf, tmp_path, capsys):
    """A tokenizer.json whose split is StarCoder's (digits one by one, then GPT-2's) has no known
    fingerprint: refused, naming what it could not match; with --pre-tokenizer starcoder the file
    is written (warned about), and its tokenizer splits digits one by one, as llama.cpp does for
    that name. A GGUF source names its own and refuses the option."""
    import rapidmoe_gguf as rm

    src = tmp_path / "hf"
    shutil.copytree(tiny_hf("qwen3_moe"), src)
    tj = json.loads((src / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, tj["pre_tokenizer"]]}
    (src / "tokenizer.json").write_text(json.dumps(tj))
    out = tmp_path / "m.gguf"
    with pytest.raises(UnsupportedError, match="Digits"):
        convert(src, out, recipe="f32", progress=False)
    assert not out.exists()
    with pytest.warns(UserWarning, match="'starcoder' as asked"):
        assert cli_main(["convert", str(src), str(out), "--recipe", "f32", "--pre-tokenizer", "starcoder"]) == 0
    with open_gguf(out) as g:
        assert g.metadata["tokenizer.ggml.pre"] == "starcoder"
    with rm.Model(out, n_ctx=32, n_threads=1) as m:
        pieces = [m.detokenize([t]) for t in m.tokenize("x 1234", add_special=False)]
    assert pieces[-4:] == ["1", "2", "3", "4"]
    with pytest.raises(InvalidArgumentError, match="names its own"):
        convert(out, tmp_path / "again.gguf", recipe="f32", progress=False, pre_tokenizer="starcoder")
