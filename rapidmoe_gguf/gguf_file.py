"""GGUF files through the native reader: metadata as Python values, tensor bytes as zero-copy
read-only numpy views into the file mapping.

    with open_gguf("model.gguf") as f:
        f.metadata["general.architecture"]        # 'qwen3moe'
        t = f.tensors["blk.0.ffn_up_exps.weight"]
        t.ne, t.shape, t.type_name, t.data        # ggml order, numpy order, 'Q4_K', uint8 view

Lifetime: every numpy array handed out (tensor data, numeric metadata arrays) keeps the native
handle alive through its ``base``, so no view can ever point into an unmapped region.
``close()`` drops this object's references; the file is unmapped as soon as no view is left
(immediately, when none was kept).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._native import check, ffi, lib, to_str
from .errors import InvalidArgumentError

# rm_gguf_type -> (numpy dtype, struct format) for the fixed-size value types.
_FIXED = {
    lib.RM_GGUF_UINT8: ("<u1", "<B"),
    lib.RM_GGUF_INT8: ("<i1", "<b"),
    lib.RM_GGUF_UINT16: ("<u2", "<H"),
    lib.RM_GGUF_INT16: ("<i2", "<h"),
    lib.RM_GGUF_UINT32: ("<u4", "<I"),
    lib.RM_GGUF_INT32: ("<i4", "<i"),
    lib.RM_GGUF_FLOAT32: ("<f4", "<f"),
    lib.RM_GGUF_BOOL: ("<u1", "<B"),
    lib.RM_GGUF_UINT64: ("<u8", "<Q"),
    lib.RM_GGUF_INT64: ("<i8", "<q"),
    lib.RM_GGUF_FLOAT64: ("<f8", "<d"),
}

def ggml_type_name(type_id: int) -> str:
    """The name gguf uses for a ggml type id ("Q4_K"), from the library's type table, or
    "TYPE_<id>" for one it does not know."""
    from .quants import GGML_BLOCKS

    known = GGML_BLOCKS.get(type_id)
    return known[0] if known else f"TYPE_{type_id}"


class _MappedRegion:
    """``nbytes`` bytes of the mapping at ``address``, shown to numpy through the array interface.
    An array made from it has it as ``base``, and it holds the handle: the mapping outlives the
    array, and numpy refuses to make the array writeable (the pages are read-only)."""

    def __init__(self, handle: Any, address: int, count: int, typestr: str):
        self._handle = handle
        self.__array_interface__ = {
            "shape": (count,),
            "typestr": typestr,
            "data": (address, True),
            "version": 3,
        }


def _view(handle: Any, ptr: Any, count: int, dtype: str) -> np.ndarray:
    if count == 0 or ptr == ffi.NULL:
        empty = np.empty(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    address = int(ffi.cast("uintptr_t", ptr))
    return np.asarray(_MappedRegion(handle, address, count, dtype))


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str  # "F32", "Q4_K", ...
    type_id: int  # the ggml type id
    shape: tuple[int, ...]  # numpy order: reversed ne, as gguf-py shows it
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    nbytes: int
    offset: int  # from the start of the data section
    data: np.ndarray  # the nbytes bytes: uint8, read-only, zero-copy


# the rm_model_info fields rm_arch_read_hparams sets
_HPARAMS = ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_expert", "n_expert_used", "n_ff_exp",
            "n_ff_shexp", "n_ctx_train", "norm_topk", "n_ff", "n_layer_dense_lead", "n_rot", "head_dim_v",
            "q_lora_rank", "kv_lora_rank", "n_layer_linear", "ssm_d_conv", "ssm_conv_dim", "ssm_n_v", "ssm_d_state",
            "ssm_head_v", "n_swa", "n_layer_swa", "n_head_kv_swa", "head_dim_swa", "n_head_swa", "index_head_dim",
            "index_n_head", "index_top_k", "hc_count", "hc_low_rank", "n_layer_ple", "ple_ngram", "ple_conv_kernel",
            "ple_embd", "n_layer_csa", "n_layer_hca")


class GGUFFile:
    """An open GGUF file; make one with ``open_gguf``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        out = ffi.new("rm_gguf **")
        check(lib.rm_gguf_open(os.fsencode(self.path), out))
        self._g = ffi.gc(out[0], lib.rm_gguf_close)
        self.version: int = lib.rm_gguf_version(self._g)
        self.alignment: int = lib.rm_gguf_alignment(self._g)
        self.data_offset: int = lib.rm_gguf_data_offset(self._g)
        self.file_size: int = lib.rm_gguf_file_size(self._g)
        # [first byte, end) of the tensor-info block, which a RESplit sidecar's base identity hashes
        self.tensor_infos_span: tuple[int, int] = (lib.rm_gguf_infos_begin(self._g), lib.rm_gguf_infos_end(self._g))
        self._metadata: dict[str, Any] | None = None
        self._tensors: dict[str, TensorInfo] | None = None

    # -- lifetime ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._g is None

    def close(self) -> None:
        """Drop this object's hold on the file. Arrays obtained from it stay valid."""
        self._g = None
        self._metadata = None
        self._tensors = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self) -> Any:
        if self._g is None:
            raise InvalidArgumentError(f"{self.path}: the GGUF file is closed")
        return self._g

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"v{self.version}"
        return f"<GGUFFile {self.path!r} {state}>"

    # -- metadata ---------------------------------------------------------------------------

    def hparams(self) -> dict[str, Any]:
        """The architecture and hyperparameters as the loader reads them (rm_arch_read_hparams:
        the C architecture table's keys, defaults and ranges, and its errors): ``arch``,
        ``n_embd``, ``n_layer``, ``n_head``, ``n_head_kv``, ``head_dim``, ``n_expert``,
        ``n_expert_used``, ``n_ff_exp``, ``n_ff_shexp`` (0 without a shared expert),
        ``n_ctx_train``, ``norm_topk``; ``n_ff`` and ``n_layer_dense_lead`` (leading dense layers),
        ``n_rot``, ``head_dim_v``, MLA's ``q_lora_rank`` and ``kv_lora_rank`` (0 without); the
        linear-attention layers' ``n_layer_linear``, ``ssm_d_conv``, ``ssm_conv_dim``, ``ssm_n_v``,
        ``ssm_d_state``, ``ssm_head_v`` (0 without), as rm_size_params takes them; and the sliding
        window ``n_swa`` with the count of layers that slide, ``n_layer_swa`` (0 without), and their
        query and kv heads and head width, ``n_head_swa``, ``n_head_kv_swa`` and ``head_dim_swa`` (the
        others' where the same); sparse attention's ``index_head_dim``, ``index_n_head`` and
        ``index_top_k`` (0 without); hyper-connections' ``hc_count`` and ``hc_low_rank``, and PLE's
        ``n_layer_ple``, ``ple_ngram``, ``ple_conv_kernel`` and ``ple_embd``, DeepSeek-V4's compressed
        layers ``n_layer_csa`` and ``n_layer_hca`` (0 without)."""
        info = ffi.new("rm_model_info *")
        check(lib.rm_arch_read_hparams(self._handle(), os.fsencode(self.path), info))
        out: dict[str, Any] = {"arch": ffi.string(info.arch).decode()}
        for k in _HPARAMS:
            out[k] = int(getattr(info, k))
        return out


    @property
    def metadata(self) -> dict[str, Any]:
        """key -> int, float, bool, str, list of str, or a read-only numpy array of numbers."""
        if self._metadata is None:
            g = self._handle()
            self._metadata = {
                to_str(lib.rm_gguf_kv_key(g, i)): self._value(g, i)
                for i in range(lib.rm_gguf_n_kv(g))
            }
        return self._metadata

    def _value(self, g: Any, i: int) -> Any:
        vtype = lib.rm_gguf_kv_type(g, i)
        if vtype == lib.RM_GGUF_STRING:
            return to_str(lib.rm_gguf_kv_str(g, i))
        if vtype == lib.RM_GGUF_ARRAY:
            etype = lib.rm_gguf_kv_arr_type(g, i)
            n = lib.rm_gguf_kv_arr_n(g, i)
            if etype == lib.RM_GGUF_STRING:
                return [to_str(lib.rm_gguf_kv_arr_str(g, i, j)) for j in range(n)]
            arr = _view(g, lib.rm_gguf_kv_data(g, i), n, _FIXED[etype][0])
            if etype == lib.RM_GGUF_BOOL:  # any non-zero byte is true, as in ggml
                arr = arr != 0
                arr.flags.writeable = False
            return arr
        fmt = _FIXED[vtype][1]
        raw = ffi.unpack(ffi.cast("char *", lib.rm_gguf_kv_data(g, i)), struct.calcsize(fmt))
        value = struct.unpack(fmt, raw)[0]
        return value != 0 if vtype == lib.RM_GGUF_BOOL else value

    # -- tensors ----------------------------------------------------------------------------

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        """name -> TensorInfo, in file order."""
        if self._tensors is None:
            g = self._handle()
            info = ffi.new("rm_tensor_info *")
            tensors = {}
            for i in range(lib.rm_gguf_n_tensors(g)):
                check(lib.rm_gguf_tensor_info(g, i, info))
                ne = tuple(int(info.ne[d]) for d in range(info.n_dims))
                t = TensorInfo(
                    name=to_str(info.name),
                    type_name=ggml_type_name(info.type),
                    type_id=int(info.type),
                    shape=ne[::-1],
                    ne=ne,
                    nbytes=int(info.nbytes),
                    offset=int(info.offset),
                    data=_view(g, info.data, int(info.nbytes), "|u1"),
                )
                tensors[t.name] = t
            self._tensors = tensors
        return self._tensors


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open and validate a GGUF file. Raises FormatError (malformed), UnsupportedError (a tensor
    type ggml has removed) or RapidMoEError (cannot open or map), with the reader's message."""
    return GGUFFile(path)
