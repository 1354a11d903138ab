"""One architecture description: the C rows (native/src/model/arch.c, read through rm_arch_describe)
that the loader walks, and the converter's rows (rapidmoe_gguf/arch.py) must describe the same
files. For every architecture: tensors that fit the C row's flags; every key the loader reads is one the converter
writes, filling the same value, of the same kind, with the same default where both have one;
the tensors the converter writes for a layer are the ones the loader binds, with the same
shapes and presence, the ones read as floats 1-D (written F32), and the sidecar's tensors are
the experts'. Then the planner's way in (``GGUFFile.hparams``, rm_arch_read_hparams) reads the
keys as the loader does.
"""

from __future__ import annotations

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import arch as A
from rapidmoe_gguf.errors import FormatError, UnsupportedError
from conftest import GGUF_ARCH, TINY_ARCHS

NAMES = sorted(A.ARCHS)
KIND = {"int": "u32", "bool": "bool", "float": "f32"}


def test_arch_table_same_architectures():
    assert sorted(A.native_archs()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_arch_table_flags_agree(name):
    """The converter's rows hold no behaviour flags; what they write must fit the C row's."""
    c, py = A.native_archs()[name], A.ARCHS[name]
    written = {t.gguf: t for t in py.tensors}
    # interleaved RoPE runs on q/k rows the converter permuted (llama.cpp's llama arch), unless the
    # checkpoint's rows hold interleaved pairs already (DeepSeek's MLA)
    assert py.permute_qk == (c.rope == "norm" and not py.hf_rope_interleaved)
    assert (c.shared_expert == "gated") == ("blk.{bid}.ffn_gate_inp_shexp.weight" in written)
    q_norm = written.get("blk.{bid}.attn_q_norm.weight")
    per_head = {("head_dim",): "per_head", ("head_dim_swa",): "per_head", ("n_q",): "full"}
    assert c.qk_norm == {None: "none", **per_head}[q_norm and q_norm.ne]


def _c_value(text: str, values: dict):
    """A value of a C hparam row: a number, a field read before it, or "a/b" (integer division)."""
    if "/" in text:
        a, b = text.split("/")
        return values[a] // values[b]
    return values[text] if text in values else float(text)


def _py_default(h: A.HParam, dims: dict):
    if h.default is A.REQUIRED:
        return None
    return h.default(dims) if callable(h.default) else h.default


@pytest.mark.parametrize("name", NAMES)
def test_arch_table_hparams_agree(name):
    c, py = A.native_archs()[name], A.ARCHS[name]
    written = {h.key.format(arch=name): h for h in py.hparams if h.key}
    # a model whose config gives nothing optional: every default then comes into play
    dims = {"n_embd": 256, "n_head": 8, "n_head_kv": 8, "head_dim": 32, "n_rot": 32, "n_expert": 4,
            "n_expert_used": 2, "n_ff_exp": 512, "n_layer": 2, "n_ctx_train": 4096,
            "n_nope": 24, "kv_lora_rank": 64}   # MLA's required sizes
    for h in c.hparams:
        p = written.get(f"{name}.{h.key}")
        assert p is not None, f"the loader reads {name}.{h.key}, which the converter does not write"
        if p.kind == "u32s":   # one value per layer: the loader fills the field and the sliding layers' field
            assert h.field_swa and p.dim == f"{h.field}_layers", (h, p)
            continue
        assert p.dim == h.field and p.kind == KIND[h.kind], (h, p)
        py_default = _py_default(p, dims)
        if h.default is not None and py_default is not None:
            assert _c_value(h.default, dims) == pytest.approx(float(py_default), rel=1e-6), h.key
        if h.field not in dims and py_default is not None:
            dims[h.field] = py_default   # rows read later may default to it


_ATTN_KIND = {1: "full", 2: "sliding", 4: "linear"}   # RM_LAYER_ATTN_FULL, _SLIDING, _LINEAR
_COMPRESS_KIND = {0x8000000: "csa", 0x10000000: "hca"}   # RM_LAYER_CSA, _HCA (DeepSeek-V4)


def _c_key(t: A.NativeTensor):
    """A C row by its name and, for a row of one attention kind only, that kind: a name may have a
    row per kind (Gemma 4's sliding layers, DeepSeek-V4's CSA and HCA compressors have their own shapes)."""
    return t.name, _ATTN_KIND.get(t.when & 7) or _COMPRESS_KIND.get(t.when & 0x18000000)


def _py_key(t: A.TensorSpec):
    return t.gguf, t.layers if t.layers in ("full", "sliding", "linear", "csa", "hca") else None


@pytest.mark.parametrize("name", NAMES)
def test_arch_table_tensors_agree(name):
    c, py = A.native_archs()[name], A.ARCHS[name]
    written = {_py_key(t): t for t in py.tensors if t.per_layer}
    assert len(written) == len([t for t in py.tensors if t.per_layer]), "one tensor written twice"
    bound = {_c_key(t): t for t in c.tensors if not t.residual}
    assert len(bound) == len([t for t in c.tensors if not t.residual]), "one tensor bound twice"
    for n, t in written.items():
        assert n in bound, f"the converter writes {n}, which the loader does not bind"
        assert bound[n].ne == t.ne, (n, bound[n].ne, t.ne)
        assert bound[n].required == (not t.optional), n
        assert bound[n].expert == (t.role == "expert"), n
    for n, t in bound.items():
        assert not t.required or n in written, f"the loader requires {n}, which the converter does not write"
        # the recipes write 1-D tensors and role "f32" ones (gpt-oss's expert biases) as F32
        assert not t.f32 or len(t.ne) == 1 or written[n].role == "f32", f"{n} is read as floats but not written F32"
    sidecar = {t.name: t for t in c.tensors if t.residual}
    experts = {k[0]: t for k, t in written.items() if t.role == "expert"}
    assert sidecar.keys() == {n.replace(".weight", ".residual") for n in experts}
    assert all(sidecar[n.replace(".weight", ".residual")].ne == t.ne for n, t in experts.items())


def test_arch_table_plain_layers_run():
    """Today's rows give every layer a kind the forward pass runs."""
    runs = rm._native.lib.RM_LAYER_RUNS
    for a in A.native_archs().values():
        assert a.layer_kind & ~runs == 0, a.name


@pytest.fixture(scope="module")
def converted(tiny_hf, tmp_path_factory):
    out = {}
    for arch in TINY_ARCHS:
        p = tmp_path_factory.mktemp(f"arch-{arch}") / "m.gguf"
        rm.convert(tiny_hf(arch), p, recipe="q4_0-q4_0", progress=False)
        out[arch] = p
    return out


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_arch_table_read_hparams_matches_the_loader(converted, arch):
    with rm.open_gguf(converted[arch]) as g:
        hp = g.hparams()
    assert hp["arch"] == GGUF_ARCH[arch]
    with rm.Model(converted[arch], n_ctx=16, n_threads=1) as m:
        info = m.info
    for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_expert", "n_expert_used", "n_ff_exp",
              "n_ff_shexp", "n_ctx_train", "norm_topk"):
        assert hp[k] == info[k], k


