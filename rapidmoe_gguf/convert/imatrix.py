"""Importance matrices: how much each input column of a matrix matters, from calibration text.

The importance of column c of a weight matrix is the mean of x_c^2 over the activations x that
met the matrix on calibration text; an error in weight (r, c) moves the output by x_c times that
error, so the quantizers that search a codebook (IQ2_XXS, IQ3_XXS) weigh their squared error by
it. For an expert tensor (ne = {n_in, n_out, n_expert}) each expert has its own row, averaged over
the tokens routed to that expert only.

The file format is llama.cpp's imatrix GGUF (what ``llama-imatrix -o FILE.gguf`` writes, and what
``llama-quantize --imatrix`` takes): ``general.type`` = "imatrix"; per matrix NAME two F32
tensors, ``NAME.in_sum2`` (ne = {n_in, n_matrices}: the sum of x^2 per column) and
``NAME.counts`` (ne = {1, n_matrices}: how many activations were summed), n_matrices being the
number of experts of an expert tensor and 1 otherwise. ``read_imatrix`` reads one;
``compute_imatrix`` runs a model over calibration text and writes one for its expert tensors
(the runtime sums x^2 per expert, ``Model.set_importance``).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import FormatError, InvalidArgumentError

_SUM2, _COUNTS = ".in_sum2", ".counts"


class Imatrix:
    """The importance rows of an imatrix file, by tensor name."""

    def __init__(self, path: str, sums: dict[str, np.ndarray], counts: dict[str, np.ndarray]):
        self.path = path
        self._sums = sums        # name -> (n_matrices, n_in) float32
        self._counts = counts    # name -> (n_matrices,) float32

    def __contains__(self, name: str) -> bool:
        return name in self._sums

    @property
    def names(self) -> list[str]:
        return sorted(self._sums)

    def counts(self, name: str) -> np.ndarray:
        """How many activations each matrix of tensor ``name`` summed."""
        return self._counts[name].copy()

    def importance(self, name: str, n_in: int, n_matrices: int) -> list[np.ndarray | None]:
        """One importance row (n_in float32 values) per matrix of tensor ``name``; None for a
        matrix no calibration activation reached (an expert never routed to)."""
        sums, counts = self._sums[name], self._counts[name]
        if sums.shape != (n_matrices, n_in):
            raise FormatError(f"{self.path}: '{name}{_SUM2}' has {sums.shape[0]} rows of {sums.shape[1]}; "
                              f"the tensor needs {n_matrices} of {n_in}: the imatrix was made for another model")
        return [sums[k] / counts[k] if counts[k] > 0 else None for k in range(n_matrices)]


def compute_imatrix(model_path: str | os.PathLike[str], text: str, out: str | os.PathLike[str], *,
                    n_ctx: int = 512, max_tokens: int | None = None, n_threads: int = 0,
                    dataset: str = "") -> dict:
    """Runs the model at ``model_path`` (its experts as stored; a sidecar beside it is applied in
    full) over ``text`` in chunks of ``n_ctx`` tokens, each a fresh sequence, as llama-imatrix
    does, and writes the importance of every expert tensor's input columns to ``out``. Returns
    {"chunks", "tokens", "entries"}."""
    from gguf import GGUFWriter

    from .. import umia
    from ..model import Model

    if n_ctx < 2:
        raise InvalidArgumentError(f"compute_imatrix: n_ctx must be >= 2, got {n_ctx}")
    with Model(model_path, n_ctx=n_ctx, n_threads=n_threads) as m:
        ids = m.tokenize(text, add_special=False)
        if max_tokens is not None:
            ids = ids[:max_tokens]
        n_chunks = len(ids) // n_ctx
        if n_chunks == 0:
            raise InvalidArgumentError(f"compute_imatrix: the text has {len(ids)} tokens, fewer than one "
                                       f"chunk of {n_ctx}")
        bos = m.tokenize("", add_special=True)   # what the model puts first, if anything
        if m.residual_path is not None:
            m.set_residual("all")
        m.set_importance(True)
        try:
            for c in range(n_chunks):
                chunk = list(ids[c * n_ctx:(c + 1) * n_ctx])
                if bos:
                    chunk[0] = bos[0]
                m.eval_logits(chunk)
            s_in, s_ff, count = m.importance()
        finally:
            m.set_importance(False)
        arch, moe = m.info["arch"], umia.moe_layers(m.info)
    w = GGUFWriter(os.fspath(out), arch)
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", [dataset or "calibration text"])
    w.add_uint32("imatrix.chunk_count", n_chunks)
    w.add_uint32("imatrix.chunk_size", n_ctx)
    entries = 0
    for il in np.flatnonzero(moe):
        counts = count[il].astype(np.float32).reshape(-1, 1)
        for part, sums in (("gate", s_in), ("up", s_in), ("down", s_ff)):
            name = f"blk.{il}.ffn_{part}_exps.weight"
            w.add_tensor(name + _SUM2, sums[il].astype(np.float32))
            w.add_tensor(name + _COUNTS, counts)
            entries += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"chunks": n_chunks, "tokens": n_chunks * n_ctx, "entries": entries}


def read_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    """Reads a llama.cpp imatrix GGUF; a clear error for anything else (the legacy ``.dat``
    format included: ``llama-imatrix --in-file X.dat -o X.gguf`` converts it)."""
    from gguf import GGUFReader

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"imatrix {path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise FormatError(f"{path}: not a GGUF imatrix (the legacy .dat format? convert it with "
                          f"`llama-imatrix --in-file {os.path.basename(path)} -o NAME.gguf`)")
    try:
        r = GGUFReader(path)
    except (ValueError, OSError, IndexError) as exc:
        raise FormatError(f"{path}: cannot read it as GGUF: {exc}") from exc
    kind = r.fields.get("general.type")
    if kind is None or bytes(kind.parts[-1]).decode("utf-8", "replace") != "imatrix":
        raise FormatError(f"{path}: general.type is not 'imatrix'; not an importance matrix file")
    tensors = {t.name: t for t in r.tensors}
    sums, counts = {}, {}
    for tname, t in tensors.items():
        if not tname.endswith(_SUM2):
            continue
        name = tname[:-len(_SUM2)]
        c = tensors.get(name + _COUNTS)
        if c is None:
            raise FormatError(f"{path}: '{tname}' has no '{name}{_COUNTS}'")
        if t.tensor_type.name != "F32" or c.tensor_type.name != "F32":
            raise FormatError(f"{path}: '{name}': in_sum2 and counts must be F32")
        n_in = int(t.shape[0])
        s = np.asarray(t.data, dtype=np.float32).reshape(-1, n_in)
        n = np.asarray(c.data, dtype=np.float32).reshape(-1)
        if n.shape[0] != s.shape[0]:
            raise FormatError(f"{path}: '{name}': {s.shape[0]} in_sum2 rows but {n.shape[0]} counts")
        if not (np.isfinite(s).all() and (s >= 0).all() and np.isfinite(n).all() and (n >= 0).all()):
            raise FormatError(f"{path}: '{name}': negative or non-finite values")
        sums[name], counts[name] = s.copy(), n.copy()
    if not sums:
        raise FormatError(f"{path}: no '*{_SUM2}' tensors; not an importance matrix file")
    return Imatrix(path, sums, counts)
