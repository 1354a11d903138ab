"""The RESplit file pair: names, keys and the identity check between a base and its residual.

A RESplit model is two standard GGUF files (docs/FORMAT.md):

- ``NAME.gguf``, the base: a plain llama.cpp file whose expert tensors are the low-bit base B;
- ``NAME.residual.gguf``, the sidecar: for each expert tensor ``blk.N.ffn_X_exps.weight`` a tensor
  ``blk.N.ffn_X_exps.residual`` holding R = W - dequant(B), quantized again.

The sidecar records which base it belongs to (the base's uuid and a sha256 of its tensor-info
block), so a residual is never applied to a base it was not computed from. The converter writes
these; the runtime calls ``check_pair`` before loading a pair.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import re
import struct

from .errors import FormatError
from .gguf_file import GGUFFile, open_gguf
from .gguf_header import read_header
from .gguf_rewrite import rewrite_with_kv
from .metadata import get_int, get_int_list, get_str
from .tool_calls import detect as detect_tool_format

FORMAT_VERSION = 1

KEY_FORMAT_VERSION = "rapidmoe.format_version"    # u32, both files
KEY_RECIPE = "rapidmoe.recipe"                    # str, both files
KEY_UUID = "rapidmoe.uuid"                        # str, base: fresh uuid4 per conversion
KEY_BASE_TYPE = "rapidmoe.base_type"              # str, sidecar: the recipe's base type name
KEY_RESIDUAL_TYPE = "rapidmoe.residual_type"      # str, sidecar: the recipe's residual type name
KEY_BASE_UUID = "rapidmoe.base.uuid"              # str, sidecar: the base's rapidmoe.uuid
KEY_BASE_TI_SHA256 = "rapidmoe.base.tensor_info_sha256"  # str (hex), sidecar
KEY_BASE_FINGERPRINTS = "rapidmoe.base.expert_fingerprints"  # u64 array, sidecar: one per tensor

FINGERPRINT_WINDOW = 1024  # bytes hashed at each end of a base expert tensor
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3

RESIDUAL_FILE_SUFFIX = ".residual.gguf"
_EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
# llama.cpp's gemma4 files hold an expert's gate and up rows in one tensor; conversion splits it
FUSED_GATE_UP_RE = re.compile(r"^blk\.(\d+)\.ffn_gate_up_exps\.weight$")
_RESIDUAL_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.residual$")
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


def residual_path(base_path: str | os.PathLike[str]) -> str:
    """``NAME.gguf`` -> ``NAME.residual.gguf`` (never llama.cpp's ``-0000N-of-0000M`` pattern)."""
    p = os.fspath(base_path)
    stem = p[:-len(".gguf")] if p.endswith(".gguf") else p
    return stem + RESIDUAL_FILE_SUFFIX


def is_split_name(path: str | os.PathLike[str]) -> bool:
    return bool(_SPLIT_RE.search(os.fspath(path)))


def is_expert_tensor(name: str) -> bool:
    return _EXPERT_RE.match(name) is not None


def residual_tensor_name(base_name: str) -> str:
    """``blk.N.ffn_up_exps.weight`` -> ``blk.N.ffn_up_exps.residual``."""
    if not is_expert_tensor(base_name):
        raise ValueError(f"'{base_name}' is not an expert tensor")
    return base_name[:-len(".weight")] + ".residual"


def base_tensor_name(residual_name: str) -> str:
    if _RESIDUAL_RE.match(residual_name) is None:
        raise ValueError(f"'{residual_name}' is not a residual tensor name")
    return residual_name[:-len(".residual")] + ".weight"


def base_identity(path: str | os.PathLike[str] | GGUFFile) -> tuple[str | None, str]:
    """(``rapidmoe.uuid`` or None for a file we did not write, sha256 hex of the tensor-info
    block): the bytes from the first tensor info to the end of the last one. Given a path, only
    the header is read, so this works on a base whose tensor data is still being written; given
    a file open with ``open_gguf``, its parsed header is used."""
    if isinstance(path, GGUFFile):
        file, md, span = path.path, path.metadata, path.tensor_infos_span
    else:
        h = read_header(path, check_data=False)
        file, md, span = h.path, h, (h.ti_start, h.ti_end)
    uuid = get_str(md, KEY_UUID, where=f"{file}: ")
    with open(file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        digest = hashlib.sha256(buf[span[0]:span[1]]).hexdigest()
    return uuid, digest


def fingerprint(type_id: int, ne: tuple[int, ...], data) -> int:
    """The sidecar's check of one base expert tensor's data: FNV-1a (64-bit) over its ggml type
    (u32), ne padded to 4 dims (u64 each), byte size (u64), then its first and its last
    min(FINGERPRINT_WINDOW, size) bytes. The same function is in native/src/model/model.c."""
    n = len(data)
    w = min(FINGERPRINT_WINDOW, n)
    ne4 = tuple(ne) + (1,) * (4 - len(ne))
    h = _FNV_OFFSET
    for part in (struct.pack("<I4QQ", type_id, *ne4, n), bytes(data[:w]), bytes(data[n - w:])):
        for byte in part:
            h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def base_fingerprints(base: str | os.PathLike[str] | GGUFFile, residual_names: list[str]) -> list[int]:
    """``fingerprint`` of the base tensor of each residual tensor name, in that order; base: a
    path, or the base open with ``open_gguf``."""
    with _opened(base) as b:
        out = []
        for name in residual_names:
            t = b.tensors.get(base_tensor_name(name))
            if t is None:
                raise FormatError(f"{b.path}: no tensor '{base_tensor_name(name)}' for residual '{name}'")
            out.append(fingerprint(t.type_id, t.ne, t.data))
        return out


def _opened(f: str | os.PathLike[str] | GGUFFile) -> contextlib.AbstractContextManager[GGUFFile]:
    """f itself when already open (the caller closes it), else f opened for a with block."""
    return contextlib.nullcontext(f) if isinstance(f, GGUFFile) else open_gguf(f)


def _check_fingerprints(base: GGUFFile, residual_file: str, names: list[str], want: list[int]) -> None:
    base_path = base.path
    if len(want) != len(names):
        raise FormatError(f"{residual_file}: {KEY_BASE_FINGERPRINTS} has {len(want)} entries for "
                          f"{len(names)} tensors")
    for name, w, got in zip(names, want, base_fingerprints(base, names)):
        if w != got:
            raise FormatError(
                f"{base_path}: base tensor '{base_tensor_name(name)}' is not the data {residual_file} was "
                f"made for (fingerprint {got:016x}, expected {w:016x}); the base was changed after "
                f"conversion: reconvert, or pass the matching pair")


def add_fingerprints(base_path: str | os.PathLike[str], residual_file: str | os.PathLike[str]) -> None:
    """Gives a sidecar written before ``KEY_BASE_FINGERPRINTS`` existed the fingerprints of its
    base's data, after ``check_pair`` has accepted the pair as it is (rewritten atomically). Only
    run it on a base known to be the one the sidecar was converted with."""
    import numpy as np

    check_pair(base_path, residual_file)
    names = [t.name for t in read_header(residual_file).tensors]
    fps = np.asarray(base_fingerprints(base_path, names), dtype=np.uint64)
    rewrite_with_kv(os.fspath(residual_file), {KEY_BASE_FINGERPRINTS: fps})
    check_pair(base_path, residual_file)


def check_pair(base: str | os.PathLike[str] | GGUFFile, residual: str | os.PathLike[str] | GGUFFile) -> None:
    """Raise FormatError unless ``residual`` is the sidecar written for ``base``. Each is a path,
    or the file already open with ``open_gguf`` (a Model's load passes its open files, so that it
    parses each header once)."""
    with _opened(base) as b, _opened(residual) as r:
        _check_pair(b, r)


def _check_pair(b: GGUFFile, r: GGUFFile) -> None:
    base_path, residual_file = b.path, r.path
    rmd, bmd = r.metadata, b.metadata
    rw, bw = f"{residual_file}: ", f"{base_path}: "
    version = get_int(rmd, KEY_FORMAT_VERSION, where=rw)
    if version is None or KEY_BASE_UUID not in rmd:
        raise FormatError(f"{residual_file}: no {KEY_BASE_UUID}; not a RESplit residual file")
    if version != FORMAT_VERSION:
        raise FormatError(f"{residual_file}: {KEY_FORMAT_VERSION} is {version}; this version reads {FORMAT_VERSION}")
    r_arch, b_arch = get_str(rmd, "general.architecture", where=rw), get_str(bmd, "general.architecture", where=bw)
    if r_arch != b_arch:
        raise FormatError(f"{residual_file}: architecture '{r_arch}' but the base {base_path} is '{b_arch}'")
    want_uuid, want_sha = get_str(rmd, KEY_BASE_UUID, where=rw), get_str(rmd, KEY_BASE_TI_SHA256, where=rw)
    if want_uuid is None or want_sha is None:
        raise FormatError(f"{residual_file}: {KEY_BASE_UUID} or {KEY_BASE_TI_SHA256} is missing")
    uuid, sha = base_identity(b)
    if uuid != want_uuid or sha != want_sha:
        raise FormatError(
            f"{residual_file} does not belong to {base_path}: it was made for base uuid {want_uuid} "
            f"(tensor infos sha256 {want_sha[:16]}...), the base has uuid {uuid} "
            f"(tensor infos sha256 {sha[:16]}...); reconvert, or pass the matching pair")
    for t in r.tensors.values():
        try:
            bt = b.tensors.get(base_tensor_name(t.name))
        except ValueError:
            raise FormatError(f"{residual_file}: unexpected tensor '{t.name}'") from None
        if bt is None:
            raise FormatError(f"{residual_file}: tensor '{t.name}' has no base tensor in {base_path}")
        if bt.ne != t.ne:
            raise FormatError(f"{residual_file}: tensor '{t.name}' has ne {list(t.ne)} but the base "
                              f"has {list(bt.ne)}")
    fps = get_int_list(rmd, KEY_BASE_FINGERPRINTS, where=rw)
    if fps is not None:  # sidecars written before the key existed are bound by uuid and hash only
        _check_fingerprints(b, residual_file, list(r.tensors), fps)


def describe(path: str | os.PathLike[str]) -> dict:
    """A summary of a GGUF file (and of its sidecar when there is one), as plain data: what
    ``rapidmoe inspect`` prints. Works on any GGUF: a stock llama.cpp file, our base, or a sidecar.
    A base's ``tool_call_format`` is the one its chat template shows (tool_calls.detect; None
    without a template)."""
    path = os.fspath(path)
    h = read_header(path)
    arch = h.get("general.architecture")
    info: dict = {
        "path": path,
        "file_size": h.file_size,
        "architecture": arch,
        "name": h.get("general.name"),
        "kind": "residual" if KEY_BASE_UUID in h.kv else "base",
        "hparams": {k[len(arch) + 1:]: _plain(kv.value) for k, kv in h.kv.items()
                    if isinstance(arch, str) and k.startswith(arch + ".")},
        "rapidmoe": {k: _plain(kv.value) for k, kv in h.kv.items() if k.startswith("rapidmoe.")},
        "n_tensors": len(h.tensors),
        "types": _type_table(h.tensors),
    }
    if info["kind"] == "residual":
        return info
    template = h.get("tokenizer.chat_template")
    info["tool_call_format"] = detect_tool_format(template).name if isinstance(template, str) else None
    experts = [t for t in h.tensors if is_expert_tensor(t.name)]
    n_weights = sum(t.n_elements for t in experts)
    base_bytes = sum(t.nbytes for t in experts)
    side = residual_path(path)
    sidecar: dict | None = None
    res_bytes = 0
    if os.path.exists(side):
        sidecar = {"path": side}
        try:
            check_pair(path, side)
            sidecar["matches"] = True
            rh = read_header(side)
            res_bytes = sum(t.nbytes for t in rh.tensors)
            sidecar["n_tensors"] = len(rh.tensors)
            sidecar["types"] = _type_table(rh.tensors)
        except FormatError as exc:
            sidecar["matches"] = False
            sidecar["error"] = str(exc)
    info["sidecar"] = sidecar
    info["experts"] = {
        "n_tensors": len(experts),
        "n_weights": n_weights,
        "base_bytes": base_bytes,
        "residual_bytes": res_bytes,
        "bpw_base": 8.0 * base_bytes / n_weights if n_weights else None,
        "bpw_base_residual": 8.0 * (base_bytes + res_bytes) / n_weights if n_weights else None,
    }
    return info


def _type_table(tensors) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for t in tensors:
        row = table.setdefault(t.type_name, {"count": 0, "bytes": 0})
        row["count"] += 1
        row["bytes"] += t.nbytes
    return table


def _plain(v):
    if isinstance(v, list) and len(v) > 16:
        return f"[{len(v)} items]"
    return v