def _gguf(path, arch: str, **kv) -> str:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for k, v in kv.items():
        key = f"{arch}.{k.replace('__', '.')}"
        if isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, float):
            w.add_float32(key, v)
        else:
            w.add_uint32(key, v)
    w.add_tensor("token_embd.weight", np.ones((4, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_arch_table_read_hparams_defaults_and_refusals(tmp_path):
    """Defaults from the rows; errors as rm_model_load gives them, for the planner as for the loader."""
    kv = dict(embedding_length=64, block_count=1, attention__head_count=4, expert_count=4, expert_used_count=2,
              feed_forward_length=32)
    with rm.open_gguf(_gguf(tmp_path / "a.gguf", "olmoe", **kv)) as g:
        hp = g.hparams()
    assert (hp["n_head_kv"], hp["head_dim"], hp["n_ctx_train"], hp["norm_topk"], hp["n_ff_shexp"]) == (4, 16, 4096, 0, 0)
    cases = [
        (dict(kv, expert_used_count=5), FormatError, r"'olmoe.expert_used_count' = 5 is outside \[1, 4\]"),
        ({k: v for k, v in kv.items() if k != "expert_count"}, FormatError, "required key 'olmoe.expert_count' is missing"),
        (dict(kv, attention__value_length=8), UnsupportedError, r"value_length' = 8 is not supported.*value_length == key_length"),
        (dict(kv, rope__freq_base=-1.0), FormatError, "is not a finite positive number"),
        (dict(kv, attention__head_count_kv=3), FormatError, "head_count 4 is not a multiple of head_count_kv 3"),
    ]
    for i, (bad, exc, msg) in enumerate(cases):
        path = _gguf(tmp_path / f"b{i}.gguf", "olmoe", **bad)
        with rm.open_gguf(path) as g, pytest.raises(exc, match=msg):
            g.hparams()
        with pytest.raises(exc, match=msg):
            rm.Model(path, n_ctx=16, n_threads=1)
    path = _gguf(tmp_path / "c.gguf", "mamba")
    with rm.open_gguf(path) as g, pytest.raises(UnsupportedError, match=r"'mamba' is not supported \(supported: llama \(Mixtral\)"):
        g.hparams()
