"""Token sampling: the parameters, and a Sampler that owns one native rm_sampler (its seeded RNG);
a request's ``logit_bias``; and the log-probabilities of the sampled tokens, in OpenAI's shapes."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import types
from typing import Any, Mapping, Sequence

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


MAX_TOP_LOGPROBS = 20     # top_logprobs / legacy logprobs: OpenAI's chat limit (llama-server takes more)
LOGIT_BIAS_LIMIT = 100.0  # |bias| at most this, as OpenAI
LOGPROB_FLOOR = -9999.0   # what OpenAI reports for a log-probability of -inf (JSON has no infinities)


def check_top_logprobs(n: Any, name: str = "top_logprobs") -> int:
    """n as the number of most likely tokens to report besides the sampled one: an int in
    [0, MAX_TOP_LOGPROBS]."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise InvalidArgumentError(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {n!r}")
    return n


def chat_top_logprobs(logprobs: Any, top_logprobs: Any) -> int | None:
    """OpenAI chat's ``logprobs`` (a boolean) and ``top_logprobs`` (0 to 20, with logprobs true)
    as the number of most likely tokens to report; None: no logprobs."""
    if logprobs is not None and not isinstance(logprobs, bool):
        raise InvalidArgumentError(f"logprobs must be true or false, got {logprobs!r}")
    if top_logprobs is not None:
        check_top_logprobs(top_logprobs)
        if top_logprobs and not logprobs:
            raise InvalidArgumentError("top_logprobs needs logprobs: true")
    return (top_logprobs or 0) if logprobs else None


class LogitBias:
    """A request's ``logit_bias``: token id -> a bias added to that token's logit before sampling.

    Built from OpenAI's map (keys: token ids as strings; ints too, from Python) by ``check``,
    which refuses keys that are not token ids inside the vocabulary and values that are not
    finite numbers in [-100, 100], naming ``logit_bias``."""

    def __init__(self, ids: np.ndarray, values: np.ndarray):
        self.ids = ids                                  # int64, distinct
        self.values = values                            # float64, the biases as given
        self._values32 = values.astype(np.float32)      # as the float32 logits take them

    @classmethod
    def check(cls, bias: Mapping | None, n_vocab: int) -> "LogitBias | None":
        """The checked bias, or None for none (None or an empty map: requests without one pay nothing)."""
        if bias is None:
            return None
        if not isinstance(bias, Mapping):
            raise InvalidArgumentError(f"logit_bias must be an object mapping token ids to numbers, "
                                       f"got {type(bias).__name__}")
        ids, values = {}, []
        for key, value in bias.items():
            if isinstance(key, str) and re.fullmatch(r"[0-9]{1,10}", key):
                token = int(key)
            elif isinstance(key, numbers.Integral) and not isinstance(key, bool):
                token = int(key)
            else:
                raise InvalidArgumentError(f"logit_bias: the key {str(key)[:40]!r} is not a token id")
            if not 0 <= token < n_vocab:
                raise InvalidArgumentError(f"logit_bias: token id {token} is outside the vocabulary [0, {n_vocab})")
            if token in ids:                    # "7" and 7 from Python
                raise InvalidArgumentError(f"logit_bias: token id {token} is given twice")
            # A comparison, not math.isfinite: that overflows on a JSON integer of 400 digits; NaN fails it.
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
                raise InvalidArgumentError(f"logit_bias: the bias of token {token} must be a number in "
                                           f"[-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}], got {str(value)[:40]}")
            ids[token] = len(values)
            values.append(float(value))
        if not ids:
            return None
        return cls(np.fromiter(ids, np.int64, len(ids)), np.asarray(values, np.float64))

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of logits with the biases added (the caller's array, which a batch's
        other rows may share, is left as it is)."""
        out = np.array(logits, dtype=np.float32)
        out[self.ids] += self._values32
        return out


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the ``n_top`` most likely tokens' (id, logprob),
    most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprob(logits: np.ndarray, token: int, n_top: int, bias: LogitBias | None = None) -> TokenLogprob:
    """The log-softmax of ``logits`` (plus ``bias``) at ``token`` and at the n_top largest.

    This is the model's own distribution, before repeat_penalty, temperature, top-k, top-p and
    min-p: what OpenAI and llama-server report (lm-evaluation-harness scores a continuation by
    it, so it must not depend on how the token was drawn), and the one distribution that a
    greedy request and a sampled one over the same prefix share. ``logit_bias`` is included,
    as OpenAI includes it: it is part of the request's model of the next token, and a bias that
    forces a token shows as that token's logprob near 0.

    In float64 from the float32 logits: one pass over the vocabulary for the log-sum-exp
    (shifted by the maximum, so nothing overflows), and a partial sort for the top n_top; the
    full vector of log-probabilities is never built."""
    x = logits.astype(np.float64)
    if bias is not None:
        x[bias.ids] += bias.values
    m = float(x.max())
    e = x - m
    np.exp(e, out=e)
    lse = m + math.log(float(e.sum()))
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        n_top = min(n_top, x.size)
        # The largest at the end: numpy selects these several times faster than the smallest of -x.
        cand = np.argpartition(x, x.size - n_top)[x.size - n_top:]
        cand = cand[np.lexsort((cand, -x[cand]))]          # most likely first; ties: the lower id
        top = tuple((int(i), float(x[i]) - lse) for i in cand)
    return TokenLogprob(int(token), float(x[token]) - lse, top)


def _finite(logprob: float) -> float:
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR       # -inf and NaN too


def _piece(tokenizer, token: int) -> tuple[str, bytes]:
    """A token's text (bytes that are part of a character: U+FFFD) and its bytes."""
    raw = tokenizer.token_to_piece(token)
    return raw.decode("utf-8", "replace"), raw


