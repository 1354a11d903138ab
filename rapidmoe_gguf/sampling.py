"""Token sampling: the parameters, and a Sampler that owns one native rm_sampler (its seeded RNG)."""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Mapping, Sequence

import numpy as np

from . import _native
from ._native import ffi, lib
from .errors import InvalidArgumentError

_FLOAT_MAX = float(np.finfo(np.float32).max)
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass
class SamplingParams:
    """How the next token is drawn. ``temperature`` 0 is greedy; ``repeat_penalty`` 1 is off (as
    llama.cpp now defaults). These defaults are the CLI's, the server's and the API's."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def validate(self) -> None:
        """Each value in its range, and representable in its C type (float, int32_t)."""
        checks = [
            (0 <= self.temperature <= _FLOAT_MAX, f"temperature must be >= 0 and finite, got {self.temperature}"),
            (0 <= self.top_k <= _INT32_MAX, f"top_k must be in [0, {_INT32_MAX}], got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (0 < self.repeat_penalty <= _FLOAT_MAX, f"repeat_penalty must be > 0 and finite, got {self.repeat_penalty}"),
            (0 <= self.repeat_last_n <= _INT32_MAX,
             f"repeat_last_n must be in [0, {_INT32_MAX}], got {self.repeat_last_n}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise InvalidArgumentError(msg)


SAMPLING_DEFAULTS: Mapping[str, object] = types.MappingProxyType(dataclasses.asdict(SamplingParams()))
"""SamplingParams' defaults, read-only: the one source of the defaults of the CLI's flags, the
server's request fields and the Model methods' keyword arguments."""


class Sampler:
    """Draws tokens from logits with SamplingParams; the same seed gives the same draws."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.params = params
        p = ffi.new("rm_sampler_params *")
        p.struct_size = ffi.sizeof("rm_sampler_params")
        p.temperature = params.temperature
        p.top_k = params.top_k
        p.top_p = params.top_p
        p.min_p = params.min_p
        p.repeat_penalty = params.repeat_penalty
        p.repeat_last_n = params.repeat_last_n
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        p.seed = seed & (2**64 - 1)
        out = ffi.new("rm_sampler **")
        _native.check(lib.rm_sampler_new(p, out))
        self._smp = ffi.gc(out[0], lib.rm_sampler_free)
        self._tok = ffi.new("int32_t *")

    def sample(self, logits: np.ndarray, recent: Sequence[int] = ()) -> int:
        """One token id from a float32 logits vector, given the recent token history."""
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        last = np.asarray(recent[-max(self.params.repeat_last_n, 1):], dtype=np.int32)
        _native.check(lib.rm_sampler_sample(self._smp, ffi.from_buffer("float[]", logits), int(logits.size),
                                            ffi.from_buffer("int32_t[]", last), int(last.size), self._tok))
        return int(self._tok[0])
