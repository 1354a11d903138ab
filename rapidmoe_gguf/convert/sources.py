"""What the converter reads: a Hugging Face checkpoint directory or an existing GGUF file.

Both present the same thing to ``convert``: the architecture, a list of ``SourceTensor`` in GGUF
naming and ``ne`` order that read themselves one at a time (an expert tensor one expert at a time,
so memory stays near one expert matrix), and a function that writes the metadata.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

from .. import resplit
from ..arch import (FUSED, PREFERRED_PRE, SPECIAL_TOKEN_TEXTS, STACKED_EXPERTS, ArchSpec, ResolvedHParams, arch_for_gguf, arch_for_hf,
                    ple_eos, resolve_hparams)
from ..errors import FormatError, InvalidArgumentError, RapidMoEError, UnsupportedError
from ..gguf_file import open_gguf
from ..gguf_header import read_header
from ..metadata import get_float, get_int, get_str
from .safetensors_io import SCALE_INV, SafetensorsCheckpoint

log = logging.getLogger("rapidmoe_gguf.convert")


@dataclasses.dataclass
class SourceTensor:
    """One output tensor as the source has it.

    ``read(e)`` returns float32: for an expert tensor (``role == "expert"``) expert ``e``'s matrix,
    numpy shape ``(ne[1], ne[0])``; otherwise the whole tensor in numpy order (``e`` is None).
    ``src_type`` is the ggml type name when the source is already a GGUF tensor (``raw(e)`` then
    gives its bytes, for copying unchanged), else None.
    """

    name: str
    ne: tuple[int, ...]
    role: str                      # "expert" | "router" | "vector" | "matrix"
    read: Callable[[int | None], np.ndarray]
    src_type: str | None = None
    raw: Callable[[int | None], Any] | None = None


class Source:
    arch: ArchSpec
    tensors: list[SourceTensor]
    name: str

    def add_metadata(self, writer: GGUFWriter) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def open_source(src: str, pre_tokenizer: str | None = None) -> Source:
    """The checkpoint at src. ``pre_tokenizer``: the `tokenizer.ggml.pre` name to give a Hugging Face
    tokenizer whatever its fingerprint (a GGUF source keeps its own, so it is refused there)."""
    if os.path.isdir(src):
        return HFSource(src, pre_tokenizer)
    if pre_tokenizer is not None:
        raise InvalidArgumentError(f"{src}: --pre-tokenizer is for Hugging Face checkpoints; a GGUF file names its own")
    if os.path.isfile(src) and src.endswith(".gguf"):
        return GGUFSource(src)
    if not os.path.exists(src):
        raise FormatError(f"{src}: no such file or directory")
    raise FormatError(f"{src}: expected a Hugging Face checkpoint directory or a .gguf file")


def _role(spec_role: str, ne: tuple[int, ...]) -> str:
    if spec_role in ("expert", "router", "index"):   # index: a table of integers, written I32 unchanged
        return spec_role
    if spec_role == "f32":   # small matrices the runtime reads as floats (a conv's filters): F32 as 1-D
        return "vector"
    return "vector" if len(ne) == 1 else "matrix"


# ---- transforms of the Qwen3.5/Qwen3-Next linear-attention tensors (as llama.cpp's converter) ----

def _tiled(w: np.ndarray, d: dict, head: int, axis: int = 0) -> np.ndarray:
    """Value heads from grouped order (per key head, its n_v/n_k heads) to tiled order (head h
    after the key heads' h-th ones), along axis; head: the rows of one value head."""
    nk, r = d["ssm_n_k"], d["ssm_n_v"] // d["ssm_n_k"]
    w = np.moveaxis(w, axis, 0)
    rest = w.shape[1:]
    w = w.reshape(nk, r, head, *rest).swapaxes(0, 1).reshape(nk * r * head, *rest)
    return np.ascontiguousarray(np.moveaxis(w, 0, axis))


def _tiled_qkv(w: np.ndarray, d: dict) -> np.ndarray:
    kd2 = 2 * d["ssm_n_k"] * d["ssm_d_state"]   # q and k rows stay, v rows are reordered
    return np.concatenate([w[:kd2], _tiled(w[kd2:], d, d["ssm_head_v"])])


def _qkvz(w: np.ndarray, d: dict, part: str) -> np.ndarray:
    """Qwen3-Next's in_proj_qkvz, per key head [q, k, v, z], into llama.cpp's [q.., k.., v..] or z."""
    nk, dk = d["ssm_n_k"], d["ssm_d_state"]
    rv = d["ssm_n_v"] // nk * d["ssm_head_v"]
    g = w.reshape(nk, 2 * dk + 2 * rv, w.shape[-1])
    if part == "z":
        return np.ascontiguousarray(g[:, 2 * dk + rv:].reshape(-1, w.shape[-1]))
    q, k, v = g[:, :dk], g[:, dk:2 * dk], g[:, 2 * dk:2 * dk + rv]
    return np.concatenate([x.reshape(-1, w.shape[-1]) for x in (q, k, v)])


def _conv(w: np.ndarray, d: dict) -> np.ndarray:   # HF (channels, 1, kernel) -> ne {kernel, channels}
    return np.ascontiguousarray(w.reshape(w.shape[0], w.shape[-1]))


TRANSFORMS: dict[str, Callable[[np.ndarray, dict], np.ndarray]] = {
    "plus_one": lambda w, d: w + np.float32(1.0),
    "neg_exp": lambda w, d: -np.exp(w),
    "neg_exp_tiled": lambda w, d: _tiled(-np.exp(w), d, 1),
    "conv": _conv,
    "conv_tiled": lambda w, d: _tiled_qkv(_conv(w, d), d),
    "qkvz_qkv": lambda w, d: _qkvz(w, d, "qkv"),
    "qkvz_z": lambda w, d: _qkvz(w, d, "z"),
    "tiled_qkv": _tiled_qkv,
    "tiled_rows": lambda w, d: _tiled(w, d, d["ssm_head_v"]),
    "tiled_heads": lambda w, d: _tiled(w, d, 1),
    "tiled_cols": lambda w, d: _tiled(w, d, d["ssm_head_v"], axis=1),
    "k_b": lambda w, d: _split_kv_b(w, d, "k_b"),
    "v_b": lambda w, d: _split_kv_b(w, d, "v_b"),
    # QSA's index_qk_proj: the indexer's query heads' rows, then its key's (llama.cpp splits them)
    "qsa_q": lambda w, d: np.ascontiguousarray(w[:d["n_index_q"]]),
    "qsa_k": lambda w, d: np.ascontiguousarray(w[d["n_index_q"]:]),
}

# The HF shape a transform reads, where it is not the output's (ne reversed).
def _proportional_rope(d: dict) -> np.ndarray:
    """Gemma 4's full layers turn only the first partial_rotary_factor of each head's frequency
    pairs (transformers' "proportional" RoPE, whose exponents count the whole head): llama.cpp
    writes it as frequency divisors, 1 for a pair that turns and 1e30 for one that does not."""
    turning = int(d["rope_partial"] * d["n_rot"] // 2)
    return np.array([1.0] * turning + [1e30] * (d["n_rot"] // 2 - turning), dtype=np.float32)


def _llama3_rope(d: dict) -> np.ndarray | None:
    """Llama 3's RoPE scaling (transformers' "llama3" over the rotary dims of Step-3.5's full layers) as
    llama.cpp writes it: a frequency divisor per pair (1 for the fast ones, the factor for the slow
    ones, between them smoothly), padded with 1 to n_rot_half entries; None without the scaling."""
    s = d.get("rope_llama3")
    if not s:
        return None
    rot = d["rope_rot_full"]
    inv = d["rope_base"] ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    wavelen = 2 * np.pi / inv
    factor, low, high, orig = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
    div = 1.0 / ((1.0 - smooth) / factor + smooth)
    div = np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, div))
    return np.concatenate([div, np.ones(d["n_rot_half"] - len(div))]).astype(np.float32)


# Tensors a checkpoint does not hold, made from the hyperparameters (TensorSpec with hf ""); a maker
# that returns None writes none.
GENERATED: dict[str, Callable[[dict], np.ndarray | None]] = {
    "proportional_rope": _proportional_rope,
    "llama3_rope": _llama3_rope,
}

_HF_SHAPE: dict[str, Callable[[tuple[int, ...], dict], tuple[int, ...]]] = {
    "conv": lambda ne, d: (ne[1], 1, ne[0]),
    "conv_tiled": lambda ne, d: (ne[1], 1, ne[0]),
    "qkvz_qkv": lambda ne, d: (d["ssm_conv_dim"] + d["ssm_d_inner"], ne[0]),
    "qkvz_z": lambda ne, d: (d["ssm_conv_dim"] + d["ssm_d_inner"], ne[0]),
    # both halves of MLA's kv_b_proj
    "k_b": lambda ne, d: (d["n_head"] * (d["n_nope"] + d["head_dim_v"]), d["kv_lora_rank"]),
    "v_b": lambda ne, d: (d["n_head"] * (d["n_nope"] + d["head_dim_v"]), d["kv_lora_rank"]),
    "qsa_q": lambda ne, d: (d["n_index_q"] + d["index_head_dim"], ne[0]),
    "qsa_k": lambda ne, d: (d["n_index_q"] + d["index_head_dim"], ne[0]),
}


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k rows (RoPE on split halves) -> llama.cpp's interleaved-pair order, per head."""
    n_out, n_in = w.shape
    return w.reshape(n_head, 2, n_out // n_head // 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)


class HFSource(Source):
    """A transformers checkpoint directory: config.json, safetensors, tokenizer files."""

    _IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")

    def __init__(self, directory: str, pre_tokenizer: str | None = None):
        self.directory = directory
        self.pre_tokenizer = pre_tokenizer
        self.name = os.path.basename(os.path.normpath(directory))
        cfg_path = os.path.join(directory, "config.json")
        try:
            with open(cfg_path, encoding="utf-8") as f:
                self.config = json.load(f)
        except FileNotFoundError:
            raise FormatError(f"{directory}: no config.json") from None
        except (OSError, ValueError) as exc:
            raise FormatError(f"{cfg_path}: cannot be read as JSON ({exc})") from None
        if not isinstance(self.config, dict):
            raise FormatError(f"{cfg_path}: not a JSON object")
        self.arch = arch_for_hf(self.config, cfg_path)
        multimodal = "text_config" in self.config
        self.config = _text_config(self.config, self.arch, cfg_path)
        _check_common_config(self.config, cfg_path, self.arch)
        self.hp: ResolvedHParams = resolve_hparams(self.arch, self.config, cfg_path)
        self.ckpt = SafetensorsCheckpoint(directory)
        self.ckpt.fp8_block = _fp8_block(self.config, cfg_path)
        try:
            if multimodal:
                self.ckpt.rename_prefix(*self.arch.text_model)
            self.tensors = self._plan()
        except BaseException:
            self.ckpt.close()
            raise

    def _plan(self) -> list[SourceTensor]:
        spec, dims = self.arch, self.hp.dims
        used: set[str] = set()
        out: list[SourceTensor] = []
        globals_ = [t for t in spec.tensors if not t.per_layer]
        first = [t for t in globals_ if t.role == "embd"]
        last = [t for t in globals_ if t.role != "embd"]
        layer_specs = [t for t in spec.tensors if t.per_layer]
        order = [(t, None) for t in first]
        order += [(t, b) for b in range(dims["n_layer"]) for t in layer_specs]
        order += [(t, None) for t in last]
        for t, bid in order:
            if t.layers is not None and t.layers != self._layer_kind(t.layers, bid):
                continue
            name = t.gguf.format(bid=bid)
            ne = self.hp.shape(t.ne)
            if not t.hf:   # made from the dims (GENERATED), not read
                made = GENERATED[t.transform](dims)
                if made is None:
                    continue
                out.append(SourceTensor(name, ne, _role(t.role, ne), lambda _e=None, w=made: w))
                continue
            if t.per_expert:
                hf_names = [t.hf.format(bid=bid, xid=x) for x in range(dims["n_expert"])]
                stacked = None if hf_names[0] in self.ckpt else self._stacked_experts(t, bid, name, ne)
                if stacked is not None:
                    used.add(stacked[0])
                    out.append(stacked[1])
                    continue
                for hn in hf_names:
                    self._check_shape(hn, (ne[1], ne[0]), t.ne[1::-1])
                used.update(hf_names)
                out.append(SourceTensor(name, ne, "expert", self._expert_reader(hf_names)))
                continue
            hn = t.hf.format(bid=bid)
            if t.transform in FUSED and hn + "_blocks" in self.ckpt:   # the released MXFP4 form
                used.update((hn + "_blocks", hn + "_scales"))
                out.append(self._mxfp4_tensor(name, ne, hn, t.transform))
                continue
            if t.transform in FUSED:
                self._check_shape(hn, self._fused_shape(t, ne), ("n_expert",) + tuple(t.ne[:2]))
                used.add(hn)
                out.append(SourceTensor(name, ne, _role(t.role, ne), self._fused_reader(hn, t.transform)))
                continue
            if hn not in self.ckpt:
                if t.role == "output":
                    if self.config.get("tie_word_embeddings") is False:
                        raise FormatError(f"{self.directory}: no '{hn}' and tie_word_embeddings is false")
                    if spec.output_from_embd:
                        continue  # llama.cpp reuses token_embd
                    hn = "model.embed_tokens.weight"
                elif t.optional:
                    continue
                else:
                    raise FormatError(f"{self.directory}: checkpoint has no tensor '{hn}' "
                                      f"(needed for {name}); is config.json right for these weights?")
            want = (1, ne[0]) if t.transform == "flatten" else tuple(reversed(ne))
            if t.transform in _HF_SHAPE:
                want = _HF_SHAPE[t.transform](ne, dims)
            self._check_shape(hn, want, tuple(reversed(t.ne)))
            used.add(hn)
            if t.role == "index":
                out.append(self._index_tensor(name, ne, hn))
                continue
            out.append(SourceTensor(name, ne, _role(t.role, ne), self._reader(hn, t.transform, ne)))
        if spec.extra_plan is not None:
            out += EXTRA_PLANS[spec.extra_plan](self, used)
        for prefix, what in spec.skipped:
            skipped = [n for n in self.ckpt.names if n.startswith(prefix)]
            if skipped:
                log.info("%s: %d tensor(s) of the %s (%s...) are not converted: the runtime does not run it",
                         self.directory, len(skipped), what, skipped[0])
                used.update(skipped)
        used.update(n + SCALE_INV for n in list(used) if n + SCALE_INV in self.ckpt)   # FP8 weights' scales
        extra = [n for n in self.ckpt.names if n not in used and not self._IGNORED.search(n)
                 and not self._dropped_layer(n)]
        if extra:
            shown = ", ".join(f"'{n}'" for n in extra[:4]) + (" ..." if len(extra) > 4 else "")
            raise FormatError(f"{self.directory}: {len(extra)} tensor(s) that the {spec.name} layout "
                              f"does not use: {shown}; is config.json right for these weights?")
        return out

    def _index_tensor(self, name: str, ne: tuple[int, ...], hf_name: str) -> SourceTensor:
        """A table of integers (DeepSeek-V4's expert ids per token id), written I32 as llama.cpp does."""
        def raw(_e: int | None = None) -> np.ndarray:
            return self.ckpt.read_i32(hf_name)

        return SourceTensor(name, ne, "index", lambda _e=None: raw().astype(np.float32), "I32", raw)

    def _stacked_experts(self, t, bid: int, name: str, ne: tuple[int, ...]) -> tuple[str, SourceTensor] | None:
        """An expert tensor whose experts the checkpoint keeps stacked in one tensor (STACKED_EXPERTS),
        as (that tensor's name, the SourceTensor reading expert e's rows of it); None if it has none."""
        head, _, tail = t.hf.partition("{xid}.")
        if tail not in STACKED_EXPERTS:
            return None
        part, half = STACKED_EXPERTS[tail]
        hn = head.format(bid=bid) + part
        if hn not in self.ckpt:
            return None
        n_rows = ne[1] if half is None else 2 * ne[1]
        self._check_shape(hn, (ne[2], n_rows, ne[0]), ("n_expert", t.ne[1] if half is None else f"2*{t.ne[1]}", t.ne[0]))
        rows = slice(None) if half is None else slice(half * ne[1], (half + 1) * ne[1])

        def read(e: int | None) -> np.ndarray:
            return np.ascontiguousarray(self.ckpt.read_f32(hn, e)[rows])
        return hn, SourceTensor(name, ne, "expert", read)

    def _layer_kind(self, wanted: str, bid: int) -> str:
        """The kind layer bid has among those a tensor may be limited to: the attention kind ("full",
        "linear", "sliding") from the config; dense or moe FFN, q_lora or q_direct query."""
        if self.arch.layer_kind is not None and wanted in ("full", "sliding", "linear"):
            return self.arch.layer_kind(self.config, bid)
        if wanted == "ple":   # qwen4exp: a layer with PLE (ple_layer_ids, 1-based)
            return "ple" if bid + 1 in (self.config.get("ple_layer_ids") or []) else "none"
        if wanted in ("indexed", "shared"):   # sparse attention: a layer with its own indexer, or not
            return "indexed" if self.hp.dims.get("indexer_layers", [True] * (bid + 1))[bid] else "shared"
        return _layer_kind(wanted, bid, self.hp.dims)

    def _dropped_layer(self, hf_name: str) -> bool:
        """A layer past the decoder's (DeepSeek's and GLM's next-token-prediction blocks)."""
        if self.arch.drop_hf_layers_from is None:
            return False
        m = re.match(r"model\.layers\.(\d+)\.", hf_name)
        return m is not None and int(m.group(1)) >= self.hp.dims[self.arch.drop_hf_layers_from]

    def _check_shape(self, hf_name: str, want: tuple[int, ...], dim_names: tuple[str, ...]) -> None:
        if hf_name not in self.ckpt:
            raise FormatError(f"{self.directory}: checkpoint has no tensor '{hf_name}'")
        got = self.ckpt.entry(hf_name).shape
        if got != want:
            raise FormatError(
                f"{self.ckpt.file_of(hf_name)}: tensor '{hf_name}' has shape {list(got)} but "
                f"config.json implies {list(want)} ({', '.join(dim_names)})")

    def _reader(self, hf_name: str, transform: str | None, ne: tuple[int, ...]):
        dims = self.hp.dims

        def read(_e: int | None = None) -> np.ndarray:
            w = self.ckpt.read_f32(hf_name)
            if transform == "permute_q":
                w = _permute_rows(w, dims["n_head"])
            elif transform == "permute_k":
                w = _permute_rows(w, dims["n_head_kv"])
            elif transform == "flatten":
                w = w.reshape(ne[0])
            elif transform is not None:
                w = TRANSFORMS[transform](w, dims)
            return w
        return read

    @staticmethod
    def _fused_shape(t, ne: tuple[int, ...]) -> tuple[int, ...]:
        """The HF tensor a FUSED transform reads: (experts, in, out) matrices with gate and up
        interleaved along out, or their (experts, out) biases."""
        if t.transform == "fused_down":
            return (ne[2], ne[0], ne[1])
        if t.transform == "stacked":
            return (ne[2], ne[1], ne[0])
        if t.transform in ("fused_gate", "fused_up"):
            return (ne[2], ne[0], 2 * ne[1])
        return (ne[1], 2 * ne[0])

    def _mxfp4_tensor(self, name: str, ne: tuple[int, ...], hf_name: str, transform: str) -> SourceTensor:
        """An expert tensor stored as MXFP4 blocks and scales (gpt-oss's released checkpoints):
        per expert, rows of (out) in nn.Linear's orientation, each row ``in / 32`` blocks of 16
        bytes with one E8M0 scale byte each; gate and up rows interleaved. ``raw(e)`` gives expert
        e's matrix as ggml MXFP4 bytes (a lossless repack), ``read(e)`` its floats: one expert at a
        time, never the whole tensor in full precision."""
        from .. import quants

        rows = FUSED[transform][0]
        n_rows = ne[1] * (2 if transform in ("fused_gate", "fused_up") else 1)
        blocks, scales = hf_name + "_blocks", hf_name + "_scales"
        self._check_shape(blocks, (ne[2], n_rows, ne[0] // 32, 16), ("n_expert", "rows", "blocks", "16"))
        self._check_shape(scales, (ne[2], n_rows, ne[0] // 32), ("n_expert", "rows", "blocks"))

        def raw(e: int | None) -> np.ndarray:
            b = self.ckpt.read_u8(blocks, e)[rows]
            s = self.ckpt.read_u8(scales, e)[rows]
            return mxfp4_from_hf(b, s).reshape(-1)

        def read(e: int | None) -> np.ndarray:
            return quants.dequantize("MXFP4", raw(e), (ne[1], ne[0]))

        return SourceTensor(name, ne, "expert", read, "MXFP4", raw)

    def _fused_reader(self, hf_name: str, transform: str):
        cols, transpose = FUSED[transform]

        def read(e: int | None) -> np.ndarray:
            w = self.ckpt.read_f32(hf_name, e)[..., cols]
            return np.ascontiguousarray(w.T if transpose else w)
        return read

    def _expert_reader(self, hf_names: list[str]):
        def read(e: int | None) -> np.ndarray:
            return self.ckpt.read_f32(hf_names[e])
        return read

    def add_metadata(self, writer: GGUFWriter) -> None:
        from ..tokenizer import add_tokenizer_to_writer, tokenizer_kv_from_hf

        writer.add_name(self.name)
        for key, (value, kind) in self.hp.kv.items():
            {"u32": writer.add_uint32, "f32": writer.add_float32, "bool": writer.add_bool,
             "str": writer.add_string, "sections": writer.add_array, "u32s": writer.add_array,
             "bools": writer.add_array, "f32s": writer.add_array,
             "i32s": lambda k, v: writer.add_key_value(k, v, GGUFValueType.ARRAY, GGUFValueType.INT32),
             "u64s": lambda k, v: writer.add_key_value(k, v, GGUFValueType.ARRAY, GGUFValueType.UINT64),
             }[kind](key, value)
        names = self.config.get("architectures") or []
        kv = tokenizer_kv_from_hf(self.directory, tuple(p for a in names for p in PREFERRED_PRE.get(a, ())),
                                  pre_tokenizer_name=self.pre_tokenizer,
                                  spm_model="gemma4" if self.arch.name == "gemma4" else "llama")
        index = {t: i for i, t in enumerate(kv["tokenizer.ggml.tokens"])}
        for role, text in (r for a in names for r in SPECIAL_TOKEN_TEXTS.get(a, {}).items()):
            if text in index:
                kv[f"tokenizer.ggml.{role}_token_id"] = index[text]
        add_tokenizer_to_writer(writer, kv)

    def close(self) -> None:
        self.ckpt.close()


def _ple_plan(src: HFSource, used: set[str]) -> list[SourceTensor]:
    """qwen4exp's PLE: every PLE layer's n-gram table (its shards ngram_embedding.shard_<i>, in index
    order, or one ngram_embedding) stacked into per_layer_token_embd, layer after layer in
    ple_layer_ids' order, and the keys llama.cpp's converter writes for one layer: ple.layers (0-based),
    the n-gram sizes, the eos token, embedding_length_per_layer_input (a head's row), and the hash
    constants read exactly from the checkpoint (ple.layer_multipliers, head_offsets, head_vocab_sizes:
    u64s). With several layers each array holds the layers' entries one layer after another, and a
    layer's head offsets count from the start of the stacked table (its own offsets plus the rows of
    the layers before it). No PLE layers: no keys and no table, as llama.cpp's converter."""
    cfg, dims = src.config, src.hp.dims
    ids = sorted(cfg.get("ple_layer_ids") or [])
    if not ids:
        return []
    ngram, per = cfg.get("ngram_size", 3), cfg.get("heads_per_ngram", 8)
    heads, width = (ngram - 1) * per, dims["n_ple_embd"]
    row_dim = width // heads
    mult: list[int] = []
    offsets: list[int] = []
    vocab: list[int] = []
    parts: list[str] = []
    rows = 0
    for i in ids:
        pre = f"model.layers.{i - 1}.ple.ple_embedding."
        consts = []
        for name, n in (("layer_multipliers", ngram), ("ngram_heads_offsets", heads),
                        ("ngram_heads_vocab_sizes", heads)):
            if pre + name not in src.ckpt:
                raise FormatError(f"{src.directory}: checkpoint has no tensor '{pre + name}' (PLE's hash constants)")
            v = src.ckpt.read_ints(pre + name)
            if len(v) != n:
                raise FormatError(f"{src.directory}: '{pre + name}' has {len(v)} entries, expected {n}")
            used.add(pre + name)
            consts.append(v)
        shard = re.compile(re.escape(pre) + r"ngram_embedding\.shard_(\d+)\.weight$")
        shards = sorted((int(m.group(1)), n) for n in src.ckpt.names if (m := shard.match(n)))
        names = [n for _, n in shards] or [pre + "ngram_embedding.weight"]
        if shards and [k for k, _ in shards] != list(range(cfg.get("split_ngram_parts", 512))):
            raise FormatError(f"{src.directory}: {len(shards)} n-gram table shards under '{pre}', expected "
                              f"split_ngram_parts ({cfg.get('split_ngram_parts', 512)}) numbered from 0")
        n_rows = 0
        for n in names:
            if n not in src.ckpt:
                raise FormatError(f"{src.directory}: checkpoint has no tensor '{n}' (layer {i}'s n-gram table)")
            shape = src.ckpt.entry(n).shape
            if len(shape) != 2 or shape[1] != row_dim:
                raise FormatError(f"{src.directory}: '{n}' has shape {list(shape)}, expected rows of {row_dim} "
                                  f"(ple_embed_dim {width} / {heads} heads)")
            n_rows += shape[0]
        ends = [o + v for o, v in zip(consts[1], consts[2])]
        if max(ends) > n_rows:
            raise FormatError(f"{src.directory}: layer {i}'s n-gram heads reach row {max(ends)} of a table of {n_rows}")
        mult += consts[0]
        offsets += [o + rows for o in consts[1]]
        vocab += consts[2]
        parts += names
        used.update(names)
        rows += n_rows
    kv = src.hp.kv
    arch = src.arch.name
    for key, value, kind in (
            ("ple.layers", [i - 1 for i in ids], "i32s"), ("ple.ngram_size", ngram, "u32"),
            ("ple.heads_per_ngram", per, "u32"), ("ple.conv_kernel", dims["ple_conv_kernel"], "u32"),
            ("ple.eos_token_id", ple_eos(cfg), "u32"), ("embedding_length_per_layer_input", row_dim, "u32"),
            ("ple.layer_multipliers", mult, "u64s"), ("ple.head_offsets", offsets, "u64s"),
            ("ple.head_vocab_sizes", vocab, "u64s")):
        kv[f"{arch}.{key}"] = (value, kind)

    def read(_e: int | None = None) -> np.ndarray:
        return np.concatenate([src.ckpt.read_f32(n) for n in parts])
    return [SourceTensor("per_layer_token_embd.weight", (row_dim, rows), "matrix", read)]


# ArchSpec.extra_plan: tensors made of several checkpoint tensors, and their keys
EXTRA_PLANS: dict[str, Callable[[HFSource, set[str]], list[SourceTensor]]] = {"ple": _ple_plan}


def _layer_kind(wanted: str, bid: int, dims: dict) -> str:
    """Which of a pair of layer kinds layer bid has: dense or moe FFN, q_lora or q_direct query;
    DeepSeek-V4's compressed layers by their ratio (csa 4, hca 128), hash-routed or routed FFN."""
    if wanted in ("csa", "hca"):
        return {4: "csa", 128: "hca"}.get(dims["compress_ratios"][bid], "none")
    if wanted in ("hash", "routed"):
        return "hash" if bid < dims.get("n_layer_hash", 0) else "routed"
    if wanted in ("dense", "moe"):
        return "dense" if bid < dims.get("n_layer_dense_lead", 0) else "moe"
    return "q_lora" if dims.get("q_lora_rank", 0) > 0 else "q_direct"


def _split_kv_b(w: np.ndarray, dims: dict, part: str) -> np.ndarray:
    """MLA's kv_b_proj (n_head * (nope + v), kv_lora_rank) into llama.cpp's per-head k_b, transposed
    to (n_head, kv_lora_rank, nope), or v_b, (n_head, v, kv_lora_rank)."""
    nope, v = dims["n_nope"], dims["head_dim_v"]
    kv = w.reshape(dims["n_head"], nope + v, dims["kv_lora_rank"])
    if part == "k_b":
        return np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1))
    return np.ascontiguousarray(kv[:, nope:, :])


def mxfp4_from_hf(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF's MXFP4 (blocks (..., 16) with elements 2k and 2k + 1 in byte k's low and high nibble,
    scales (...) as E8M0 bytes) as ggml's block_mxfp4 bytes (..., 17): the scale byte unchanged
    (both read it as 2^(e - 127) times the E2M1 value), then element j in byte j's low nibble and
    element j + 16 in its high one."""
    lo, hi = blocks & 0x0F, blocks >> 4
    elems = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)      # element order
    qs = elems[..., :16] | (elems[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).astype(np.uint8)


def _text_config(config: dict, spec: ArchSpec, where: str) -> dict:
    """A multimodal config.json (its text model's settings under text_config) as the text-only
    model's: the text_config with the top level's architectures and tied-embedding flag."""
    text = config.get("text_config")
    if text is None:
        return config
    if spec.text_model is None:
        raise UnsupportedError(f"{where}: a text_config (a multimodal checkpoint) is not supported for {spec.name}")
    if not isinstance(text, dict):
        raise FormatError(f"{where}: text_config is not a JSON object")
    out = dict(text, architectures=config.get("architectures"))
    if "tie_word_embeddings" in config:   # transformers ties the lm_head by the top level's flag
        out["tie_word_embeddings"] = config["tie_word_embeddings"]
    return out


def _fp8_block(config: Mapping[str, Any], where: str) -> tuple[int, int] | None:
    """The block size of an FP8 checkpoint's scales (quantization_config.weight_block_size; None:
    not given, read from each scale grid); other quantization methods are refused by name."""
    qc = config.get("quantization_config")
    if not isinstance(qc, Mapping):
        return None
    method = qc.get("quant_method")
    if method not in (None, "fp8", "mxfp4"):
        raise UnsupportedError(f"{where}: quantization_config.quant_method '{method}' is not supported (fp8 "
                               "with per-block scales and gpt-oss's mxfp4 are; convert a bf16 copy)")
    block = qc.get("weight_block_size") if method == "fp8" else None
    if block is None:
        return None
    if (not isinstance(block, (list, tuple)) or len(block) != 2 or
            not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise FormatError(f"{where}: quantization_config.weight_block_size {block!r} is not two positive integers")
    return int(block[0]), int(block[1])


def _check_common_config(config: dict, where: str, spec: ArchSpec) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedError(f"{where}: hidden_act '{act}' is not supported (silu only)")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in (None, "default") + spec.rope_scaling:
        raise UnsupportedError(f"{where}: RoPE scaling '{rope_type}' is not supported yet")
    if spec.sliding_window:
        return
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        log.warning("%s: sliding_window=%s is ignored (llama.cpp runs these models with full attention)",
                    where, config["sliding_window"])


# ---------------------------------------------------------------------------------------------

# Keys the converter writes afresh instead of copying from an input GGUF.
_DROPPED_KEYS = ("general.architecture", "general.file_type", "general.quantization_version",
                 "general.alignment")
_LEGACY_EXPERT = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight$")


class GGUFSource(Source):
    """An existing llama.cpp GGUF of a supported architecture (no residuals): it is re-split."""

    def __init__(self, path: str):
        self.path = path
        self.header = h = read_header(path)
        where = f"{path}: "
        self.name = get_str(h, "general.name", where=where) or os.path.basename(path)[:-len(".gguf")]
        arch = get_str(h, "general.architecture", where=where)
        if arch is None:
            raise FormatError(f"{path}: no general.architecture")
        self.arch = arch_for_gguf(arch, path)
        if (get_int(h, "split.count", where=where) or 1) > 1:
            raise UnsupportedError(f"{path}: split GGUF files are not supported; merge them first "
                                   "(llama-gguf-split --merge)")
        for key, kv in h.kv.items():  # the hyperparameters copied to the new base must be finite
            if key.startswith(arch + ".") and kv.type in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
                get_float(h, key, where=where)
        n_expert = get_int(h, f"{arch}.expert_count", where=where) or 0
        if n_expert <= 0:
            raise UnsupportedError(f"{path}: {arch}.expert_count is {n_expert}; not an MoE model")
        if os.path.exists(resplit.residual_path(path)):
            log.warning("%s: its residual sidecar is not used; the new pair reconstructs the base as it is",
                        path)
        # The native reader validates the whole file as the runtime will; its tensor data are
        # zero-copy views of the mapping.
        self._file = open_gguf(path)
        data = {name: t.data for name, t in self._file.tensors.items()}
        self.tensors = []
        for t in h.tensors:
            if resplit.FUSED_GATE_UP_RE.match(t.name):   # llama.cpp's gemma4: written apart, as the recipes want
                self.tensors += self._split_gate_up(t, data[t.name], n_expert)
                continue
            if _LEGACY_EXPERT.match(t.name):
                raise UnsupportedError(f"{path}: tensor '{t.name}' uses the old one-tensor-per-expert "
                                       "layout; only merged *_exps tensors are supported")
            if resplit.is_expert_tensor(t.name):
                role = "expert"
                if len(t.ne) != 3 or t.ne[2] != n_expert:
                    raise FormatError(f"{path}: expert tensor '{t.name}' has ne {list(t.ne)}, "
                                      f"expected 3 dimensions ending in {n_expert} experts")
            elif t.name.endswith(".ffn_gate_inp.weight"):
                role = "router"
            else:
                role = "vector" if len(t.ne) == 1 else "matrix"
            slab = _Slabs(t.ne, t.type_name, data[t.name])
            self.tensors.append(SourceTensor(t.name, t.ne, role, self._reader(t, slab), t.type_name, slab))
        if not any(t.role == "expert" for t in self.tensors):
            raise UnsupportedError(f"{path}: no blk.N.ffn_*_exps.weight tensors")

    def _split_gate_up(self, t, data: np.ndarray, n_expert: int) -> list[SourceTensor]:
        """llama.cpp's ffn_gate_up_exps (ne {n_embd, 2 * n_ff_exp, n_expert}: per expert its gate
        rows, then its up rows) as ffn_gate_exps and ffn_up_exps."""
        if len(t.ne) != 3 or t.ne[2] != n_expert or t.ne[1] % 2:
            raise FormatError(f"{self.path}: tensor '{t.name}' has ne {list(t.ne)}, expected "
                              f"{{n_embd, 2 * n_ff_exp, {n_expert}}}")
        whole = _Slabs(t.ne, t.type_name, data)
        ne = (t.ne[0], t.ne[1] // 2, t.ne[2])
        out = []
        for part, name in enumerate((t.name.replace("gate_up", "gate"), t.name.replace("gate_up", "up"))):
            slab = _HalfSlabs(whole, part)
            out.append(SourceTensor(name, ne, "expert", self._reader(_Named(name, t.type_name), slab), t.type_name,
                                    slab))
        return out

    def _reader(self, t, slab: _Slabs):
        def read(e: int | None = None) -> np.ndarray:
            from .. import quants

            try:
                return quants.dequantize(t.type_name, slab(e), slab.shape(e))
            except RapidMoEError as exc:
                raise UnsupportedError(f"{self.path}: tensor '{t.name}' ({t.type_name}) cannot be "
                                       f"dequantized: {exc}") from None
        return read

    def add_metadata(self, writer: GGUFWriter) -> None:
        for key, kv in self.header.kv.items():
            if key in _DROPPED_KEYS or (key.startswith(("rapidmoe.", "split.")) and not key.startswith("rapidmoe.rope.")):
                continue   # the model's own rapidmoe.rope.* keys stay: they change its math
            if kv.type == GGUFValueType.ARRAY:
                if not kv.value:
                    log.warning("%s: empty array '%s' is not copied (gguf cannot write one)", self.path, key)
                    continue
                writer.add_key_value(key, kv.value, kv.type, sub_type=kv.sub_type)
            else:
                writer.add_key_value(key, kv.value, kv.type)

    def close(self) -> None:
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None


@dataclasses.dataclass(frozen=True)
class _Named:
    """What _reader needs of a tensor: its name and type."""

    name: str
    type_name: str


class _HalfSlabs:
    """The gate (part 0) or up (part 1) rows of a fused gate_up tensor's slabs, expert by expert."""

    def __init__(self, whole: "_Slabs", part: int):
        self.whole, self.part = whole, part
        self.ne = (whole.ne[0], whole.ne[1] // 2, whole.ne[2])

    def __call__(self, e: int | None = None) -> np.ndarray:
        if e is None:
            return np.concatenate([self(x) for x in range(self.ne[2])])
        slab = self.whole(e)
        half = len(slab) // 2
        return slab[self.part * half:(self.part + 1) * half]

    def shape(self, e: int | None = None) -> tuple[int, ...]:
        return tuple(reversed(self.ne)) if e is None else (self.ne[1], self.ne[0])


class _Slabs:
    """The bytes of one GGUF tensor (``slabs(None)``) or of expert e's matrix (``slabs(e)``)."""

    def __init__(self, ne: tuple[int, ...], type_name: str, data: np.ndarray):
        self.ne, self.data = ne, data
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
        self.expert_bytes = ne[0] // block * block_bytes * (ne[1] if len(ne) > 1 else 1)

    def __call__(self, e: int | None = None) -> np.ndarray:
        if e is None:
            return self.data
        return self.data[e * self.expert_bytes:(e + 1) * self.expert_bytes]

    def shape(self, e: int | None = None) -> tuple[int, ...]:
        return tuple(reversed(self.ne)) if e is None else (self.ne[1], self.ne[0])
