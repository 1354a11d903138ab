"""ggml quant types: quantize, dequantize and dot products through the native reference kernels.

Shapes are in numpy order: the last dimension is a row (ggml's ne[0]) and must be a whole number
of blocks. Quantized data is plain bytes laid out as in a GGUF file.

    >>> q = quantize("Q4_K", np.random.randn(4, 512).astype(np.float32))
    >>> x = dequantize("Q4_K", q, (4, 512))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._native import check, ffi, lib
from .errors import InvalidArgumentError, UnsupportedError

__all__ = ["CUDA_MATMUL_TYPES", "GGML_BLOCKS", "TYPES", "TypeInfo", "dequantize", "quantize", "row_bytes", "type_info", "vec_dot"]


@dataclass(frozen=True)
class TypeInfo:
    """One row of the native type table (``rm_type_info``)."""

    id: int                 # ggml type id
    name: str               # as gguf spells it: "Q4_K"
    block_elems: int        # elements per block (1 for plain floats)
    block_bytes: int        # bytes per block
    is_quantized: bool
    vec_dot_type: str       # the activation type this type's dot product takes
    can_quantize: bool
    cuda_matmul_chunk: int = 0   # the CUDA kernels multiply by it, rows a multiple of this; 0: not
    takes_importance: bool = False  # quantize() accepts an importance (per-column weights) for it

    def row_bytes(self, n: int) -> int:
        """Bytes taken by n elements; n must be a whole number of blocks."""
        if n < 0 or n % self.block_elems:
            raise InvalidArgumentError(
                f"{self.name}: {n} elements is not a multiple of the block size {self.block_elems}")
        return n // self.block_elems * self.block_bytes


def _load_table() -> dict[str, TypeInfo]:
    info = ffi.new("rm_type_info *")
    raw = {}
    for type_id in range(lib.RM_TYPE_COUNT):
        if lib.rm_type_describe(type_id, info) == lib.RM_OK:
            raw[type_id] = (ffi.string(info.name).decode(), info.block_elems, info.block_bytes,
                            bool(info.is_quantized), info.vec_dot_type, bool(info.can_quantize),
                            info.cuda_matmul_chunk, bool(info.takes_importance))
    return {
        name: TypeInfo(type_id, name, elems, nbytes, quantized, raw[dot][0], can_q, chunk, imp)
        for type_id, (name, elems, nbytes, quantized, dot, can_q, chunk, imp) in raw.items()
    }


def _load_blocks() -> dict[int, tuple[str, int, int]]:
    info = ffi.new("rm_type_info *")
    out = {}
    for type_id in range(lib.RM_TYPE_COUNT):
        st = lib.rm_type_describe_any(type_id, info)
        if st in (lib.RM_OK, lib.RM_E_UNSUPPORTED_TYPE):
            out[type_id] = (ffi.string(info.name).decode(), info.block_elems, info.block_bytes)
    return out


TYPES: dict[str, TypeInfo] = _load_table()
"""Every type this build implements, by name, in ggml id order."""

GGML_BLOCKS: dict[int, tuple[str, int, int]] = _load_blocks()
"""Every ggml type id the GGUF reader knows, implemented here or not: (name, block elements,
block bytes); block elements 0 for an id ggml has removed. The library's one type table."""

CUDA_MATMUL_TYPES: frozenset[str] = frozenset(name for name, t in TYPES.items() if t.cuda_matmul_chunk)
"""Types the CUDA kernels multiply by (in every build: the planner plans a GPU without one)."""

_BY_ID = {t.id: t for t in TYPES.values()}


def type_info(type_name_or_id: str | int) -> TypeInfo:
    """The table row for a type name ("Q4_K", any case) or ggml type id (an int or a
    ``gguf.GGMLQuantizationType``)."""
    if isinstance(type_name_or_id, str):
        t = TYPES.get(type_name_or_id.upper())
        if t is None:
            raise UnsupportedError(
                f"unknown or unsupported quant type {type_name_or_id!r}; supported: {', '.join(TYPES)}")
        return t
    if isinstance(type_name_or_id, (int, np.integer)):
        t = _BY_ID.get(int(type_name_or_id))
        if t is None:
            check(lib.rm_type_describe(int(type_name_or_id), ffi.new("rm_type_info *")))
        return t
    raise TypeError(f"type_info: expected a type name or id, got {type(type_name_or_id).__name__}")


