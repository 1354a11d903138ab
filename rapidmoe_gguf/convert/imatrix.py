"""Importance matrices: how much each input column of a matrix matters, from calibration text.

The importance of column c of a weight matrix is the mean of x_c^2 over the activations x that
met the matrix on calibration text; an error in weight (r, c) moves the output by x_c times that
error, so the quantizers that search a codebook (IQ2_XXS, IQ3_XXS) weigh their squared error by
it. For an expert tensor (ne = {n_in, n_out, n_expert}) each expert has its own row, averaged over
the tokens routed to that expert only.

We read llama.cpp's imatrix GGUF (what ``llama-imatrix -o FILE.gguf`` writes, and what
``llama-quantize --imatrix`` takes): ``general.type`` = "imatrix"; per matrix NAME two F32
tensors, ``NAME.in_sum2`` (ne = {n_in, n_matrices}: the sum of x^2 per column) and
``NAME.counts`` (ne = {1, n_matrices}: how many activations were summed), n_matrices being the
number of experts of an expert tensor and 1 otherwise.
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

    def importance(self, name: str, n_in: int, n_matrices: int) -> list[np.ndarray | None]:
        """One importance row (n_in float32 values) per matrix of tensor ``name``; None for a
        matrix no calibration activation reached (an expert never routed to)."""
        sums, counts = self._sums[name], self._counts[name]
        if sums.shape != (n_matrices, n_in):
            raise FormatError(f"{self.path}: '{name}{_SUM2}' has {sums.shape[0]} rows of {sums.shape[1]}; "
                              f"the tensor needs {n_matrices} of {n_in}: the imatrix was made for another model")
        return [sums[k] / counts[k] if counts[k] > 0 else None for k in range(n_matrices)]


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
