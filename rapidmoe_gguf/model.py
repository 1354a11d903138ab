"""The Python API: a Model owns one native model and one session (KV cache), and generates text.

Shapes and dict layouts follow llama-cpp-python where it has one (``eval``, ``create_completion``),
so code written for it reads the same here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import mmap
import os
import struct
import time
import types
import uuid
import weakref
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import _native
from ._native import ffi, lib
from . import planner, quants, umia
from . import atomic
from .errors import FormatError, InvalidArgumentError, NoResidualError, RapidMoEError, StateError
from .gguf_file import open_gguf
from .resplit import check_pair, residual_path
from .sampling import (SAMPLING_DEFAULTS as _SD, LogitBias, Sampler, SamplingParams, TokenLogprob,
                       check_top_logprobs, logprobs_shape)
from .tokenizer import IncrementalDecoder, Tokenizer

log = logging.getLogger("rapidmoe")

# gpu_backend: rm_model_params.use_gpu (rapidmoe.h)
GPU_BACKENDS = {"cuda": 1, "standin": 2}

AUTO_BUDGET = umia.AUTO_BUDGET


def load_mode(use_mmap: bool | None) -> int:
    """rm_model_params.load for Model's ``use_mmap`` (``None``: $RAPIDMOE_MMAP, else automatic)."""
    if use_mmap is None:
        env = os.environ.get("RAPIDMOE_MMAP", "")
        if env not in ("", "0", "1"):
            raise InvalidArgumentError(f"RAPIDMOE_MMAP must be 0 or 1, got {env!r}")
        use_mmap = None if env == "" else env == "1"
    if use_mmap is None:
        return lib.RM_LOAD_AUTO
    return lib.RM_LOAD_MMAP if use_mmap else lib.RM_LOAD_READ


# Model's prefetch: rm_model_params.prefetch
PREFETCH = {"none": 0, "known": 1, "predict": 2}


def ram_budget_bytes(ram_budget: str | int | None) -> int:
    """Model's ``ram_budget`` in bytes (``None``: $RAPIDMOE_RAM_BUDGET, else 0: no stream asked);
    ``"auto"`` streams with the library's default budget (a sentinel of -1)."""
    if ram_budget is None:
        ram_budget = os.environ.get("RAPIDMOE_RAM_BUDGET") or None
    if ram_budget is None:
        return 0
    if ram_budget == "auto":
        return -1
    try:
        n = planner.parse_bytes(ram_budget)
    except (ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"ram_budget: {exc}") from None
    if n <= 0:
        raise InvalidArgumentError(f"ram_budget must be > 0 bytes, got {ram_budget!r}")
    return n


# A hybrid model also checkpoints this many tokens before a prompt's end (Model._prompt_marks).
CHECKPOINT_TAIL = 4

# llama.cpp's KV cache types (its --cache-type-k / -v values)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


def cache_type(name: Any, what: str = "cache_type_k") -> str | None:
    """A KV cache type's name, lower case, checked against CACHE_TYPES (None: the default)."""
    if name is None:
        return None
    if not isinstance(name, str) or name.lower() not in CACHE_TYPES:
        raise InvalidArgumentError(f"{what} must be one of {', '.join(CACHE_TYPES)}, got {str(name)[:40]!r}")
    return name.lower()


# Architectures whose attention reads an F32 cache only.
F32_CACHE_ARCHS = ("deepseek4",)


def default_cache_type(info: dict, on_gpu: bool, what: str = "k") -> str:
    """The KV cache type a model gets when none is asked for: $RAPIDMOE_CACHE_TYPE_K /
    $RAPIDMOE_CACHE_TYPE_V where set (as llama-server's LLAMA_ARG_CACHE_TYPE_K / _V), else
    ``f16``, llama.cpp's default, where the model can have it, and ``f32`` where attention reads no
    other type: a session on a device backend, DeepSeek-V4's window."""
    env = f"RAPIDMOE_CACHE_TYPE_{what.upper()}"
    if os.environ.get(env):
        return cache_type(os.environ[env], f"${env}")
    if on_gpu or info.get("arch") in F32_CACHE_ARCHS:
        return "f32"
    return "f16"


