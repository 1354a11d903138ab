"""A GGUF file's keys added or replaced in place, atomically (the sidecar's UMIA tables and
fingerprints, a shipped model's metadata): the file is written anew beside the old one and moved
over it, so a failure leaves the old file whole."""

from __future__ import annotations

import os

import gguf
import numpy as np
from gguf.gguf_writer import WriterState

from . import atomic


def _copy_with_kv(src: str, dst, kv: dict[str, object]) -> None:
    """Writes src, with the keys of kv replaced or added, to the open binary file dst (tensors
    copied byte for byte)."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(None, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in kv:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    V = gguf.GGUFValueType
    for name, value in kv.items():
        if isinstance(value, np.ndarray) and value.dtype == np.uint64:
            w.add_key_value(name, value.tolist(), V.ARRAY, sub_type=V.UINT64)
        elif isinstance(value, list):
            w.add_key_value(name, value, V.ARRAY, sub_type=V.FLOAT32 if isinstance(value[0], float) else V.INT32)
        elif isinstance(value, str):
            w.add_key_value(name, value, V.STRING)
        elif isinstance(value, bool):
            w.add_key_value(name, value, V.BOOL)
        elif isinstance(value, int):
            w.add_key_value(name, value, V.UINT32 if 0 <= value < 2**32 else V.INT64)
        else:
            w.add_key_value(name, float(value), V.FLOAT32)
    for t in r.tensors:
        w.add_tensor(t.name, _WrittenByFile(t.data), raw_dtype=t.tensor_type)
    w.fout, w.state = [dst], WriterState.EMPTY  # our own file, not one the writer opens
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    atomic.fsync_file(dst)
    w.close()


class _WrittenByFile:
    """A tensor that GGUFWriter stores with the file's write, not ndarray.tofile: a short write
    of tofile raises only "N requested and M written", losing the errno (ENOSPC) that says why."""

    def __init__(self, data: np.ndarray):
        self.data = np.ascontiguousarray(data)
        self.shape, self.dtype, self.nbytes = self.data.shape, self.data.dtype, self.data.nbytes

    def tofile(self, f) -> None:
        f.write(memoryview(self.data).cast("B"))


def rewrite_with_kv(path: str, kv: dict[str, object]) -> None:
    """Adds or replaces keys of a GGUF file atomically: the old file stays intact on any failure,
    and the new one is on disk (file and folder fsync'd) when this returns."""
    path = os.path.abspath(path)
    atomic.sweep_leftovers(os.path.dirname(path))
    need = os.path.getsize(path) if os.path.isfile(path) else None   # about the new file's size
    tmp, f = atomic.create_temp(path)
    try:
        with f:
            _copy_with_kv(path, f, kv)
        os.replace(tmp, path)
    except BaseException as exc:
        atomic.remove_quietly(tmp)   # first: the room write_error reports counts the temporary's
        if isinstance(exc, OSError) and not exc.filename:   # a write to the temporary (reads name their file)
            raise atomic.write_error(path, exc, need=need) from exc
        raise
    atomic.fsync_dir(os.path.dirname(path))
