"""A small streaming safetensors reader: one tensor at a time, straight from an mmap, no torch.

File layout (https://github.com/huggingface/safetensors): a little-endian u64 N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``), then the
data; offsets are relative to the first byte after the JSON. Every header field is checked before
any data is read, so a truncated or inconsistent file fails with a FormatError naming the file and
the tensor instead of a crash or silently wrong numbers.

A checkpoint directory holds ``model.safetensors``, or shards listed by
``model.safetensors.index.json`` (``{"weight_map": {tensor: file}}``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import os
from collections.abc import Iterator

import numpy as np

from ..errors import FormatError, UnsupportedError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

# dtype name -> (itemsize, numpy dtype when we can read it as float)
_DTYPES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1,
}
_READABLE = ("F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def _fp8_table(exp_bits: int, bias: int, nan_all_ones: bool) -> np.ndarray:
    """The 256 float32 values of an 8-bit float (sign, exp_bits, the rest mantissa): E4M3 as
    torch's float8_e4m3fn (no infinities, S.1111.111 NaN), E5M2 as IEEE (infinities and NaNs)."""
    man_bits = 7 - exp_bits
    out = np.empty(256, np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> man_bits) & ((1 << exp_bits) - 1), b & ((1 << man_bits) - 1)
        if e == (1 << exp_bits) - 1 and (m == (1 << man_bits) - 1 if nan_all_ones else True):
            out[b] = np.nan if (nan_all_ones or m) else sign * np.inf
        elif e == 0:
            out[b] = sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            out[b] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return out


