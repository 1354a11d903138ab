"""Hugging Face checkpoint or GGUF -> RESplit pair (``OUT.gguf`` + ``OUT.residual.gguf``).

The conversion streams: every tensor's type and byte size is decided first, both headers are
written, then tensors are read, quantized and written one at a time (expert tensors one expert at a
time), so memory stays near one expert matrix whatever the model's size. For each expert matrix W
the base is B = quant(W) and the residual R = quant(W - dequant(B)). Both files are written under
temporary names beside OUT (``atomic.create_temp``) and renamed into place only when complete; on
any error or interrupt the temporaries are removed and an existing OUT is left as it was. OUT may
not be the source or its sidecar, and a sidecar the new base cannot use is never deleted silently.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
import uuid as uuidlib

import numpy as np
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState

from .. import atomic, resplit
from ..errors import InvalidArgumentError, RapidMoEError
from ..gguf_header import read_header
from .recipes import (FILE_TYPE, Recipe, bits_per_weight, block_size, fit_type, is_quantized,
                      resolve_recipe)
from .imatrix import Imatrix, read_imatrix
from .sources import Source, SourceTensor, open_source

log = logging.getLogger("rapidmoe_gguf.convert")


@dataclasses.dataclass
class TypeStats:
    count: int = 0
    nbytes: int = 0


@dataclasses.dataclass(frozen=True)
class Fallback:
    tensor: str
    wanted: str
    used: str
    reason: str


@dataclasses.dataclass
class ConvertReport:
    """What ``convert`` wrote. Bits per weight and errors are over the expert tensors; errors are
    relative Frobenius norms ||W - W'|| / ||W|| over the experts that were quantized (None when all
    were copied from an input GGUF unchanged)."""

    base_path: str
    residual_path: str | None
    architecture: str
    recipe: str
    base_type: str
    residual_type: str | None
    other_type: str
    base_types: dict[str, TypeStats]
    residual_types: dict[str, TypeStats]
    expert_weights: int
    expert_base_bytes: int
    expert_residual_bytes: int
    error_base: float | None
    error_total: float | None
    fallbacks: list[Fallback]
    seconds: float
    kept_sidecar: str | None = None   # an earlier OUT's sidecar that fits no base now, set aside
    imatrix_tensors: int = 0          # expert tensors whose base was quantized under an importance

    @property
    def bpw_base(self) -> float:
        return 8.0 * self.expert_base_bytes / self.expert_weights

    @property
    def bpw_total(self) -> float:
        return 8.0 * (self.expert_base_bytes + self.expert_residual_bytes) / self.expert_weights

    @property
    def n_tensors(self) -> int:
        return sum(s.count for s in self.base_types.values())


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], recipe: str = "q4k-q8", *,
            base_type: str | None = None, residual_type: str | None = None,
            other_type: str | None = None, n_threads: int = 0,
            progress: bool | None = None, imatrix: str | os.PathLike[str] | None = None,
            pre_tokenizer: str | None = None) -> ConvertReport:
    """Convert ``src`` (an HF checkpoint directory or a ``.gguf`` file) to ``out`` and, when the
    recipe has a residual, ``out`` with ``.gguf`` replaced by ``.residual.gguf``.

    ``n_threads`` goes to the native quantizer (0: all cores). ``progress`` shows a bar (None: when
    stderr is a terminal). ``imatrix``: a llama.cpp importance-matrix GGUF (``llama-imatrix``'s
    output) whose rows weigh the expert bases' quantization error, for the base types that take
    one (IQ2_XXS, IQ3_XXS); without it they minimise the plain squared error. ``pre_tokenizer``:
    the llama.cpp pre-tokenizer name (`tokenizer.ggml.pre`) to give a Hugging Face tokenizer that
    splits by a known rule but has a fingerprint the converter does not know (warned about when
    the tokenizer.json does not match it); without it such a tokenizer is refused.
    """
    t0 = time.perf_counter()
    rec = resolve_recipe(recipe, base_type=base_type, residual_type=residual_type, other_type=other_type)
    src, out = os.fspath(src), os.path.abspath(os.fspath(out))
    _check_out(out)
    res_out = resplit.residual_path(out)
    _check_not_source(src, out, res_out)
    imx = read_imatrix(imatrix) if imatrix is not None else None
    atomic.sweep_leftovers(os.path.dirname(out))
    source = open_source(src, pre_tokenizer)
    temps: list[str] = []
    try:
        report = _write(source, rec, out, res_out, temps, n_threads, _want_bar(progress), imx)
        report.kept_sidecar = _commit(temps[0], out, temps[1] if report.residual_path else None, res_out)
    except BaseException as exc:
        for p in temps:
            atomic.remove_quietly(p)
        if isinstance(exc, OSError):
            raise atomic.write_error(out, exc) from exc
        raise
    finally:
        source.close()
    report.seconds = time.perf_counter() - t0
    return report


# ---------------------------------------------------------------------------------------------
# Planning: the type and size of every tensor, decided before anything is written
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Planned:
    src: SourceTensor
    out_type: str
    copy: bool                   # write the source's bytes unchanged
    residual_type: str | None
    importance: list | None = None   # per expert: the base quantizer's importance row, or None

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.out_type, self.src.ne)

    @property
    def residual_nbytes(self) -> int:
        return tensor_nbytes(self.residual_type, self.src.ne) if self.residual_type else 0


def tensor_nbytes(type_name: str, ne: tuple[int, ...]) -> int:
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return ne[0] // block * block_bytes * math.prod(ne[1:])


def _fit(wanted: str, t: SourceTensor, name: str, fallbacks: list[Fallback]) -> str:
    used = fit_type(wanted, t.ne[0])
    if used != wanted:
        reason = f"row length {t.ne[0]} is not a multiple of the {wanted} block ({block_size(wanted)})"
        fallbacks.append(Fallback(name, wanted, used, reason))
        log.warning("%s: %s instead of %s: %s", name, used, wanted, reason)
    return used


def _plan(source: Source, rec: Recipe, fallbacks: list[Fallback], imx: Imatrix | None = None) -> list[_Planned]:
    plan = []
    for t in source.tensors:
        if t.role == "expert":
            base = _fit(rec.base_type, t, t.name, fallbacks)
            if t.src_type == base:
                # The input already holds B exactly, so W = dequant(B) and R would be zero:
                # copy the bytes and write no residual for this tensor.
                plan.append(_Planned(t, base, True, None))
                continue
            res = (_fit(rec.residual_type, t, resplit.residual_tensor_name(t.name), fallbacks)
                   if rec.residual_type else None)
            plan.append(_Planned(t, base, False, res, _importance(imx, t, base)))
        elif t.role in ("router", "vector"):
            plan.append(_Planned(t, "F32", t.src_type == "F32", None))
        elif t.role == "index":   # integers: copied as they are
            plan.append(_Planned(t, t.src_type or "I32", True, None))
        elif t.src_type is not None and _at_least_as_precise(t.src_type, rec.other_type):
            plan.append(_Planned(t, t.src_type, True, None))
        else:
            plan.append(_Planned(t, _fit(rec.other_type, t, t.name, fallbacks), False, None))
    return plan


def _importance(imx: Imatrix | None, t: SourceTensor, base_type: str) -> list | None:
    from .. import quants

    if imx is None or not quants.type_info(base_type).takes_importance:
        return None
    if t.name not in imx:
        log.warning("%s: no entry in the imatrix %s; its %s base minimises the plain squared error",
                    t.name, imx.path, base_type)
        return None
    return imx.importance(t.name, t.ne[0], t.ne[2])


def _at_least_as_precise(src_type: str, other: str) -> bool:
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[src_type]]
    return 8.0 * block_bytes / block >= bits_per_weight(other)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

class _Out:
    """A GGUF file written in two steps: header (KVs and every tensor info, via GGUFWriter), then
    tensor data in tensor-info order, each tensor padded to the alignment (ggml wants them dense)."""

    def __init__(self, target: str, arch: str, temps: list[str]):
        self.path, self.f = atomic.create_temp(target)
        temps.append(self.path)
        self.writer = GGUFWriter(None, arch)
        self.types: dict[str, TypeStats] = {}
        self._n = 0

    def add_tensor(self, name: str, ne: tuple[int, ...], type_name: str) -> None:
        nbytes = tensor_nbytes(type_name, ne)
        self.writer.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes,
                                    raw_dtype=GGMLQuantizationType[type_name])
        s = self.types.setdefault(type_name, TypeStats())
        s.count += 1
        s.nbytes += nbytes

    def begin_data(self) -> None:
        w = self.writer
        w.fout, w.state = [self.f], WriterState.EMPTY  # our own file, not one the writer opens
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        self._pad()
        self.f.flush()

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        self.f.write(mv)
        self._n += mv.nbytes

    def end_tensor(self, name: str, nbytes: int) -> None:
        if self._n != nbytes:  # an internal invariant: the tensor info promised nbytes
            raise RapidMoEError(f"internal error: tensor '{name}' wrote {self._n} bytes, expected {nbytes}")
        self._n = 0
        self._pad()

    def _pad(self) -> None:
        align = self.writer.data_alignment
        self.f.write(b"\0" * (-self.f.tell() % align))

    def finish(self) -> None:
        atomic.fsync_file(self.f)
        self.writer.close()

    def close(self) -> None:
        self.writer.close()  # idempotent
        self.f.close()


def _write(source: Source, rec: Recipe, out: str, res_out: str, temps: list[str], n_threads: int,
           show_bar: bool, imx: Imatrix | None = None) -> ConvertReport:
    """Writes the pair under temporary names, appended to ``temps`` (the base first)."""
    fallbacks: list[Fallback] = []
    plan = _plan(source, rec, fallbacks, imx)
    n_imx = sum(p.importance is not None for p in plan)
    if imx is not None and n_imx == 0:
        log.warning("the imatrix %s is not used: no expert base of recipe %s takes an importance", imx.path, rec.name)
    base_uuid = str(uuidlib.uuid4())
    stats = _ErrorStats()
    base = res = None
    try:
        base = _open_base(source, rec, plan, out, temps, base_uuid, imx)
        if any(p.residual_type for p in plan):
            res = _open_residual(source, rec, plan, res_out, temps, base.path, base_uuid)
        _stream(plan, base, res, stats, n_threads, os.path.basename(out) if show_bar else None)
        base.finish()
        if res is not None:
            _bind_to_base(res, base.path)
            res.finish()
            resplit.check_pair(base.path, res.path)
    finally:
        for o in (base, res):
            if o is not None:
                o.close()

    experts = [p for p in plan if p.src.role == "expert"]
    return ConvertReport(
        base_path=out, residual_path=res_out if res is not None else None, architecture=source.arch.name,
        recipe=rec.name, base_type=rec.base_type, residual_type=rec.residual_type,
        other_type=rec.other_type, base_types=base.types, residual_types=res.types if res else {},
        expert_weights=sum(math.prod(p.src.ne) for p in experts),
        expert_base_bytes=sum(p.nbytes for p in experts),
        expert_residual_bytes=sum(p.residual_nbytes for p in experts),
        error_base=stats.relative(stats.err_base), error_total=stats.relative(stats.err_total),
        fallbacks=fallbacks, seconds=0.0, imatrix_tensors=n_imx)


def _open_base(source: Source, rec: Recipe, plan: list[_Planned], out: str, temps: list[str],
               base_uuid: str, imx: Imatrix | None = None) -> _Out:
    base = _Out(out, source.arch.name, temps)
    w = base.writer
    source.add_metadata(w)
    w.add_file_type(int(FILE_TYPE[rec.base_type]))
    if any(is_quantized(p.out_type) for p in plan):
        w.add_quantization_version(GGML_QUANT_VERSION)
    w.add_uint32(resplit.KEY_FORMAT_VERSION, resplit.FORMAT_VERSION)
    w.add_string(resplit.KEY_RECIPE, rec.name)
    w.add_string(resplit.KEY_UUID, base_uuid)
    n_imx = sum(p.importance is not None for p in plan)
    if n_imx:   # llama-quantize's keys for the same fact
        w.add_string("quantize.imatrix.file", os.path.basename(imx.path))
        w.add_int32("quantize.imatrix.entries_count", n_imx)
    for p in plan:
        base.add_tensor(p.src.name, p.src.ne, p.out_type)
    base.begin_data()
    return base


def _open_residual(source: Source, rec: Recipe, plan: list[_Planned], res_out: str, temps: list[str],
                   base_path: str, base_uuid: str) -> _Out:
    """The sidecar's header; the base's header must already be on disk (its identity is hashed)."""
    res = _Out(res_out, source.arch.name, temps)
    _, ti_sha = resplit.base_identity(base_path)
    w = res.writer
    if any(is_quantized(p.residual_type) for p in plan if p.residual_type):
        w.add_quantization_version(GGML_QUANT_VERSION)
    w.add_uint32(resplit.KEY_FORMAT_VERSION, resplit.FORMAT_VERSION)
    w.add_string(resplit.KEY_RECIPE, rec.name)
    w.add_string(resplit.KEY_BASE_TYPE, rec.base_type)
    w.add_string(resplit.KEY_RESIDUAL_TYPE, rec.residual_type)
    w.add_string(resplit.KEY_BASE_UUID, base_uuid)
    w.add_string(resplit.KEY_BASE_TI_SHA256, ti_sha)
    names = [resplit.residual_tensor_name(p.src.name) for p in plan if p.residual_type]
    # room for the base data's fingerprints, filled in once the base is written (_bind_to_base)
    w.add_key_value(resplit.KEY_BASE_FINGERPRINTS, [0] * len(names), GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.UINT64)
    for p in plan:
        if p.residual_type:
            res.add_tensor(resplit.residual_tensor_name(p.src.name), p.src.ne, p.residual_type)
    res.begin_data()
    return res


def _bind_to_base(res: _Out, base_path: str) -> None:
    """Writes the finished base's expert fingerprints into the room the sidecar's header kept."""
    h = read_header(res.path, check_data=False)
    kv = h.kv[resplit.KEY_BASE_FINGERPRINTS]
    fps = resplit.base_fingerprints(base_path, [t.name for t in h.tensors])
    res.f.flush()
    os.pwrite(res.f.fileno(), np.asarray(fps, dtype="<u8").tobytes(), kv.offset)


def _stream(plan: list[_Planned], base: _Out, res: _Out | None, stats: _ErrorStats,
            n_threads: int, bar_title: str | None) -> None:
    """Read, quantize and write every tensor's data in tensor-info order."""
    from .. import quants

    bar = None
    if bar_title is not None:
        from tqdm import tqdm
        bar = tqdm(total=sum(math.prod(p.src.ne) for p in plan), unit="w", unit_scale=True,
                   desc=bar_title, dynamic_ncols=True)
    try:
        for p in plan:
            t = p.src
            if t.role == "expert":
                for e in range(t.ne[2]):
                    _write_expert(quants, p, e, base, res, stats, n_threads)
                    if bar is not None:
                        bar.update(t.ne[0] * t.ne[1])
            else:
                base.write(t.raw(None) if p.copy
                           else quants.quantize(p.out_type, t.read(None), n_threads=n_threads))
                if bar is not None:
                    bar.update(math.prod(t.ne))
            base.end_tensor(t.name, p.nbytes)
            if p.residual_type:
                res.end_tensor(resplit.residual_tensor_name(t.name), p.residual_nbytes)
    finally:
        if bar is not None:
            bar.close()