def chat_logprobs(tokenizer, items: Sequence[tuple[TokenLogprob, int]]) -> dict:
    """The chat completions' ``logprobs`` of some generated tokens (``items``: (TokenLogprob,
    text offset); the offset is not part of this shape): {"content": [{"token", "logprob",
    "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}."""
    def entry(token: int, logprob: float) -> dict:
        text, raw = _piece(tokenizer, token)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(raw)}

    return {"content": [dict(entry(lp.token, lp.logprob), top_logprobs=[entry(t, v) for t, v in lp.top])
                        for lp, _ in items]}


def completion_logprobs(tokenizer, items: Sequence[tuple[TokenLogprob, int]], text_offset: int = 0) -> dict:
    """The legacy completions' ``logprobs`` of some generated tokens (``items``: (TokenLogprob,
    the token's character offset in the completion's text)): {"tokens", "token_logprobs",
    "top_logprobs": [{token: logprob}], "text_offset"}, each offset plus ``text_offset`` (the
    prompt's length: OpenAI's offsets count from the prompt's start). As OpenAI and
    llama-cpp-python, a top_logprobs map holds the sampled token too (up to N + 1 entries)."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp, offset in items:
        out["tokens"].append(_piece(tokenizer, lp.token)[0])
        out["token_logprobs"].append(_finite(lp.logprob))
        top = {_piece(tokenizer, t)[0]: _finite(v) for t, v in lp.top}
        top.setdefault(out["tokens"][-1], _finite(lp.logprob))
        out["top_logprobs"].append(top)
        out["text_offset"].append(text_offset + offset)
    return out


def logprobs_shape(kind: str, tokenizer, text_offset: int = 0):
    """items -> the ``logprobs`` of a choice of ``kind`` ("chat" or "completion")."""
    if kind == "chat":
        return lambda items: chat_logprobs(tokenizer, items)
    return lambda items: completion_logprobs(tokenizer, items, text_offset)


def merge_logprobs(kind: str, parts: Sequence[dict | None]) -> dict:
    """The ``logprobs`` of a whole choice from its chunks' (None: a chunk without tokens)."""
    keys = ("content",) if kind == "chat" else ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    out: dict = {k: [] for k in keys}
    for part in parts:
        for k in keys if part else ():
            out[k] += part[k]
    return out


class Sampler:
    """Draws tokens from logits with SamplingParams, and ``logit_bias`` added to the logits; the
    same seed gives the same draws. ``constraint`` (grammar.Constraint): only the tokens its
    grammar allows are drawn, and each drawn token is given to it. ``logprob``: a drawn token's
    log-probability."""

    def __init__(self, params: SamplingParams, logit_bias: LogitBias | None = None, constraint=None):
        params.validate()
        self.params = params
        self.bias = logit_bias
        self.constraint = constraint
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
        logits = self.bias.apply(logits) if self.bias is not None else np.ascontiguousarray(logits, dtype=np.float32)
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        last = np.asarray(recent[-max(self.params.repeat_last_n, 1):], dtype=np.int32)
        _native.check(lib.rm_sampler_sample(self._smp, ffi.from_buffer("float[]", logits), int(logits.size),
                                            ffi.from_buffer("int32_t[]", last), int(last.size), self._tok))
        token = int(self._tok[0])
        if self.constraint is not None:
            self.constraint.accept(token)
        return token

    def logprob(self, logits: np.ndarray, token: int, n_top: int) -> TokenLogprob:
        """``token``'s log-probability and the n_top most likely tokens' under the logits as
        ``sample`` was given them (see token_logprob: the bias included, nothing else)."""
        return token_logprob(logits, token, n_top, self.bias)