_FP8 = {"F8_E4M3": _fp8_table(4, 7, True), "F8_E5M2": _fp8_table(5, 15, False)}
_MAX_HEADER = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class SafetensorsFile:
    """One ``.safetensors`` file, mapped read-only. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._file = None
        self._map: mmap.mmap | None = None
        try:
            self._file = open(self.path, "rb")
            size = os.fstat(self._file.fileno()).st_size
            if size < 8:
                raise FormatError(f"{self.path}: {size} bytes, too short for a safetensors header")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.metadata, self.entries = _parse_header(self.path, self._map, size)
        except BaseException:
            self.close()
            raise

    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def entry(self, name: str) -> TensorEntry:
        try:
            return self.entries[name]
        except KeyError:
            raise FormatError(f"{self.path}: no tensor '{name}'") from None

    def read_f32(self, name: str, index: int | None = None) -> np.ndarray:
        """The tensor as a new float32 array of its shape (F32, F16, BF16 and the 8-bit floats are
        read, the latter without their scales: SafetensorsCheckpoint applies those); with ``index``,
        only the slab ``tensor[index]`` (one expert of a stacked expert tensor)."""
        e = self.entry(name)
        if e.dtype not in _READABLE:
            raise UnsupportedError(f"{self.path}: tensor '{name}' has dtype {e.dtype}; only "
                                   f"{', '.join(_READABLE)} can be converted")
        begin, n, shape = self._slab(e, index)
        if e.dtype == "F32":
            out = np.frombuffer(self._map, dtype="<f4", count=n, offset=begin).astype(np.float32)
        elif e.dtype == "F16":
            out = np.frombuffer(self._map, dtype="<f2", count=n, offset=begin).astype(np.float32)
        elif e.dtype in _FP8:
            out = _FP8[e.dtype][np.frombuffer(self._map, dtype=np.uint8, count=n, offset=begin)]
        else:  # BF16 is the top half of an IEEE float32
            raw = np.frombuffer(self._map, dtype="<u2", count=n, offset=begin)
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        self._drop_pages(begin, begin + n * _DTYPES[e.dtype])
        return out.reshape(shape)

    def read_ints(self, name: str) -> list[int]:
        """An integer tensor (I64, I32, U64, U32: hash constants) as exact Python ints, flattened."""
        e = self.entry(name)
        kinds = {"I64": "<i8", "I32": "<i4", "U64": "<u8", "U32": "<u4"}
        if e.dtype not in kinds:
            raise FormatError(f"{self.path}: tensor '{name}' has dtype {e.dtype}, expected an integer type")
        begin, n, _ = self._slab(e, None)
        return [int(x) for x in np.frombuffer(self._map, dtype=kinds[e.dtype], count=n, offset=begin)]

    def read_i32(self, name: str) -> np.ndarray:
        """An integer tensor (a table of expert ids: DeepSeek-V4's tid2eid) as a new int32 array of
        its shape; values outside int32 are refused."""
        e = self.entry(name)
        if e.dtype not in ("I64", "I32", "I16", "I8", "U32", "U16", "U8"):
            raise FormatError(f"{self.path}: tensor '{name}' has dtype {e.dtype}, expected an integer type")
        begin, n, shape = self._slab(e, None)
        dt = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U32": "<u4", "U16": "<u2", "U8": "u1"}[e.dtype]
        out = np.frombuffer(self._map, dtype=dt, count=n, offset=begin)
        if out.size and (out.min() < -2**31 or out.max() >= 2**31):
            raise FormatError(f"{self.path}: tensor '{name}' holds values outside 32-bit integers")
        self._drop_pages(begin, begin + n * _DTYPES[e.dtype])
        return out.astype(np.int32).reshape(shape)

    def read_u8(self, name: str, index: int | None = None) -> np.ndarray:
        """A U8 tensor (MXFP4 blocks and scales) as a new uint8 array, or its slab ``index``."""
        e = self.entry(name)
        if e.dtype != "U8":
            raise FormatError(f"{self.path}: tensor '{name}' has dtype {e.dtype}, expected U8")
        begin, n, shape = self._slab(e, index)
        out = np.frombuffer(self._map, dtype=np.uint8, count=n, offset=begin).copy()
        self._drop_pages(begin, begin + n)
        return out.reshape(shape)

    def _slab(self, e: TensorEntry, index: int | None) -> tuple[int, int, tuple[int, ...]]:
        """(absolute offset, elements, shape) of the tensor or of its slab along dimension 0."""
        if self._map is None:
            raise ValueError(f"{self.path}: file is closed")
        if index is None:
            return e.begin, e.n_elements, e.shape
        if not e.shape or not 0 <= index < e.shape[0]:
            raise FormatError(f"{self.path}: tensor '{e.name}' of shape {list(e.shape)} has no slab {index}")
        n = math.prod(e.shape[1:])
        return e.begin + index * n * _DTYPES[e.dtype], n, e.shape[1:]

    def _drop_pages(self, begin: int, end: int) -> None:
        # Mapped file pages count towards our RSS until released; a converter reads each tensor
        # once, so give them back and keep the footprint near one tensor.
        if not hasattr(mmap, "MADV_DONTNEED") or self._map is None:
            return
        start = begin - begin % mmap.PAGESIZE
        if end > start:
            try:
                self._map.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive (an exception's frame): the GC unmaps it
                pass
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _parse_header(path: str, buf: mmap.mmap, size: int) -> tuple[dict, dict[str, TensorEntry]]:
    n = int.from_bytes(buf[:8], "little")
    if n == 0 or n > _MAX_HEADER or 8 + n > size:
        raise FormatError(f"{path}: header length {n} does not fit in a {size}-byte file "
                          "(not a safetensors file, or truncated)")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + n
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        where = f"{path}: tensor '{name}'"
        if not isinstance(info, dict):
            raise FormatError(f"{where}: entry is not a JSON object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in _DTYPES:
            raise FormatError(f"{where}: unknown dtype {dtype!r}")
        if (not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise FormatError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise FormatError(f"{where}: bad data_offsets {offsets!r}")
        expected = math.prod(shape) * _DTYPES[dtype]
        if offsets[1] - offsets[0] != expected:
            raise FormatError(f"{where}: data_offsets span {offsets[1] - offsets[0]} bytes but "
                              f"shape {shape} x {dtype} needs {expected}")
        begin, end = data_start + offsets[0], data_start + offsets[1]
        if end > size:
            raise FormatError(f"{where}: data ends at byte {end} but the file has only {size} "
                              "bytes (truncated?)")
        entries[name] = TensorEntry(name, dtype, tuple(shape), begin, end)
    last_end, last_name = data_start, None
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
        if e.begin < last_end and e.end > e.begin:
            raise FormatError(f"{path}: tensor '{e.name}' overlaps tensor '{last_name}'")
        if e.end > last_end:
            last_end, last_name = e.end, e.name
    return metadata, entries


SCALE_INV = "_scale_inv"   # an FP8 weight's per-block scales: the tensor's name plus this


def dequantize_blocks(w: np.ndarray, scale: np.ndarray, block: tuple[int, int] | None, where: str) -> np.ndarray:
    """w (..., rows, cols) times its per-block scales (..., ceil(rows / b0), ceil(cols / b1)), as
    transformers dequantizes block-wise FP8 checkpoints (the product in float32). block: the
    config's weight_block_size, else what the scale grid divides evenly."""
    rows, cols = w.shape[-2:] if w.ndim >= 2 else (1, w.shape[-1])
    if scale.ndim != w.ndim:
        raise FormatError(f"{where}: scales of shape {list(scale.shape)} for a weight of shape {list(w.shape)}")
    if block is None:
        sr, sc = scale.shape[-2:] if scale.ndim >= 2 else (1, scale.shape[-1])
        if rows % sr or cols % sc:
            raise FormatError(f"{where}: a weight of {rows} x {cols} is no whole number of blocks of its scale "
                              f"grid {sr} x {sc}, and config.json gives no weight_block_size")
        block = (rows // sr, cols // sc)
    b0, b1 = block
    want = (*w.shape[:-2], -(-rows // b0), -(-cols // b1)) if w.ndim >= 2 else (-(-cols // b1),)
    if scale.shape != tuple(want):
        raise FormatError(f"{where}: scales of shape {list(scale.shape)}, but blocks of {b0} x {b1} over a weight "
                          f"of shape {list(w.shape)} need {list(want)}")
    if w.ndim < 2:
        return w * np.repeat(scale, b1)[:cols]
    full = np.repeat(np.repeat(scale.astype(np.float32), b0, axis=-2), b1, axis=-1)[..., :rows, :cols]
    return w * full


class SafetensorsCheckpoint:
    """All tensors of a checkpoint directory, single-file or sharded, by tensor name. An 8-bit
    float weight is read with its ``<name>_scale_inv`` block scales applied (``fp8_block``: the
    config's weight_block_size, or None: from the scale grid)."""

    fp8_block: tuple[int, int] | None = None

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = os.fspath(directory)
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, str] = {}
        self._stored: dict[str, str] = {}   # a name read under another (rename_prefix) -> its name in the file
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        index_path = os.path.join(self.directory, INDEX_NAME)
        if os.path.exists(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise FormatError(f"{index_path}: not a valid safetensors index ({exc!r})") from None
            for fname in sorted(set(weight_map.values())):
                self._add_file(fname)
            for name, fname in weight_map.items():
                if name not in self._files[fname].entries:
                    raise FormatError(f"{index_path}: tensor '{name}' is listed in {fname} "
                                      "but that file does not contain it")
                self._where[name] = fname
            return
        single = os.path.join(self.directory, SINGLE_NAME)
        fnames = [SINGLE_NAME] if os.path.exists(single) else sorted(
            f for f in os.listdir(self.directory) if f.endswith(".safetensors"))
        if not fnames:
            raise FormatError(f"{self.directory}: no {SINGLE_NAME}, {INDEX_NAME} or *.safetensors file")
        for fname in fnames:
            st = self._add_file(fname)
            for name in st.entries:
                if name in self._where:
                    raise FormatError(f"{self.directory}: tensor '{name}' is in both "
                                      f"{self._where[name]} and {fname}")
                self._where[name] = fname

    def _add_file(self, fname: str) -> SafetensorsFile:
        if os.path.basename(fname) != fname:
            raise FormatError(f"{self.directory}: shard name {fname!r} is not a plain file name")
        path = os.path.join(self.directory, fname)
        if not os.path.isfile(path):
            raise FormatError(f"{path}: shard listed in {INDEX_NAME} is missing")
        st = self._files[fname] = SafetensorsFile(path)
        return st

    def rename_prefix(self, old: str, new: str) -> None:
        """Presents the tensors stored as ``old + rest`` as ``new + rest`` (a multimodal checkpoint's
        text model under the names of the text-only model)."""
        for name in [n for n in self._where if n.startswith(old)]:
            renamed = new + name[len(old):]
            if renamed in self._where:
                raise FormatError(f"{self.directory}: tensors '{name}' and '{renamed}' both give '{renamed}'")
            self._where[renamed] = self._where.pop(name)
            self._stored[renamed] = self._stored.pop(name, name)

    @property
    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def entry(self, name: str) -> TensorEntry:
        return self._file(name).entry(self._stored.get(name, name))

    def file_of(self, name: str) -> str:
        return self._file(name).path

    def read_f32(self, name: str, index: int | None = None) -> np.ndarray:
        w = self._file(name).read_f32(self._stored.get(name, name), index)
        dtype = self.entry(name).dtype
        if dtype not in _FP8:
            return w
        if name + SCALE_INV not in self:
            raise UnsupportedError(f"{self.file_of(name)}: tensor '{name}' is {dtype} without '{name}{SCALE_INV}': "
                                   "only FP8 checkpoints with per-block scales (quant_method fp8) can be converted")
        scale = self._file(name + SCALE_INV).read_f32(self._stored.get(name + SCALE_INV, name + SCALE_INV), index)
        return dequantize_blocks(w, scale, self.fp8_block, f"{self.file_of(name)}: tensor '{name}'")

    def read_u8(self, name: str, index: int | None = None) -> np.ndarray:
        return self._file(name).read_u8(self._stored.get(name, name), index)

    def read_ints(self, name: str) -> list[int]:
        return self._file(name).read_ints(self._stored.get(name, name))

    def read_i32(self, name: str) -> np.ndarray:
        return self._file(name).read_i32(self._stored.get(name, name))

    def _file(self, name: str) -> SafetensorsFile:
        try:
            return self._files[self._where[name]]
        except KeyError:
            raise FormatError(f"{self.directory}: checkpoint has no tensor '{name}'") from None

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
