"""The CPU kernel sets: which one the runtime uses, and each set's kernels on their own.

The native library carries a scalar reference set and, on x86-64, AVX2, AVX-512 and AMX sets (AMX:
the AVX-512 set with prefill's Q8_0, Q4_0 and Q4_K/Q5_K/Q6_K products on the tile registers); the best
one the CPU supports is chosen when first needed, or the one named by the environment variable
``RAPIDMOE_ISA`` (``scalar``, ``avx2``, ``avx512``, ``amx``; set it before the first model is loaded).

    >>> kernels.cpu_isa()
    'avx512'
    >>> y = kernels.vec_dot_rows("Q4_K", w_bytes, kernels.quantize_activations("Q8_K", x), isa="avx2")
"""

from __future__ import annotations

import numpy as np

from ._native import check, ffi, lib
from .errors import InvalidArgumentError
from .quants import type_info

__all__ = ["ISAS", "cpu_isa", "cpu_isa_reason", "quantize_activations", "supported_isas", "vec_dot_rows"]

ISAS = ("scalar", "avx2", "avx512", "amx")
"""Every kernel set a build can have, worst to best."""


def cpu_isa() -> str:
    """The kernel set the runtime uses in this process."""
    return ffi.string(lib.rm_cpu_isa()).decode()


def cpu_isa_reason() -> str:
    """Why the runtime uses ``cpu_isa()``: the best set of this CPU and build, a lower one measured
    faster on this CPU family (none so far: dispatch.c's ISA_RULES), or $RAPIDMOE_ISA."""
    return ffi.string(lib.rm_cpu_isa_reason()).decode()


def supported_isas() -> list[str]:
    """The kernel sets this CPU and build can run, worst to best ("scalar" is always there)."""
    return [isa for isa in ISAS if lib.rm_cpu_isa_supported(isa.encode())]


def _isa_arg(isa: str | None):
    return ffi.NULL if isa is None else ffi.new("char[]", isa.encode())


def quantize_activations(type_name: str | int, x: np.ndarray, isa: str | None = None) -> bytes:
    """One row of float activations quantized to an activation type (Q8_0, Q8_K, ...) by the
    quantizer of kernel set ``isa`` (None: the set in use). The bytes equal ``quants.quantize``'s."""
    t = type_info(type_name)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = bytearray(t.row_bytes(x.size))
    check(lib.rm_quantize_isa(_isa_arg(isa), t.id, ffi.from_buffer("float[]", x), x.size,
                              ffi.from_buffer(out), len(out)))
    return bytes(out)


def vec_dot_rows(type_name: str | int, w: bytes | bytearray | memoryview | np.ndarray,
                 x_q: bytes | bytearray | memoryview | np.ndarray, n: int | None = None,
                 isa: str | None = None, batched: bool = True, stored: bool = False,
                 repacked: bool = False) -> np.ndarray:
    """Dot products of every row of weights w (quantized bytes, rows of n elements) with every
    token of x_q (rows of n activations already in the type's vec_dot_type, float32 for F32/F16/BF16
    weights), by the kernels of set ``isa`` (None: the set in use): as the CPU backend computes a
    matrix product (``batched``), or with the one-token kernel for every row and token; ``stored``
    (with ``batched``): from the rows repacked into the set's stored layout first, as a CPU-only
    model keeps them from load where the set has such a layout for the type; ``repacked``: w is
    in that layout already (``repack_rows``'s). n defaults to the length of x_q as one token.
    Returns a float32 array of shape (tokens, rows)."""
    t = type_info(type_name)
    xt = type_info(t.vec_dot_type)
    if isinstance(w, np.ndarray):
        w = np.ascontiguousarray(w)
    if isinstance(x_q, np.ndarray):
        x_q = np.ascontiguousarray(x_q)
    wbuf, xbuf = ffi.from_buffer(w), ffi.from_buffer(x_q)
    if n is None:
        n = len(xbuf) // xt.block_bytes * xt.block_elems
    row, xrow = t.row_bytes(n), xt.row_bytes(n)
    if row == 0 or len(wbuf) % row:
        raise InvalidArgumentError(f"vec_dot_rows: {t.name}: {len(wbuf)} bytes is not a whole number of rows of {n}")
    if len(xbuf) % xrow:
        raise InvalidArgumentError(f"vec_dot_rows: {t.name}: {len(xbuf)} bytes of {xt.name} is not a whole number of "
                                   f"rows of {n}")
    y = np.empty((len(xbuf) // xrow, len(wbuf) // row), dtype=np.float32)
    check(lib.rm_vec_dot_isa(_isa_arg(isa), t.id, wbuf, len(wbuf), y.shape[1], xbuf, len(xbuf), y.shape[0], n,
                             3 if repacked else 2 if batched and stored else int(batched), ffi.from_buffer("float[]", y)))
    return y


def repack_rows(type_name: str | int, w: bytes | bytearray | memoryview | np.ndarray, n: int,
                isa: str | None = None) -> bytes:
    """Rows of weights w (quantized bytes, rows of n elements) in set ``isa``'s stored layout, as a
    CPU-only model keeps them from load (for ``vec_dot_rows(..., repacked=True)``); an
    InvalidArgumentError where the set keeps no such rows."""
    t = type_info(type_name)
    if isinstance(w, np.ndarray):
        w = np.ascontiguousarray(w)
    wbuf = ffi.from_buffer(w)
    row = t.row_bytes(n)
    if row == 0 or len(wbuf) % row:
        raise InvalidArgumentError(f"repack_rows: {t.name}: {len(wbuf)} bytes is not a whole number of rows of {n}")
    out = bytearray(len(wbuf))
    check(lib.rm_repack_rows_isa(_isa_arg(isa), t.id, wbuf, len(wbuf), len(wbuf) // row, n, ffi.from_buffer(out)))
    return bytes(out)