class Model:
    """A loaded model with one session.

    ``residual``: ``"auto"`` (default) loads ``NAME.residual.gguf`` beside the base file when it
    exists, ``None`` runs base only, or give the sidecar's path. ``residual_policy`` and
    ``residual_budget`` choose which activated experts get their residual (see ``set_residual``);
    an uncalibrated sidecar falls back from ``umia`` to ``all``. ``residual_budget="auto"`` lets
    the CPU/GPU split find the budget the host can hide under the GPU's work (docs/SPLIT.md).

    ``gpu_memory`` (e.g. ``"8GiB"``) runs on the GPU ``gpu_device`` within that budget: the
    planner (rapidmoe_gguf.planner) puts the dense part, the KV cache and as many expert bases as
    fit on the GPU, and host threads compute the residuals. Without a usable GPU (none present,
    or a build without CUDA) the model runs on the CPU, with a logged warning; ``gpu_info`` says
    where it runs and why. ``gpu_sessions``: how many sessions (this one and its forks) the GPU
    budget must hold. ``gpu_backend="standin"`` runs the same placement and split on a CPU
    stand-in for the GPU (its own buffers and budget, every copy counted): it checks the split on
    machines without a GPU and is never faster than the CPU alone.

    ``use_mmap``: ``True`` maps the files (pages read on first use; the kernel may drop them again
    under memory pressure, so a model larger than the memory still runs); ``False`` reads them
    whole into memory in 2 MiB pages where the kernel has transparent huge pages, which decodes
    faster (one TLB miss per 2 MiB of weights streamed, not per 4 KiB); ``None`` (default) reads
    when the files fit in three quarters of the available memory (a container's memory limit
    counted: the cgroup's, where it is less than the host's) and huge pages can be had, and
    maps otherwise. The environment variable ``RAPIDMOE_MMAP`` (``1``/``0``) sets it where the
    argument is ``None`` (e.g. for the command line).

    ``ram_budget`` (e.g. ``"12GiB"``, or ``"auto"``) runs a model larger than the memory: the
    weights other than the routed experts stay in memory, and each expert's matrices are read
    from the file when a token is routed to it, into a cache that fills the rest of the budget
    (least often used out first), one read at a time. ``prefetch``: ``"known"`` (default) reads
    a batch's experts beyond what the cache holds at once while the CPU computes those before them;
    ``"predict"`` also guesses the next layer's experts from its router and reads them ahead (more
    disk reads: a wrong guess costs one); ``"none"`` reads each when it is needed. CPU only. ``"auto"`` takes three quarters of the memory
    the process may take (a cgroup's limit counted); with ``None`` (default) $RAPIDMOE_RAM_BUDGET
    sets it, else a CPU model whose files do not fit in the memory the process may take streams
    with that budget, and any other loads as ``use_mmap`` says. ``expert_cache`` counts hits, reads and bytes.

    ``cache_type_k`` / ``cache_type_v``: the KV cache's element types, llama.cpp's names: ``f32``,
    ``f16``, ``bf16``, ``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``iq4_nl``. ``f16`` halves F32's cache
    (and the bytes decode reads at depth) and ``q8_0`` takes 0.27 of it, at a small cost in the
    logits (docs/QUALITY.md); a block type needs head_dim a multiple of 32. Types other than
    ``f32`` run on the CPU backend (not with a GPU budget: NeedsCPUError). Multi-head latent
    attention (DeepSeek, GLM-Flash) caches one latent row per position, in ``cache_type_k`` (as
    llama.cpp; ``cache_type_v`` names nothing cached there). None (the default): ``f16`` as
    llama.cpp's, where the model can have it, else ``f32`` (``default_cache_type``; the
    environment's $RAPIDMOE_CACHE_TYPE_K / _V first). The attributes ``cache_type_k`` /
    ``cache_type_v`` say the types in use. Forks take this session's types.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int = 2048,
        n_threads: int = 0,
        n_batch: int = 512,
        residual: str | os.PathLike | None = "auto",
        residual_policy: str = "umia",
        residual_budget: float | str = umia.DEFAULT_BUDGET,
        gpu_memory: str | int | None = None,
        gpu_device: int = 0,
        gpu_sessions: int = 1,
        gpu_backend: str = "cuda",
        hardware: planner.Hardware | None = None,
        use_mmap: bool | None = None,
        cache_type_k: str | None = None,
        cache_type_v: str | None = None,
        ram_budget: str | int | None = None,
        prefetch: str = "known",
    ):
        self._model = None
        self._session = None
        self._parent: Model | None = None      # set on a fork, which borrows the parent's native model
        self._forks: weakref.WeakSet = weakref.WeakSet()
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise RapidMoEError(f"model file not found: {path}")
        if n_ctx <= 0:
            raise InvalidArgumentError(f"n_ctx must be > 0, got {n_ctx}")
        cache_type_k, cache_type_v = cache_type(cache_type_k, "cache_type_k"), cache_type(cache_type_v, "cache_type_v")
        if gpu_backend not in GPU_BACKENDS:
            raise InvalidArgumentError(f"gpu_backend must be one of {', '.join(GPU_BACKENDS)}, got {gpu_backend!r}")
        if gpu_backend == "standin":
            # no CUDA context on the stand-in: the whole budget is the library's
            hardware = dataclasses.replace(hardware or planner.Hardware(), context_reserve=0)
        residual_budget = umia.check_budget(residual_budget)
        auto = residual_budget == "auto"
        self.path = path
        self.gpu_backend = gpu_backend
        if residual == "auto":
            cand = residual_path(path)
            residual = cand if os.path.isfile(cand) else None
        self.residual_path = os.fspath(residual) if residual is not None else None
        # Each file's header is parsed once here, and the pair check, the UMIA tables, the
        # metadata and the plan all read that parse; the C loader then opens each file once more
        # for itself (rm_model_load), as it must to map the weights.
        self.umia_tables = None
        self.plan = None
        with contextlib.ExitStack() as files:
            base = files.enter_context(open_gguf(path))
            res = files.enter_context(open_gguf(self.residual_path)) if self.residual_path is not None else None
            if res is not None:
                check_pair(base, res)
                self.umia_tables = umia.Tables.from_metadata(res.metadata)
            self.metadata = dict(base.metadata)
            if gpu_memory is not None:
                self.plan = planner.plan(planner.ModelSizes.from_gguf(base, res), gpu_memory, n_ctx, n_batch=n_batch,
                                         residual_budget=AUTO_BUDGET["start"] if auto else residual_budget,
                                         hardware=hardware, n_sessions=gpu_sessions)
        if self.plan is not None:
            log.info("GPU plan:\n%s", self.plan.summary())
        params = ffi.new("rm_model_params *")
        params.struct_size = ffi.sizeof("rm_model_params")
        params.n_threads = n_threads
        res_c = ffi.new("char[]", self.residual_path.encode()) if self.residual_path else ffi.NULL
        params.residual_path = res_c
        params.load = load_mode(use_mmap)
        budget = ram_budget_bytes(ram_budget)
        if budget:
            if use_mmap is not None:
                raise InvalidArgumentError("ram_budget streams the experts from the file: give it or use_mmap, not both")
            if gpu_memory is not None:
                raise InvalidArgumentError("ram_budget streams the experts to the CPU: give it or gpu_memory, not both")
            params.load = lib.RM_LOAD_STREAM
            params.ram_budget_bytes = max(budget, 0)
        if prefetch not in PREFETCH:
            raise InvalidArgumentError(f"prefetch must be one of {', '.join(PREFETCH)}, got {prefetch!r}")
        params.prefetch = PREFETCH[prefetch]
        mask = None
        if self.plan is not None:
            mask = self.plan.native_mask()
            params.use_gpu = GPU_BACKENDS[gpu_backend]
            params.gpu_device = gpu_device
            params.gpu_memory_bytes = self.plan.cap
            params.expert_on_gpu = ffi.from_buffer("uint8_t[]", mask)
            params.residual_upload_min_tokens = self.plan.crossover_tokens
        out = ffi.new("rm_model **")
        _native.check(lib.rm_model_load(path.encode(), params, out))
        del mask
        self._model = out[0]
        try:
            self.tokenizer = Tokenizer.from_gguf_metadata(self.metadata)
        except BaseException:
            self.close()
            raise
        info = ffi.new("rm_model_info *")
        _native.check(lib.rm_model_info_get(self._model, info))
        self.info = {k: (ffi.string(getattr(info, k)).decode() if k == "arch" else int(getattr(info, k)))
                     for k in dir(info)}
        self.n_vocab = self.info["n_vocab"]
        note = self.gpu_info["note"]
        if note:
            log.warning("%s", note)

        try:
            on_gpu = self.gpu_info["active"]
            self.cache_type_k = cache_type_k or default_cache_type(self.info, on_gpu, "k")
            self.cache_type_v = cache_type_v or default_cache_type(self.info, on_gpu, "v")
            self._open_session(n_ctx, n_batch, residual_policy, residual_budget)
        except BaseException:
            self.close()
            raise

    def _open_session(self, n_ctx: int, n_batch: int, residual_policy: str, residual_budget: float | str) -> None:
        sp = ffi.new("rm_session_params *")
        sp.struct_size = ffi.sizeof("rm_session_params")
        sp.n_ctx = n_ctx
        sp.n_batch = n_batch
        sp.type_k = quants.TYPES[self.cache_type_k.upper()].id
        sp.type_v = quants.TYPES[self.cache_type_v.upper()].id
        sout = ffi.new("rm_session **")
        _native.check(lib.rm_session_new(self._model, sp, sout))
        self._session = sout[0]
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.residual_policy, self.residual_budget = "none", 0.0
        if self.residual_path is not None:
            if residual_policy == "umia" and self.umia_tables is None:
                residual_policy = "all"
            self.residual_policy = None   # nothing applied yet: set_residual must apply even ("none", 0.0)
            self.set_residual(residual_policy, residual_budget)
        self._logits = np.zeros(self.n_vocab, dtype=np.float32)
        self._cached: list[int] = []        # the tokens whose keys and values the cache holds, in order
        self.reuse_prefix = True            # generation keeps the cache's common prefix with a new prompt
        self._batch_forks: list[Model] = []  # generate_many's sessions beside this one
        self.cancel = None                  # an object with is_set() (threading.Event): generation stops when set
        self.last_timings: dict[str, float] = {}
        self.finish_reason = "stop"

    @property
    def kv_cache_bytes(self) -> int:
        """The bytes this session's KV cache takes (its n_ctx positions, in cache_type_k / _v)."""
        return planner.kv_cache_bytes(types.SimpleNamespace(**self.info), self.n_ctx, self.cache_type_k,
                                      self.cache_type_v)

    def fork_session(self, n_ctx: int | None = None) -> "Model":
        """Another Model on the same loaded weights with a session of its own: KV cache, residual
        policy and statistics (default: this one's n_ctx and policy). Forks let several sequences
        be served at once from one copy of the weights: separate evaluations take turns on the
        native model, and ``eval_batch`` evaluates several in one. Closing this Model closes its
        forks first."""
        self._live()
        if n_ctx is not None and n_ctx <= 0:
            raise InvalidArgumentError(f"n_ctx must be > 0, got {n_ctx}")
        fork = copy.copy(self)              # shares the tokenizer, metadata and the native model
        fork._parent, fork._forks, fork._session, fork._batch_forks = self, weakref.WeakSet(), None, []
        fork.cancel = None                  # this one's cancel flag is not the fork's
        fork._open_session(self.n_ctx if n_ctx is None else n_ctx, self.n_batch,
                           self.residual_policy, self.residual_budget)
        self._forks.add(fork)
        return fork

    @property
    def backend(self) -> str:
        """Where the forward pass runs: ``"cuda"``, ``"standin"`` or ``"cpu"``."""
        return self.gpu_backend if self.gpu_info["active"] else "cpu"

    @property
    def gpu_info(self) -> dict:
        """Where the model runs (rm_gpu_info): the device, its budget, the bytes it holds now
        (weights and every live session's buffers), the experts on it, and ``note``: why the CPU
        runs although a GPU was asked for."""
        gi = ffi.new("rm_gpu_info *")
        gi.struct_size = ffi.sizeof("rm_gpu_info")
        _native.check(lib.rm_model_gpu_info(self._model, gi))
        return {"requested": bool(gi.requested), "active": bool(gi.active), "device": int(gi.device),
                "device_name": ffi.string(gi.device_name).decode("utf-8", "replace"),
                "budget_bytes": int(gi.budget_bytes), "weight_bytes": int(gi.weight_bytes),
                "used_bytes": int(gi.used_bytes), "n_experts_on_gpu": int(gi.n_experts_on_gpu),
                "n_experts_total": int(gi.n_experts_total),
                "note": ffi.string(gi.note).decode("utf-8", "replace")}

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the session and the model (forks and the session first); safe to call twice.
        A fork frees only its own session."""
        for fork in list(getattr(self, "_forks", ())):
            fork.close()
        if getattr(self, "_session", None) is not None:
            lib.rm_session_free(self._session)
            self._session = None
        if getattr(self, "_model", None) is not None:
            if self._parent is None:
                lib.rm_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _live(self):
        if self._session is None:
            raise RapidMoEError("the model is closed")
        return self._session

    # -- tokens ---------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # -- evaluation -----------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        return int(lib.rm_session_n_past(self._live()))

    def reset(self) -> None:
        """Empties the KV cache."""
        _native.check(lib.rm_session_reset(self._live()))
        self._cached = []

    def truncate(self, n_keep: int) -> None:
        """Keeps the first n_keep positions of the cache (rm_session_truncate). StateError where the
        cache cannot go back that far: the recurrent layers of the hybrid architectures, or a
        sliding-window layer asked to go back more than n_batch positions."""
        _native.check(lib.rm_session_truncate(self._live(), int(n_keep)))
        self._cached = self._cached[:int(n_keep)]

    def _reusable(self, prompt: Sequence[int]) -> int:
        """How many leading positions of the cache a prompt can keep: its common prefix with the
        cached tokens, less one, so that at least one token is evaluated and gives logits, as far
        as the cache can go back to (rm_session_reusable: a hybrid model, its latest checkpoint
        inside that prefix)."""
        if not self.reuse_prefix or len(self._cached) != self.n_past:
            return 0
        n = 0
        for a, b in zip(self._cached, prompt[:-1]):
            if a != b:
                break
            n += 1
        return int(lib.rm_session_reusable(self._live(), n)) if n > 0 else 0

    def _keep_prefix(self, prompt: Sequence[int]) -> int:
        """Truncates the cache to the longest part of it that prompt repeats and that it can go back
        to (a hybrid model: the latest checkpoint inside it; see truncate), or empties it, and
        returns how many tokens were kept."""
        keep = self._reusable(prompt)
        if keep > 0:
            try:
                self.truncate(keep)
                return keep
            except StateError:
                pass
        self.reset()
        return 0

    def _prompt_marks(self, start: int, end: int) -> list[int]:
        """Where, reading prompt positions [start, end), a hybrid model stops to checkpoint
        (besides the prompt's end): every multiple of n_batch (a later prompt that keeps only a
        part of this one, an edited or trimmed history, goes back to within a step of where it
        differs), and CHECKPOINT_TAIL tokens before the end (a chat template that renders the last
        turn's end otherwise the next time, as Qwen3.5's drops a reply's <think> block, differs a
        few tokens before this prompt's end). None for the other models, whose caches go back to
        any position."""
        if not self.info.get("n_layer_linear"):
            return []
        marks = set(range((start // self.n_batch + 1) * self.n_batch, end, self.n_batch))
        if end - CHECKPOINT_TAIL > start:
            marks.add(end - CHECKPOINT_TAIL)
        return sorted(marks)

    def _checkpoint(self) -> None:
        """Marks the cache's end as a place a later prompt may go back to: a hybrid model keeps a
        copy of its recurrent states there (rm_session_checkpoint: a few such places, spread over
        the context), so that the next turn of a chat, which repeats this prompt, evaluates only
        what follows it. Without the memory for the copy, the next prompt evaluates from the start
        (logged)."""
        try:
            _native.check(lib.rm_session_checkpoint(self._live()))
        except MemoryError as exc:
            log.warning("no checkpoint of the recurrent states: %s", exc)

    # -- state files ----------------------------------------------------------------------------
    #
    # A state file: STATE_MAGIC, the JSON header's length (8 bytes, little-endian), the header (the
    # model's fingerprint, the cache types, the positions and their tokens, the native state's
    # bytes), the native state (rm_session_state_save), then the last position's logits (n_vocab
    # float32), so that a loaded sequence continues as the saved one would have.

    STATE_MAGIC = b"RMSTATE1"

    def _fingerprint(self) -> str:
        """What a state file names this model by: a hash of the file's size and its first 16 MiB
        (the metadata and the first tensors' data: two fine-tunes of one architecture differ)."""
        fp = getattr(self, "_fp", None)
        if fp is None:
            h = hashlib.sha256(str(os.path.getsize(self.path)).encode())
            with open(self.path, "rb") as f:
                h.update(f.read(16 << 20))
            fp = self._fp = h.hexdigest()
        return fp

    def save_state(self, path: str | os.PathLike[str]) -> int:
        """Writes the sequence in the cache to a file: its tokens, the KV cache's rows (in the cache's
        types), a hybrid model's recurrent states and the last logits, so that ``load_state`` on
        this model (this process or a later one) continues it without evaluating it again. The
        file is written beside its name and renamed over it, so a failure leaves no half-written
        state. Returns the bytes written."""
        sess = self._live()
        path = os.fspath(path)
        size = ffi.new("uint64_t *")
        _native.check(lib.rm_session_state_size(sess, size))
        blob = bytearray(int(size[0]))
        _native.check(lib.rm_session_state_save(sess, ffi.from_buffer(blob), len(blob)))
        n_past = self.n_past
        head = json.dumps({"model": self._fingerprint(), "arch": self.info["arch"], "n_vocab": self.n_vocab,
                           "cache_type_k": self.cache_type_k, "cache_type_v": self.cache_type_v, "n_past": n_past,
                           "tokens": self._cached if len(self._cached) == n_past else None,
                           "state_bytes": len(blob)}).encode()
        total = len(self.STATE_MAGIC) + 8 + len(head) + len(blob) + self._logits.nbytes
        folder = os.path.dirname(os.path.abspath(path))
        atomic.sweep_leftovers(folder)
        tmp, f = atomic.create_temp(path)
        try:
            with f:
                for part in (self.STATE_MAGIC, struct.pack("<Q", len(head)), head, blob, self._logits.tobytes()):
                    f.write(part)
                atomic.fsync_file(f)
            os.replace(tmp, path)
        except OSError as exc:
            atomic.remove_quietly(tmp)
            raise atomic.write_error(path, exc, total) from exc
        except BaseException:
            atomic.remove_quietly(tmp)
            raise
        atomic.fsync_dir(folder)
        return total

    def load_state(self, path: str | os.PathLike[str]) -> int:
        """Takes back a sequence ``save_state`` wrote, in place of what the cache holds; returns its
        positions. Refused with StateError when the file is another model's, or of other cache
        types, or does not fit this session (its n_ctx; with a sliding-window layer that wrapped,
        its n_batch too), and with FormatError when it is not a state file or is damaged; the cache
        is then unchanged."""
        sess = self._live()
        path = os.fspath(path)
        with open(path, "rb") as f:
            try:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:   # an empty file
                data = b""
        try:
            m = len(self.STATE_MAGIC)
            if data[:m] != self.STATE_MAGIC or len(data) < m + 8:
                raise FormatError(f"{path}: not a rapidmoe state file")
            (n_head,) = struct.unpack_from("<Q", data, m)
            try:
                head = json.loads(bytes(data[m + 8:m + 8 + n_head]))
                n_state, n_past, tokens = int(head["state_bytes"]), int(head["n_past"]), head["tokens"]
            except (ValueError, KeyError, TypeError) as exc:
                raise FormatError(f"{path}: a damaged state file header ({exc})") from None
            if head.get("model") != self._fingerprint():
                raise StateError(f"{path}: the state of another model (a {head.get('arch')} model with "
                                 f"{head.get('n_vocab')} tokens), not of {self.path}")
            if (head.get("cache_type_k"), head.get("cache_type_v")) != (self.cache_type_k, self.cache_type_v):
                raise StateError(f"{path}: a state of cache types {head.get('cache_type_k')}/"
                                 f"{head.get('cache_type_v')}; this session's are {self.cache_type_k}/"
                                 f"{self.cache_type_v}")
            if tokens is not None and not (isinstance(tokens, list) and len(tokens) == n_past
                                           and all(type(t) is int and 0 <= t < self.n_vocab for t in tokens)):
                raise FormatError(f"{path}: a damaged state file header (its tokens are not {n_past} token ids "
                                  "of this vocabulary)")
            at = m + 8 + n_head
            if n_state < 0 or len(data) != at + n_state + self._logits.nbytes:
                raise FormatError(f"{path}: {len(data)} bytes, not what its header describes (a damaged or "
                                  "truncated state file)")
            view = memoryview(data)
            try:
                _native.check(lib.rm_session_state_load(sess, ffi.from_buffer(view[at:at + n_state]), n_state))
                logits = np.frombuffer(view[at + n_state:], dtype=np.float32).copy()
            finally:
                view.release()
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
        self._cached = [int(t) for t in tokens] if tokens is not None else []
        self._logits[:] = logits
        return n_past

    def _as_tokens(self, ids: Sequence[int]) -> np.ndarray:
        arr = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
        if arr.ndim != 1:
            raise InvalidArgumentError("token ids must be a flat sequence of integers")
        if arr.size and (arr.min() < 0 or arr.max() >= self.n_vocab):
            bad = int(arr[(arr < 0) | (arr >= self.n_vocab)][0])
            raise InvalidArgumentError(f"token id {bad} is outside the vocabulary [0, {self.n_vocab})")
        return arr.astype(np.int32)

    def eval(self, ids: Sequence[int]) -> np.ndarray:
        """Feeds tokens after those already in the cache; returns the last position's logits."""
        toks = self._as_tokens(ids)
        if toks.size == 0:
            raise InvalidArgumentError("eval needs at least one token")
        try:
            _native.check(lib.rm_session_eval(
                self._live(), ffi.from_buffer("int32_t[]", toks), int(toks.size), 0,
                ffi.from_buffer("float[]", self._logits), self._logits.size))
        finally:
            self._cached = (self._cached + toks.tolist())[:self.n_past]
        return self._logits.copy()

    def eval_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits of every position, shape (len(ids), n_vocab), for a fresh sequence."""
        toks = self._as_tokens(ids)
        if toks.size == 0:
            raise InvalidArgumentError("eval_logits needs at least one token")
        out = np.empty((toks.size, self.n_vocab), dtype=np.float32)
        self.reset()
        try:
            _native.check(lib.rm_session_eval(
                self._live(), ffi.from_buffer("int32_t[]", toks), int(toks.size), 1,
                ffi.from_buffer("float[]", out), out.size))
        finally:
            self._cached = toks.tolist()[:self.n_past]
        return out

    # -- residuals and statistics ---------------------------------------------------------------

    def set_residual(self, policy: str, budget: float | str | None = None) -> None:
        """Chooses which activated experts get their residual, from the next token on.

        policy: none, all, umia, random, gate, expert or layer; budget: the fraction of activated
        (token, expert) slots that get the residual (ignored by none and all), or ``"auto"``: the
        split raises it while the host's residual work hides under the GPU's and lowers it when
        the GPU waits; with the experts streamed from the disk (``ram_budget``) it lowers it while
        the residuals' reads take longer than the rest of a layer's work and raises it while they
        fit (a CPU-only session holding every weight keeps the starting value, AUTO_BUDGET["start"])."""
        umia.check_policy(policy)
        budget = umia.check_budget(self.residual_budget if budget is None else budget)
        auto = budget == "auto"
        if auto and policy in ("none", "all"):
            raise InvalidArgumentError(f"residual_budget='auto' needs a budgeted policy, not {policy!r}")
        start = AUTO_BUDGET["start"] if auto else budget
        if policy != "none" and self.residual_path is None:
            raise NoResidualError(f"policy {policy!r} needs a residual sidecar, and this model was loaded without one")
        same = (policy, budget) == (getattr(self, "residual_policy", None), getattr(self, "residual_budget", None))
        if same and not auto:
            return   # as it is: the controllers' states along the cache stay, and its prefix is reused as is
        if not same:
            self._cached = []   # the cache holds other residuals' results: no prefix of it is reused
        self._apply_policy(umia.build(policy, start, self.umia_tables, self.info["n_layer"], self.info["n_expert"],
                                      umia.moe_layers(self.info)))
        if auto:
            ab = ffi.new("rm_auto_budget *")
            ab.struct_size = ffi.sizeof("rm_auto_budget")
            ab.budget = ab.reference_budget = max(start, 1e-6)
            for k in ("min_budget", "max_budget", "increase", "decrease", "margin"):
                setattr(ab, k, AUTO_BUDGET[k])
            _native.check(lib.rm_session_set_auto_budget(self._live(), ab))
        self.residual_policy, self.residual_budget = policy, ("auto" if auto else start)

    def _apply_policy(self, arr: "umia.PolicyArrays") -> None:
        """Hands a policy's arrays to the session (C copies them)."""
        p = ffi.new("rm_residual_policy *")
        p.struct_size = ffi.sizeof("rm_residual_policy")
        p.kind = arr.kind
        p.seed = 0x5EED
        p.gate_power = arr.gate_power
        p.gain = arr.gain
        keep = []  # the buffers must live until the call returns
        for field, a, dtype, ctype in (("expert_score", arr.expert_score, np.float32, "float[]"),
                                       ("layer_score", arr.layer_score, np.float32, "float[]"),
                                       ("layer_budget", arr.layer_budget, np.float32, "float[]"),
                                       ("threshold0", arr.threshold0, np.float32, "float[]"),
                                       ("layer_mask", arr.layer_mask, np.uint8, "uint8_t[]")):
            if a is not None:
                keep.append(np.ascontiguousarray(a, dtype=dtype))
                setattr(p, field, ffi.from_buffer(ctype, keep[-1]))
        _native.check(lib.rm_session_set_policy(self._live(), p))

    def _set_policy_raw(self, kind: int, layer_mask: np.ndarray | None = None) -> None:
        """NONE or ALL with an optional per-layer mask (calibration measures layers this way)."""
        self._cached = []   # as in set_residual: the cached prefix had other residuals
        self._apply_policy(umia.PolicyArrays(kind, layer_mask=layer_mask))

    def set_layer_mask(self, policy: str, layer_mask: np.ndarray) -> None:
        """``none`` or ``all`` with the residual off in the layers where layer_mask is 0 (n_layer
        entries): calibration measures what one layer's residuals are worth this way."""
        if policy not in ("none", "all"):
            raise InvalidArgumentError(f"a layer mask goes with policy none or all, not {policy!r}")
        self._set_policy_raw(umia.KIND[policy], np.asarray(layer_mask, dtype=np.uint8))

    def set_residual_mask(self, mask: np.ndarray | None) -> None:
        """A given selection instead of the policy (offline studies: tools/umia_oracle.py): slot k
        of the token at cache position p in layer l gets its residual iff ``mask[p, l, k]``; mask
        has shape (n_pos, n_layer, n_expert_used), positions from n_pos on get none. None returns
        to the policy set before (``residual_policy`` keeps naming it); ``set_residual`` replaces
        both."""
        self._cached = []   # as in set_residual: the cached prefix had other residuals
        if mask is None:
            _native.check(lib.rm_session_set_residual_mask(self._live(), ffi.NULL, 0))
            return
        m = np.ascontiguousarray(mask, dtype=np.uint8)
        want = (self.info["n_layer"], self.info["n_expert_used"])
        if m.ndim != 3 or m.shape[1:] != want:
            raise InvalidArgumentError(f"residual mask: expected shape (n_pos, {want[0]}, {want[1]}), got {m.shape}")
        if self.residual_path is None:
            raise NoResidualError("a residual mask needs a residual sidecar, and this model was loaded without one")
        _native.check(lib.rm_session_set_residual_mask(self._live(), ffi.from_buffer("uint8_t[]", m), m.shape[0]))

    # -- calibration (rm_session_set_calibration and its records) ---------------------------------

    def set_calibration(self, on: bool) -> None:
        """Turns calibration on (clearing its sums; the session must run on the CPU and have a
        sidecar) or off. While on, every residual slot also runs its base alone, and the routing of
        every position in the cache is kept."""
        _native.check(lib.rm_session_set_calibration(self._live(), 1 if on else 0))

    def calibration(self) -> tuple[np.ndarray, np.ndarray]:
        """The sums of |f_{B+R}(x) - f_B(x)| and the slot counts per (layer, expert) since
        calibration was turned on, each of shape (n_layer, n_expert)."""
        L, X = self.info["n_layer"], self.info["n_expert"]
        delta = np.zeros(L * X, np.float64)
        count = np.zeros(L * X, np.uint64)
        _native.check(lib.rm_session_calibration(self._live(), ffi.from_buffer("double[]", delta),
                                                 ffi.from_buffer("uint64_t[]", count), L * X))
        return delta.reshape(L, X), count.reshape(L, X)

    def set_importance(self, on: bool) -> None:
        """Turns the collection of the experts' input importance on (clearing its sums; the session
        must run on the CPU) or off (freeing them)."""
        _native.check(lib.rm_session_set_importance(self._live(), 1 if on else 0))

    def importance(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Since collection was turned on: the sums of x^2 per input column of each expert's
        gate/up matrices, shape (n_layer, n_expert, n_embd), and of its down matrix, shape
        (n_layer, n_expert, n_ff_exp), and the rows summed, shape (n_layer, n_expert)."""
        L, X, E, F = (self.info[k] for k in ("n_layer", "n_expert", "n_embd", "n_ff_exp"))
        s_in, s_ff = np.zeros(L * X * E, np.float64), np.zeros(L * X * F, np.float64)
        count = np.zeros(L * X, np.uint64)
        _native.check(lib.rm_session_importance(self._live(), ffi.from_buffer("double[]", s_in), s_in.size,
                                                ffi.from_buffer("double[]", s_ff), s_ff.size,
                                                ffi.from_buffer("uint64_t[]", count), count.size))
        return s_in.reshape(L, X, E), s_ff.reshape(L, X, F), count.reshape(L, X)

    def route_log(self) -> tuple[np.ndarray, np.ndarray]:
        """The experts and router weights of every position in the cache, recorded while
        calibrating, each of shape (n_past, n_layer, n_expert_used)."""
        L, K = self.info["n_layer"], self.info["n_expert_used"]
        n = self.n_past
        experts = np.zeros(n * L * K, np.int32)
        gates = np.zeros(n * L * K, np.float32)
        _native.check(lib.rm_session_route_log(self._live(), ffi.from_buffer("int32_t[]", experts),
                                               ffi.from_buffer("float[]", gates), experts.size))
        return experts.reshape(n, L, K), gates.reshape(n, L, K)

    def stats(self) -> dict:
        """Per-layer, per-expert activation and residual counts since the last ``clear_stats``,
        and the realised residual rate."""
        n = self.info["n_layer"] * self.info["n_expert"]
        act = np.zeros(n, dtype=np.uint64)
        res = np.zeros(n, dtype=np.uint64)
        _native.check(lib.rm_session_stats(self._live(), ffi.from_buffer("uint64_t[]", act),
                                           ffi.from_buffer("uint64_t[]", res), n))
        shape = (self.info["n_layer"], self.info["n_expert"])
        total = int(act.sum())
        return {"active": act.reshape(shape), "residual": res.reshape(shape),
                "residual_rate": float(res.sum()) / total if total else 0.0,
                "policy": self.residual_policy, "budget": self.residual_budget}

    def clear_stats(self) -> None:
        _native.check(lib.rm_session_clear_stats(self._live()))

    @property
    def expert_cache(self) -> dict:
        """The expert cache of a model streamed from its files (``ram_budget``), counted since the
        load (rm_expert_cache_stats in rapidmoe.h): ``streaming`` is False, and the rest zero,
        when every weight is in memory. ``hit_rate`` is the share of the experts a token asked
        for that were in memory (read ahead included); ``prefetch_accuracy`` the share of the
        experts read ahead that a token then asked for."""
        st = ffi.new("rm_expert_cache_stats *")
        st.struct_size = ffi.sizeof("rm_expert_cache_stats")
        _native.check(lib.rm_model_expert_cache_stats(self._model, st))
        out = {"streaming": bool(st.streaming), "direct_io": bool(st.direct_io)}
        for k in ("slots", "slots_used", "budget_bytes", "resident_bytes", "cache_bytes", "slot_bytes", "hits",
                  "misses", "prefetched", "prefetch_used", "evictions", "bytes_read", "read_errors"):
            out[k] = int(getattr(st, k))
        out["wait_s"] = int(st.wait_us) * 1e-6
        asked = out["hits"] + out["misses"] + out["prefetch_used"]
        out["hit_rate"] = (out["hits"] + out["prefetch_used"]) / asked if asked else 0.0
        out["prefetch_accuracy"] = out["prefetch_used"] / out["prefetched"] if out["prefetched"] else 0.0
        return out

    def backend_stats(self) -> dict:
        """What crossed the bus and how the CPU/GPU split went since the last ``clear_stats``
        (rm_backend_stats in rapidmoe.h; all zero on the CPU backend)."""
        bs = ffi.new("rm_backend_stats *")
        bs.struct_size = ffi.sizeof("rm_backend_stats")
        _native.check(lib.rm_session_backend_stats(self._live(), bs))
        out = {"backend": ffi.string(bs.backend).decode()}
        for k in ("n_tokens", "h2d_bytes", "d2h_bytes", "h2d_weight_bytes", "n_syncs", "n_layer_steps", "n_stalls"):
            out[k] = int(getattr(bs, k))
        for k in ("host_ms", "device_ms", "auto_budget"):
            out[k] = float(getattr(bs, k))
        return out

    def profile(self) -> dict:
        """Where evaluation time went since the last ``clear_stats``, per part of the forward pass
        (rm_session_profile in rapidmoe.h): ``{"decode": {part: seconds}, "prefill": {...},
        "tokens": {"decode": n, "prefill": n}}``; decode is batches of one token."""
        n = lib.RM_PROF_COUNT
        us = np.zeros(2 * n, dtype=np.float64)
        tokens = ffi.new("uint64_t[2]")
        _native.check(lib.rm_session_profile(self._live(), ffi.from_buffer("double[]", us), us.size, tokens))
        names = [ffi.string(lib.rm_profile_part_name(i)).decode() for i in range(n)]
        return {"decode": {k: float(us[i]) * 1e-6 for i, k in enumerate(names)},
                "prefill": {k: float(us[n + i]) * 1e-6 for i, k in enumerate(names)},
                "tokens": {"decode": int(tokens[0]), "prefill": int(tokens[1])}}

    def bytes_per_token(self, residual_rate: float) -> float:
        """Weight bytes one decoded token reads: dense weights, the activated experts' bases,
        and the residuals of the share of them that got one."""
        i = self.info
        used = i["n_expert_used"] / i["n_expert"]
        return i["dense_bytes"] + used * (i["base_expert_bytes"] + residual_rate * i["residual_expert_bytes"])

    # -- generation -----------------------------------------------------------------------------

    def generate_tokens(self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams,
                        stop_ids: set[int] | None = None, *, logit_bias: Mapping | None = None) -> Iterator[int]:
        """Yields generated token ids until an end-of-generation token or max_tokens.

        Only the prompt's tokens after its common prefix with the cache are evaluated (the rest
        is kept; ``reuse_prefix = False`` evaluates all from an empty cache), as llama-cpp-python
        does; ``last_timings["prompt_reused"]`` says how many were kept. The prompt goes in steps
        of n_batch tokens; when ``cancel`` (e.g. a threading.Event) is set, generation stops between
        them or before the next token. ``logit_bias``: token id -> a bias in [-100, 100] added to
        that token's logit before sampling (OpenAI's logit_bias)."""
        bias = LogitBias.check(logit_bias, self.n_vocab)
        for t, _ in self._generate(prompt_ids, max_tokens, sampling, stop_ids, bias):
            yield t

    def _generate(self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams,
                  stop_ids: set[int] | None = None, bias: LogitBias | None = None,
                  n_top: int | None = None, grammar=None) -> Iterator[tuple[int, TokenLogprob | None]]:
        """generate_tokens, each token with its TokenLogprob and the n_top most likely tokens'
        (None when n_top is None: then no log-probability is computed); ``grammar``
        (grammar.Grammar): only what it allows is generated."""
        prompt = self._as_tokens(prompt_ids)
        if prompt.size == 0:
            raise InvalidArgumentError("the prompt is empty: give at least one token")
        if max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be >= 0, got {max_tokens}")
        if prompt.size + max(max_tokens, 1) > self.n_ctx:
            raise InvalidArgumentError(
                f"the prompt has {prompt.size} tokens and {max_tokens} more were asked for, "
                f"but the context holds {self.n_ctx} (raise n_ctx)")
        sampler = Sampler(sampling, bias, grammar.constraint() if grammar is not None else None)
        stop = set(self.tokenizer.eog_ids) if stop_ids is None else stop_ids
        history = prompt.tolist()
        t0 = time.perf_counter()
        keep = self._keep_prefix(history)
        self.last_timings = {"prompt_tokens": int(prompt.size), "prompt_reused": keep, "prompt_s": 0.0,
                             "gen_tokens": 0, "gen_s": 0.0}
        pos = keep
        for end in self._prompt_marks(keep, prompt.size) + [prompt.size]:
            while pos < end:   # the steps rm_session_eval would take, cancellable between
                if self.cancel is not None and self.cancel.is_set():
                    return
                logits = self.eval(prompt[pos:min(pos + self.n_batch, end)])
                pos = min(pos + self.n_batch, end)
            self._checkpoint()
        t1 = time.perf_counter()
        self.last_timings["prompt_s"] = t1 - t0
        for _ in range(max_tokens):
            t = sampler.sample(logits, history)
            if t in stop:
                break
            logprob = sampler.logprob(logits, t, n_top) if n_top is not None else None
            history.append(t)
            self.last_timings["gen_tokens"] += 1
            yield t, logprob
            if self.n_past >= self.n_ctx or (self.cancel is not None and self.cancel.is_set()):
                break
            logits = self.eval([t])
            self.last_timings["gen_s"] = time.perf_counter() - t1

    def generate(self, prompt: str, max_tokens: int = 128, **sampling) -> str:
        """Generates a continuation of prompt and returns it as text. ``sampling``: the fields of
        SamplingParams (temperature=0 is greedy)."""
        return "".join(self.stream(prompt, max_tokens, **sampling))

    def stream(self, prompt: str | Sequence[int], max_tokens: int = 128, *, stop: str | Sequence[str] = (),
               sampling: SamplingParams | None = None, **params) -> Iterator[str]:
        """Generates a continuation of prompt (text or token ids), yielding text pieces as they
        become complete: a piece never ends inside a character, and text that could begin a stop
        string is held back until it cannot. Generation ends at an end-of-generation token, a stop
        string (not yielded) or ``max_tokens``; then ``finish_reason`` is "stop" or "length".
        Sampling: ``sampling``, or SamplingParams built from ``params``.

            for piece in model.stream("Once upon a time", 64, temperature=0):
                print(piece, end="", flush=True)
        """
        if sampling is None:
            sampling = SamplingParams(**params)
        elif params:
            raise InvalidArgumentError(f"stream: give sampling or {', '.join(params)}, not both")
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        for piece, _ in self._pieces(ids, max_tokens, stop, sampling):
            yield piece

    def _pieces(self, ids: Sequence[int], max_tokens: int, stop: str | Sequence[str], sampling: SamplingParams,
                bias: LogitBias | None = None, n_top: int | None = None, grammar=None) -> Iterator[tuple[str, list]]:
        """stream's pieces, each with the (TokenLogprob, text offset) of the tokens whose text it
        completes (TextStream.released; [] when n_top is None)."""
        text = TextStream(self.tokenizer, stop)
        self.finish_reason = "stop"
        for t, logprob in self._generate(ids, max_tokens, sampling, None, bias, n_top, grammar):
            piece = text.feed(t, logprob)
            if piece is not None:
                yield piece, text.released()
            if text.stopped:
                return
        if self.last_timings.get("gen_tokens", 0) >= max_tokens:
            self.finish_reason = "length"
        rest = text.flush()
        left = text.released()
        if rest or left:
            yield rest, left

    def create_completion(self, prompt, max_tokens: int = 16, temperature: float = _SD["temperature"],
                          top_p: float = _SD["top_p"], top_k: int = _SD["top_k"], min_p: float = _SD["min_p"],
                          repeat_penalty: float = _SD["repeat_penalty"], seed: int | None = _SD["seed"],
                          stop: str | Sequence[str] | None = None, stream: bool = False, model: str | None = None,
                          logprobs: int | None = None, logit_bias: Mapping | None = None,
                          response_format: Mapping | None = None, grammar: str | None = None):
        """An OpenAI-style text completion, as llama-cpp-python returns it (a dict, or an iterator
        of chunk dicts when streaming). ``logprobs`` N (0 to 20): each generated token's
        log-probability and the N most likely tokens' (OpenAI's legacy shape: tokens,
        token_logprobs, top_logprobs, text_offset; see sampling.token_logprob for what they
        measure). ``logit_bias``: token id -> a bias in [-100, 100] added to its logit.
        ``response_format`` (as create_chat_completion's) or ``grammar`` (GBNF text, as llama.cpp's
        grammars are written): the text is constrained to it (``rapidmoe_gguf.grammar``)."""
        from . import grammar as grammars

        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                  repeat_penalty=repeat_penalty, seed=seed)
        n_top = None if logprobs is None else check_top_logprobs(logprobs, "logprobs")
        return self._completion(prompt, max_tokens, sampling, stop, stream, model, n_top,
                                LogitBias.check(logit_bias, self.n_vocab), "completion",
                                grammar=grammars.completion_grammar(self.tokenizer, response_format, grammar))

    def _completion(self, prompt, max_tokens: int, sampling: SamplingParams, stop: str | Sequence[str] | None,
                    stream: bool, model: str | None, n_top: int | None, bias: LogitBias | None, kind: str,
                    text_offset: int | None = None, grammar=None):
        """create_completion, with the logprobs (n_top not None) in the shape of ``kind``'s
        choices ("completion" or "chat": create_chat_completion's, which moves them over).
        ``text_offset``: the legacy shape's offset of the completion's text (None: the prompt's length).
        ``grammar`` (grammar.Grammar): the text is constrained to it."""
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        cid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        name = model or os.path.basename(self.path)
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        shape = None
        if n_top is not None:    # legacy offsets count from the prompt's start: its text, or its tokens' text
            if text_offset is None and kind == "completion":
                text_offset = len(prompt) if isinstance(prompt, str) else len(self.detokenize(prompt_ids))
            shape = logprobs_shape(kind, self.tokenizer, text_offset or 0)
        pieces = self._pieces(prompt_ids, max_tokens, stops, sampling, bias, n_top, grammar)

        def usage():
            n_gen = self.last_timings.get("gen_tokens", 0)
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": n_gen,
                    "total_tokens": len(prompt_ids) + n_gen,
                    "prompt_tokens_details": {"cached_tokens": self.last_timings.get("prompt_reused", 0)}}

        def chunk(text: str, items: list, finish_reason: str | None) -> dict:
            logprobs = shape(items) if shape is not None and items else None
            return {"id": cid, "object": "text_completion", "created": created, "model": name,
                    "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}]}

        if stream:
            def it():
                for text, items in pieces:
                    yield chunk(text, items, None)
                yield chunk("", [], self.finish_reason)
            return it()
        texts, items = [], []
        for text, got in pieces:
            texts.append(text)
            items += got
        out = chunk("".join(texts), items, self.finish_reason)
        if shape is not None and not items:
            out["choices"][0]["logprobs"] = shape([])
        return {**out, "usage": usage()}

    def create_chat_completion(self, messages: Sequence[dict], max_tokens: int | None = None,
                               temperature: float = _SD["temperature"], top_p: float = _SD["top_p"],
                               top_k: int = _SD["top_k"], min_p: float = _SD["min_p"],
                               repeat_penalty: float = _SD["repeat_penalty"], seed: int | None = _SD["seed"],
                               stop: str | Sequence[str] | None = None, stream: bool = False,
                               model: str | None = None, reasoning_effort: str | None = None,
                               show_reasoning: bool = False, logprobs: bool = False, top_logprobs: int | None = None,
                               logit_bias: Mapping | None = None, chat_template_kwargs: Mapping | None = None,
                               tools: Sequence[dict] | None = None, tool_choice: str | Mapping | None = None,
                               parallel_tool_calls: bool | None = None, response_format: Mapping | None = None,
                               reasoning_format: str = "auto", grammar: str | None = None):
        """An OpenAI-style chat completion, as llama-cpp-python returns it: the messages are rendered
        with the model's own chat template (see ``rapidmoe_gguf.chat``), with ``chat_template_kwargs``
        as further template variables (e.g. ``{"enable_thinking": False}``). ``max_tokens`` None: up to
        the end of the context. gpt-oss: ``reasoning_effort`` goes to its template, the reply is its
        final channel, and the analysis channel comes as ``reasoning_content`` with ``show_reasoning``.
        ``logprobs``: each generated token's log-probability, with the ``top_logprobs`` (0 to 20)
        most likely tokens' (OpenAI's shape); ``logit_bias``: token id -> a bias in [-100, 100].
        ``tools``, ``tool_choice``, ``parallel_tool_calls``: as OpenAI's; the reply's calls come as
        the message's ``tool_calls`` in the model's own format (see ``rapidmoe_gguf.tool_calls``).
        ``response_format``: as OpenAI's (``{"type": "json_object"}``, or ``{"type": "json_schema",
        "json_schema": {"schema": ...}}``): the reply is constrained to JSON of that schema
        (``rapidmoe_gguf.grammar``), after the model's thinking; ``grammar``: GBNF text the whole
        reply is constrained to. With ``tools``, tool_choice "required" or a named function forces
        a well-formed call, and under "auto" a call the model starts is kept well formed
        (``rapidmoe_gguf.tool_grammar``). ``reasoning_format``: "auto" (or "deepseek", as llama.cpp's server
        names it) gives a thinking model's ``<think>`` block (Qwen3, DeepSeek-R1, GLM) as the
        message's ``reasoning_content``, "none" leaves it in ``content``."""
        from . import chat

        return chat.create_chat_completion(
            self, messages, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            min_p=min_p, repeat_penalty=repeat_penalty, seed=seed, stop=stop, stream=stream, model=model,
            reasoning_effort=reasoning_effort, show_reasoning=show_reasoning, logprobs=logprobs,
            top_logprobs=top_logprobs, logit_bias=logit_bias, chat_template_kwargs=chat_template_kwargs,
            tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
            response_format=response_format, reasoning_format=reasoning_format, grammar=grammar)

    # -- several sequences at once --------------------------------------------------------------

    def generate_many(self, prompts: Sequence[str | Sequence[int]], max_tokens: int = 128, *,
                      stop: str | Sequence[str] = (), sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                      **params) -> list[str]:
        """Generates a continuation of each prompt (text or token ids) at once: every step is one
        evaluation (``eval_batch``) of one token of each unfinished sequence, so the weights are
        read once per step for all of them. This Model's session runs the first prompt, and
        sessions of its own (kept for the next call, which reuses their common prefixes as
        ``generate`` does) the others. ``sampling``: one SamplingParams for all, or one each;
        ``stop`` strings end a sequence (not included). ``finish_reasons`` then holds "stop" or
        "length" per prompt."""
        if sampling is None:
            sampling = SamplingParams(**params)
        elif params:
            raise InvalidArgumentError(f"generate_many: give sampling or {', '.join(params)}, not both")
        if max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be >= 0, got {max_tokens}")
        samplings = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        if len(samplings) != len(prompts):
            raise InvalidArgumentError(f"generate_many: {len(samplings)} sampling settings for {len(prompts)} prompts")
        stops = [stop] if isinstance(stop, str) else [s for s in stop if s]
        ids = [self._as_tokens(self.tokenize(p) if isinstance(p, str) else p).tolist() for p in prompts]
        for i, p in enumerate(ids):
            if not p:
                raise InvalidArgumentError(f"prompt {i} is empty: give at least one token")
            if len(p) + max(max_tokens, 1) > self.n_ctx:
                raise InvalidArgumentError(f"prompt {i} has {len(p)} tokens and {max_tokens} more were asked for, "
                                           f"but the context holds {self.n_ctx} (raise n_ctx)")
        while len(self._batch_forks) < len(ids) - 1:
            self._batch_forks.append(self.fork_session())
        seqs = [self] + self._batch_forks[:len(ids) - 1]
        keep = [m._keep_prefix(p) for m, p in zip(seqs, ids)]
        logits = eval_batch([(m, p[k:]) for m, p, k in zip(seqs, ids, keep)])
        for m in seqs:
            m._checkpoint()
        samplers = [Sampler(sp) for sp in samplings]
        history = [list(p) for p in ids]
        out: list[list[int]] = [[] for _ in ids]
        self.finish_reasons = ["length"] * len(ids)
        live = list(range(len(ids)))
        for _ in range(max_tokens):
            step = []
            for i, lg in zip(live, logits):
                t = samplers[i].sample(lg, history[i])
                history[i].append(t)
                if t in self.tokenizer.eog_ids:
                    self.finish_reasons[i] = "stop"
                    continue
                out[i].append(t)
                if stops and any(s in self.detokenize(out[i]) for s in stops):
                    self.finish_reasons[i] = "stop"
                    continue
                step.append(i)
            live = [i for i in step if len(out[i]) < max_tokens]
            if not live:
                break
            logits = eval_batch([(seqs[i], [out[i][-1]]) for i in live])
        texts = [self.detokenize(o) for o in out]
        for i, text in enumerate(texts):
            cut = [text.find(s) for s in stops if s in text]
            texts[i] = text[:min(cut)] if cut else text
        return texts


