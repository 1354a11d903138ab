"""Reads a GGUF v3 header (metadata with its value types, tensor infos, section offsets) in Python.

The native reader (``open_gguf``) is what the runtime loads models with; this module serves the
places that need what that API does not give: the exact value type of every key (to copy metadata
from one file to another unchanged) and the byte range of the tensor-info block (the RESplit base
identity hashes it). Only the header is parsed, through an mmap, with every length and count
checked against the file size; tensor data is never touched.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import FormatError, UnsupportedError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_NAME_BYTES = 63  # ggml requires strlen(name) < GGML_MAX_NAME (64)

_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d", GGUFValueType.BOOL: "<?",
}


@dataclasses.dataclass(frozen=True)
class KV:
    type: GGUFValueType
    value: Any                          # int/float/bool/str, or a list for ARRAY
    sub_type: GGUFValueType | None = None  # element type of an ARRAY
    offset: int = -1                    # file position of an ARRAY's first element


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]   # ggml order: ne[0] is the row length
    type: GGMLQuantizationType
    offset: int           # relative to the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        return self.type.name

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (the reverse of ne)."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


@dataclasses.dataclass
class GGUFHeader:
    path: str
    version: int
    kv: dict[str, KV]
    tensors: list[TensorInfo]
    alignment: int
    ti_start: int      # first byte of the first tensor info
    ti_end: int        # one past the last tensor info
    data_offset: int   # first byte of the data section
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kv.get(key)
        return default if kv is None else kv.value

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None


class _Cursor:
    def __init__(self, path: str, buf: mmap.mmap, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise FormatError(f"{self.path}: truncated or corrupt header: {what} at byte {self.pos} "
                              f"needs {n} bytes, the file has {self.size}")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what + " length")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{self.path}: {what} is not valid UTF-8") from None

    def value(self, vtype: int, what: str) -> KV:
        try:
            t = GGUFValueType(vtype)
        except ValueError:
            raise FormatError(f"{self.path}: {what} has unknown value type {vtype}") from None
        if t in _SCALAR:
            return KV(t, self.unpack(_SCALAR[t], what))
        if t == GGUFValueType.STRING:
            return KV(t, self.string(what))
        sub = self.unpack("<I", what + " element type")
        n = self.unpack("<Q", what + " element count")
        try:
            st = GGUFValueType(sub)
        except ValueError:
            raise FormatError(f"{self.path}: {what} has unknown element type {sub}") from None
        if st == GGUFValueType.ARRAY:
            raise FormatError(f"{self.path}: {what} is an array of arrays, which ggml rejects")
        start = self.pos
        if st in _SCALAR:
            item = struct.calcsize(_SCALAR[st])
            self.need(n * item, what)
            arr = np.frombuffer(self.buf, dtype=np.dtype(_SCALAR[st]), count=n, offset=self.pos)
            self.pos += n * item
            return KV(t, arr.tolist(), st, start)
        return KV(t, [self.string(f"{what}[{i}]") for i in range(n)], st, start)


def read_header(path: str | os.PathLike[str], *, check_data: bool = True) -> GGUFHeader:
    """Parse and check the header of a little-endian GGUF v2/v3 file. With ``check_data=False``
    tensor data may lie beyond the end of the file (a file still being written)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise FormatError(f"{path}: {size} bytes, too short for a GGUF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf, size, check_data)
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{path}: is a directory, not a GGUF file") from None


def _parse(path: str, buf: mmap.mmap, size: int, check_data: bool) -> GGUFHeader:
    c = _Cursor(path, buf, size)
    if buf[:4] != GGUF_MAGIC:
        raise FormatError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
    c.pos = 4
    version = c.unpack("<I", "version")
    if version & 0xFFFF == 0:
        raise UnsupportedError(f"{path}: big-endian GGUF files are not supported")
    if version not in (2, 3):
        raise UnsupportedError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors = c.unpack("<Q", "tensor count")
    n_kv = c.unpack("<Q", "metadata count")
    # Every KV and tensor info takes at least 8 bytes, so larger counts cannot be honest.
    if n_tensors > size // 8 or n_kv > size // 8:
        raise FormatError(f"{path}: implausible counts ({n_tensors} tensors, {n_kv} keys)")
    kv: dict[str, KV] = {}
    for i in range(n_kv):
        key = c.string(f"key #{i}")
        if not key:
            raise FormatError(f"{path}: key #{i} is empty")
        if key in kv:
            raise FormatError(f"{path}: duplicate key '{key}'")
        kv[key] = c.value(c.unpack("<I", f"type of '{key}'"), f"value of '{key}'")
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in kv:
        a = kv["general.alignment"]
        if a.type != GGUFValueType.UINT32 or a.value <= 0 or a.value & (a.value - 1):
            raise FormatError(f"{path}: general.alignment must be a power-of-two UINT32, got {a.value!r}")
        alignment = a.value
    ti_start = c.pos
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = c.string(f"tensor #{i} name")
        where = f"{path}: tensor '{name}'"
        if name in names:
            raise FormatError(f"{where}: duplicate tensor name")
        names.add(name)
        n_dims = c.unpack("<I", f"tensor '{name}' n_dims")
        if not 1 <= n_dims <= 4:
            raise FormatError(f"{where}: {n_dims} dimensions (1 to 4 allowed)")
        ne = tuple(c.unpack("<Q", f"tensor '{name}' dims") for _ in range(n_dims))
        raw_type = c.unpack("<I", f"tensor '{name}' type")
        offset = c.unpack("<Q", f"tensor '{name}' offset")
        try:
            qtype = GGMLQuantizationType(raw_type)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise UnsupportedError(f"{where}: ggml type {raw_type} is not supported") from None
        if ne[0] % block:
            raise FormatError(f"{where}: row length {ne[0]} is not a multiple of the "
                              f"{qtype.name} block size {block}")
        rows = 1
        for d in ne[1:]:
            rows *= d
        nbytes = ne[0] // block * block_bytes * rows
        if offset % alignment:
            raise FormatError(f"{where}: offset {offset} is not a multiple of the alignment {alignment}")
        tensors.append(TensorInfo(name, ne, qtype, offset, nbytes))
    ti_end = c.pos
    data_offset = -(-ti_end // alignment) * alignment if tensors else ti_end
    for t in tensors if check_data else ():
        if data_offset + t.offset + t.nbytes > size:
            raise FormatError(f"{path}: tensor '{t.name}' data ends at byte "
                              f"{data_offset + t.offset + t.nbytes}, beyond the end of the file "
                              f"({size} bytes; truncated?)")
    return GGUFHeader(path, version, kv, tensors, alignment, ti_start, ti_end, data_offset, size)


def ggml_layout_problems(h: GGUFHeader) -> list[str]:
    """What the ggml C reader (llama.cpp) would refuse that gguf-py lets through: names of 64
    bytes or more, and data offsets that are not dense and in tensor-info order."""
    problems = []
    expected = 0
    for t in h.tensors:
        if len(t.name.encode()) > MAX_NAME_BYTES:
            problems.append(f"tensor '{t.name}': name is {len(t.name.encode())} bytes (ggml allows {MAX_NAME_BYTES})")
        if t.offset != expected:
            problems.append(f"tensor '{t.name}': offset {t.offset}, ggml expects {expected}")
        expected = t.offset + -(-t.nbytes // h.alignment) * h.alignment
    return problems