@dataclasses.dataclass
class _ErrorStats:
    w2: float = 0.0
    err_base: float = 0.0
    err_total: float = 0.0

    def relative(self, err2: float) -> float | None:
        return math.sqrt(err2 / self.w2) if self.w2 > 0 else None


def _sq(x: np.ndarray) -> float:
    v = x.reshape(-1)
    return float(np.dot(v, v))


def _write_expert(quants, p: _Planned, e: int, base: _Out, res: _Out | None,
                  stats: _ErrorStats, n_threads: int) -> None:
    """Expert e of one expert tensor: its base slab, and its residual slab when planned."""
    t = p.src
    if p.copy:
        base.write(t.raw(e))
        return
    w = t.read(e)  # (ne[1], ne[0])
    imp = p.importance[e] if p.importance is not None else None
    b = quants.quantize(p.out_type, w, n_threads=n_threads, importance=imp)
    base.write(b)
    r = w - quants.dequantize(p.out_type, b, w.shape)
    stats.w2 += _sq(w)
    stats.err_base += _sq(r)
    if p.residual_type is None:
        stats.err_total += _sq(r)
        return
    rb = quants.quantize(p.residual_type, r, n_threads=n_threads)
    res.write(rb)
    r -= quants.dequantize(p.residual_type, rb, w.shape)
    stats.err_total += _sq(r)