class TextStream:
    """Generated tokens as text, one token at a time (``Model.stream``, the server's scheduler):
    ``feed`` returns the text a token completes, or None while there is none; text that could
    begin a stop string is held back until it cannot. When the text reaches a stop string,
    ``feed`` returns what comes before it (maybe "") and ``stopped`` turns true: the reply ends
    there, and nothing held back follows. Otherwise ``flush`` gives the rest at the end.

    A token fed with a ``tag`` (its log-probability) is followed to the text given out:
    ``released`` returns the tags of the tokens whose text has all been given out since its last
    call, so that a chunk carries the logprobs of the tokens whose text it carries. A token that
    holds only the first bytes of a character goes with the token that completes it; after a
    stop string, the tokens whose text begins before it go (the stop string's own do not); after
    ``flush``, all. Tokens fed without a tag cost nothing here."""

    def __init__(self, tokenizer: Tokenizer, stop: str | Sequence[str] = ()):
        self.stops = [stop] if isinstance(stop, str) else list(stop)
        self._dec = IncrementalDecoder(tokenizer)
        self._pending = ""
        self._hold = max((len(s) for s in self.stops), default=0)
        self.stopped = False
        self.stop_hit: str | None = None   # the stop string that ended the text
        self._decoded = 0              # characters decoded so far
        self._given = 0                # of them, given out by feed and flush
        self._flushed = False
        self._tagged: list[list] = []  # [tag, start, end or None] of tagged tokens not yet released

    def feed(self, token: int, tag=None) -> str | None:
        text = self._dec.feed(token)
        if tag is not None:
            self._track(tag, len(text))
        self._decoded += len(text)
        self._pending += text
        hits = [(self._pending.find(s), s) for s in self.stops if s and s in self._pending]
        if hits:
            at, self.stop_hit = min(hits)
            self.stopped = True
            return self._give(self._pending[:at])
        if len(self._pending) > self._hold:
            cut = len(self._pending) - self._hold
            piece, self._pending = self._pending[:cut], self._pending[cut:]
            return self._give(piece)
        return None

    def flush(self) -> str:
        rest, self._pending = self._pending + self._dec.flush(), ""
        self._flushed = True
        return self._give(rest)

    def released(self) -> list[tuple[Any, int]]:
        """(tag, the token's character offset in the text) of the tagged tokens whose text has
        been given out since the last call (see the class)."""
        if self._flushed:
            n = len(self._tagged)
        elif self.stopped:
            n = sum(1 for _, start, _ in self._tagged if start < self._given)
        else:
            n = 0
            while n < len(self._tagged) and self._tagged[n][2] is not None and self._tagged[n][2] <= self._given:
                n += 1
        out = [(tag, start) for tag, start, _ in self._tagged[:n]]
        self._tagged = [] if self.stopped or self._flushed else self._tagged[n:]
        return out

    def _track(self, tag, n_chars: int) -> None:
        start = self._decoded
        if n_chars:            # the tokens before that gave no text held the first bytes of this one's
            for item in reversed(self._tagged):
                if item[2] is not None:
                    break
                item[2] = start + n_chars
        self._tagged.append([tag, start, start + n_chars if n_chars else None])

    def _give(self, piece: str) -> str:
        self._given += len(piece)
        return piece