def row_bytes(type_name: str | int, n: int) -> int:
    """Bytes taken by a row of n elements of the type."""
    return type_info(type_name).row_bytes(n)


def quantize(type_name: str | int, x: np.ndarray, n_threads: int = 0,
             importance: np.ndarray | None = None) -> bytes:
    """Quantize x, of shape (..., n) with n a multiple of the block size, row by row. All types but
    the IQ ones use ggml's reference quantizer (byte-identical output); IQ2_XXS and IQ3_XXS use our
    own codebook search, which minimises the squared error weighted by ``importance`` (n values,
    finite and >= 0: the importance of each input column, e.g. a row of an importance matrix) or
    the plain squared error without one. n_threads <= 0 uses every online CPU."""
    t = type_info(type_name)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise InvalidArgumentError(f"quantize: {t.name}: x must have at least one dimension")
    n_per_row = x.shape[-1]
    imp = ffi.NULL
    if importance is not None:
        importance = np.ascontiguousarray(importance, dtype=np.float32)
        if importance.shape != (n_per_row,):
            raise InvalidArgumentError(f"quantize: {t.name}: importance has shape {importance.shape}; "
                                       f"it needs one value per column, ({n_per_row},)")
        imp = ffi.from_buffer("float[]", importance)
    n_rows = x.size // n_per_row if n_per_row else 0
    if n_rows == 0 and n_per_row > 0 and n_per_row % t.block_elems == 0:
        return b""
    out = bytearray(n_rows * (n_per_row // t.block_elems) * t.block_bytes)
    check(lib.rm_quantize_weighted(t.id, ffi.from_buffer("float[]", x), n_rows, n_per_row, imp,
                                   ffi.from_buffer(out), len(out), n_threads))
    return bytes(out)


def dequantize(type_name: str | int, data: bytes | bytearray | memoryview | np.ndarray,
               shape: tuple[int, ...] | int) -> np.ndarray:
    """Dequantize data holding a tensor of the given shape (numpy order, last dimension a row)
    into a new float32 array of that shape."""
    t = type_info(type_name)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if not shape or shape[-1] <= 0 or shape[-1] % t.block_elems:
        raise InvalidArgumentError(
            f"dequantize: {t.name}: shape {shape}: the row length must be a positive multiple of "
            f"the block size {t.block_elems}")
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data)
    src = ffi.from_buffer(data)
    n = int(np.prod(shape))
    need = t.row_bytes(n)
    if len(src) != need:
        raise InvalidArgumentError(
            f"dequantize: {t.name}: shape {shape} needs {need} bytes, got {len(src)}")
    out = np.empty(shape, dtype=np.float32)
    if n:
        check(lib.rm_dequantize(t.id, src, len(src), ffi.from_buffer("float[]", out), n))
    return out


def vec_dot(type_name: str | int, w: bytes | bytearray | memoryview | np.ndarray, x: np.ndarray) -> float:
    """The dot product of one row of weights w (quantized bytes of len(x) elements) with float
    activations x, computed as the runtime does: x is first quantized to the type's vec_dot_type."""
    t = type_info(type_name)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise InvalidArgumentError(f"vec_dot: {t.name}: x must be one row, got shape {x.shape}")
    if isinstance(w, np.ndarray):
        w = np.ascontiguousarray(w)
    wbuf = ffi.from_buffer(w)
    need = t.row_bytes(x.size)
    if len(wbuf) != need:
        raise InvalidArgumentError(f"vec_dot: {t.name}: {x.size} weights need {need} bytes, got {len(wbuf)}")
    out = ffi.new("float *")
    check(lib.rm_vec_dot(t.id, wbuf, len(wbuf), ffi.from_buffer("float[]", x), x.size, out))
    return float(out[0])