# ---------------------------------------------------------------------------------------------
# Output paths and the atomic commit
# ---------------------------------------------------------------------------------------------

def _check_out(out: str) -> None:
    if not out.endswith(".gguf") or out.endswith(resplit.RESIDUAL_FILE_SUFFIX):
        raise InvalidArgumentError(f"output {out} must be a NAME.gguf path (not NAME.residual.gguf); "
                                   "the residual goes to NAME.residual.gguf beside it")
    if os.path.isdir(out):
        raise InvalidArgumentError(f"cannot write {out}: it is a directory")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise InvalidArgumentError(f"cannot write {out}: {parent} is not an existing directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"cannot write {out}: directory {parent} is not writable")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def _check_not_source(src: str, out: str, res_out: str) -> None:
    """OUT and its sidecar may be neither the source nor the source's sidecar, also through links:
    the conversion would replace the only copy of what it reads."""
    if os.path.isdir(src):
        src_files = [os.path.join(src, n) for n in sorted(os.listdir(src))]
    else:
        src_files = [src, resplit.residual_path(src)]
    for o in (out, res_out):
        for s in src_files:
            if _same_file(o, s):
                raise InvalidArgumentError(f"cannot write {o}: it is the same file as the source {s}; "
                                           "choose another output path")


def _free_name(path: str) -> str:
    n, cand = 1, path
    while os.path.lexists(cand):
        n += 1
        cand = f"{path}-{n}"
    return cand


def _commit(tmp_base: str, out: str, tmp_res: str | None, res_out: str) -> str | None:
    """Renames the complete, checked pair into place: the sidecar, then the base; then fsyncs the
    folder. A sidecar already at ``res_out`` belongs to the old OUT: it is first renamed to
    ``NAME.residual.gguf.replaced-<time>`` (restored if the base cannot be renamed). When the new
    pair has a sidecar, the old one is then removed with the old base it served; otherwise it fits
    no base now and is kept under that name, with a warning. Returns the kept path, if any."""
    d = os.path.dirname(out)
    aside = None
    if os.path.lexists(res_out):
        aside = _free_name(f"{res_out}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        os.rename(res_out, aside)
    moved_res = False
    try:
        if tmp_res is not None:
            os.replace(tmp_res, res_out)
            moved_res = True
        os.replace(tmp_base, out)
    except BaseException:
        if moved_res:
            atomic.remove_quietly(res_out)
        if aside is not None:
            os.replace(aside, res_out)
        raise
    kept = None
    if aside is not None and tmp_res is not None:
        atomic.remove_quietly(aside)
    elif aside is not None:
        kept = aside
        log.warning("%s belonged to the %s this conversion replaced and fits no base now (the new "
                    "pair has no residual); kept as %s, delete it when it is not needed",
                    res_out, out, aside)
    atomic.fsync_dir(d)
    return kept


def _want_bar(progress: bool | None) -> bool:
    if progress is None:
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    return bool(progress)