def eval_batch(seqs: Sequence[tuple[Model, Sequence[int]]], all_logits: bool = False) -> list[np.ndarray]:
    """Feeds each Model's tokens after those already in its cache, all in one evaluation
    (rm_batch_eval): the Models are sessions of one loaded model (a Model and its forks), each
    at most once. Returns per sequence its last position's logits (n_vocab), or with all_logits
    every position's (n_tokens, n_vocab). Runs on the CPU backend, for every architecture
    (multi-head latent attention and linear-attention layers per sequence on its own session)."""
    if not seqs:
        raise InvalidArgumentError("eval_batch needs at least one sequence")
    models = [m for m, _ in seqs]
    if len({id(m) for m in models}) != len(models):
        raise InvalidArgumentError("eval_batch: a Model appears twice; give each sequence its own (fork_session)")
    toks = [m._as_tokens(t) for m, t in seqs]
    for i, t in enumerate(toks):
        if t.size == 0:
            raise InvalidArgumentError(f"eval_batch: sequence {i} has no tokens")
    tokens = np.concatenate(toks).astype(np.int32)
    seq = np.concatenate([np.full(t.size, i, np.int32) for i, t in enumerate(toks)])
    want = np.concatenate([np.ones(t.size, np.int8) if all_logits else np.eye(1, t.size, t.size - 1, np.int8)[0]
                           for t in toks])
    n_vocab = models[0].n_vocab
    out = np.empty((int(want.sum()), n_vocab), np.float32)
    sessions = ffi.new("rm_session *[]", [m._live() for m in models])
    b = ffi.new("rm_batch *")
    b.struct_size = ffi.sizeof("rm_batch")
    b.n_tokens, b.n_sessions = int(tokens.size), len(models)
    b.tokens = ffi.from_buffer("int32_t[]", tokens)
    b.seq = ffi.from_buffer("int32_t[]", seq)
    b.logits = ffi.from_buffer("int8_t[]", want)
    b.sessions = sessions
    b.out, b.out_cap = ffi.from_buffer("float[]", out), out.size
    try:
        _native.check(lib.rm_batch_eval(b))
    finally:
        for m, t in zip(models, toks):
            m._cached = (m._cached + t.tolist())[:m.n_past]
    if all_logits:
        return np.split(out, np.cumsum([t.size for t in toks])[:-1])
    return list(out)
