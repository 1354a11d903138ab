"""The placement planner: what lives on the GPU within a memory budget, and what each side reads
per token (docs/SPLIT.md).

Everything a token reads outside the routed experts goes to the GPU: attention, norms, router,
shared experts, the output head, plus the KV cache for ``n_ctx`` positions and the scratch of
one session. Then every expert's base, most used first (``rapidmoe.umia.expert_frequency`` from
the sidecar's calibration; uniform without it), while it fits. Bases that do not fit stay in host
memory and the CPU computes those experts at base precision; residuals always stay in host memory.

Device bytes are the native library's own: the weight arena's rounding (RM_DEVICE_ALIGN), a
session's buffers (rm_session_sizes_get, the function the sessions allocate by) and the types the
CUDA kernels take (the library's type table, in every build); the library enforces the same
budget as a hard cap, so a plan that fits here fits there. Linear-attention layers (the hybrids'
Gated DeltaNet) keep a recurrent state on the device instead of a KV cache: ``recurrent_state``.

    sizes = ModelSizes.from_files("m.gguf", "m.residual.gguf")
    p = plan(sizes, "8GiB", n_ctx=4096)
    print(p.summary())
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import time

import numpy as np

from . import _native, umia
from ._native import ffi, lib
from .errors import InvalidArgumentError, RapidMoEError
from .gguf_file import GGUFFile, open_gguf
from .quants import CUDA_MATMUL_TYPES as GPU_MATMUL_TYPES   # other matrices stay on the host
from .resplit import residual_path as default_residual_path

ALIGN = lib.RM_DEVICE_ALIGN      # each range of weights in the device's arena is rounded up to this
_EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.(weight|residual)$")


class PlanError(RapidMoEError):
    """The budget cannot hold what must be on the GPU."""


def parse_bytes(value: str | int | float) -> int:
    """``"8GiB"``, ``"8G"`` (both 2^30), ``"8GB"`` (10^9), ``"512MiB"``, ``"1.5TiB"`` or a number of bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise InvalidArgumentError(f"a memory size must be >= 0, got {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)(B?)\s*", str(value), re.I)
    if not m or (m.group(3) and not m.group(2)):
        raise InvalidArgumentError(f"cannot read the memory size {value!r}: use e.g. 8GiB, 8GB, 512MiB or a byte count")
    number, unit, binary, b = m.group(1), m.group(2).upper(), m.group(3), m.group(4)
    power = "KMGT".find(unit) + 1 if unit else 0
    base = 1000 if (b and not binary) else 1024   # "GB" is decimal; "G" and "GiB" are binary
    return int(float(number) * base ** power)


def _size(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def _align(n: int) -> int:
    return (int(n) + ALIGN - 1) // ALIGN * ALIGN


# ---------------------------------------------------------------------------------------------
# the model's sizes
# ---------------------------------------------------------------------------------------------

# the linear-attention fields of rm_size_params (and of ModelSizes and GGUFFile.hparams)
_LINEAR_SIZES = ("n_layer_linear", "ssm_d_conv", "ssm_conv_dim", "ssm_n_v", "ssm_d_state", "ssm_head_v")
# the hyper-connections' and PLE's (qwen4exp), the same way
_HYPER_SIZES = ("hc_count", "hc_low_rank", "n_layer_ple", "ple_ngram", "ple_conv_kernel", "ple_embd", "n_layer_csa",
                "n_layer_hca")


@dataclasses.dataclass
class ModelSizes:
    """What the planner needs from a model, in bytes as the GPU would hold them."""

    n_layer: int
    n_expert: int
    n_expert_used: int
    n_embd: int
    n_ff_exp: int
    n_ff_shexp: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    dense_gpu: int                   # dense tensors the GPU holds (aligned)
    dense_host: int                  # dense matrices of types the CUDA kernels lack (stay on the host)
    dense_read: int                  # dense bytes read per token (the GPU's and the host's)
    expert_base: np.ndarray          # (n_layer, n_expert): one expert's three base matrices (aligned)
    expert_residual: np.ndarray      # (n_layer, n_expert): its three residual matrices; 0 without sidecar
    frequency: np.ndarray            # (n_layer, n_expert): share of a layer's slots; rows sum to 1
    calibrated: bool = False         # frequency came from calibration
    base_gpu_ok: np.ndarray | None = None   # (n_layer,): the layer's expert types run on the GPU
    n_ff: int = 0                    # dense FFN width (leading dense layers); 0 without
    kv_lora_rank: int = 0            # MLA: the cache holds kv_lora_rank + n_rot floats per position and layer
    n_rot: int = 0
    head_dim_v: int = 0
    # linear-attention layers (a recurrent state each, on the host), as rm_size_params takes them
    n_layer_linear: int = 0
    ssm_d_conv: int = 0
    ssm_conv_dim: int = 0
    ssm_n_v: int = 0
    ssm_d_state: int = 0
    ssm_head_v: int = 0
    n_swa: int = 0                   # sliding layers (gpt-oss) cache a ring of n_swa + n_batch positions
    n_layer_swa: int = 0             # how many layers slide
    n_head_kv_swa: int = 0           # their kv heads and head width where they differ (Gemma 4); 0: the others'
    head_dim_swa: int = 0
    n_head_swa: int = 0              # their query heads where they differ (Step-3.5); 0: n_head
    index_head_dim: int = 0          # sparse attention (GLM-5): the indexer's key, cached beside each latent
    index_n_head: int = 0            # and its query heads
    hc_count: int = 0                # hyper-connections: residual streams (activations hc_count times wider)
    hc_low_rank: int = 0
    n_layer_ple: int = 0             # PLE layers: a conv state each and the session's last tokens
    ple_ngram: int = 0
    ple_conv_kernel: int = 0
    ple_embd: int = 0
    n_layer_csa: int = 0             # DeepSeek-V4's compressed layers: their entries and last windows' rows
    n_layer_hca: int = 0

    def __post_init__(self) -> None:
        if self.base_gpu_ok is None:
            self.base_gpu_ok = np.ones(self.n_layer, dtype=bool)

    @property
    def expert_params(self) -> int:
        """Weights of one expert (three matrices)."""
        return 3 * self.n_embd * self.n_ff_exp

    @property
    def kv_bytes_per_pos(self) -> int:
        """KV cache bytes per position, all layers (the library's KV cache of one position)."""
        return session_device_bytes(self, 1, 1, False)["kv_cache"]

    @classmethod
    def from_files(cls, path: str | os.PathLike, residual: str | os.PathLike | None = "auto") -> "ModelSizes":
        """Sizes from a base GGUF and, when given (``"auto"``: ``NAME.residual.gguf`` if present),
        its sidecar; tensor sizes come from the files' tensor tables, nothing is read in bulk."""
        path = os.fspath(path)
        if residual == "auto":
            cand = default_residual_path(path)
            residual = cand if os.path.isfile(cand) else None
        with open_gguf(path) as g, (open_gguf(residual) if residual is not None else contextlib.nullcontext()) as r:
            return cls.from_gguf(g, r)

    @classmethod
    def from_gguf(cls, g: GGUFFile, r: GGUFFile | None = None) -> "ModelSizes":
        """``from_files`` on a base (and sidecar) already open with ``open_gguf``."""
        path = g.path
        hp = g.hparams()   # the keys as the loader reads them
        n_layer, n_expert = hp["n_layer"], hp["n_expert"]
        sizes = {k: hp[k] for k in ("n_layer", "n_expert", "n_expert_used", "n_embd", "n_head", "n_head_kv",
                                    "head_dim", "n_ff_shexp", "n_ff", "kv_lora_rank", "n_rot", "head_dim_v",
                                    *_LINEAR_SIZES, "n_swa", "n_layer_swa", "n_head_kv_swa", "head_dim_swa",
                                    "n_head_swa", "index_head_dim", "index_n_head", *_HYPER_SIZES)}
        sizes["n_ff_exp"] = 0
        base = np.zeros((n_layer, n_expert), dtype=np.int64)
        gpu_ok = np.ones(n_layer, dtype=bool)
        dense_gpu = dense_host = dense_read = 0
        tensors = g.tensors
        if "token_embd.weight" not in tensors:
            raise RapidMoEError(f"{path}: token_embd.weight is missing")
        sizes["n_vocab"] = tensors["token_embd.weight"].ne[1]
        for name, t in tensors.items():
            m = _EXPERT_RE.match(name)
            if m:
                layer = int(m.group(1))
                if layer >= n_layer or t.ne[2] != n_expert:
                    raise RapidMoEError(f"{path}: tensor '{name}' does not fit {n_layer} layers of {n_expert} experts")
                base[layer, :] += _align(t.nbytes // n_expert)
                gpu_ok[layer] &= t.type_name in GPU_MATMUL_TYPES
                if m.group(2) in ("up", "gate_up"):   # llama.cpp's fused gate_up: gate rows, then up rows
                    sizes["n_ff_exp"] = t.ne[1] // (2 if m.group(2) == "gate_up" else 1)
                continue
            if name == "token_embd.weight":
                continue   # rows are looked up on the host; only the tied output head reads it whole
            dense_read += t.nbytes
            if len(t.ne) == 1 or t.type_name in GPU_MATMUL_TYPES:
                dense_gpu += _align(t.nbytes)
            else:
                dense_host += t.nbytes
        if "output.weight" not in tensors:   # tied: the head is the embedding table
            t = tensors["token_embd.weight"]
            dense_read += t.nbytes
            if t.type_name in GPU_MATMUL_TYPES:
                dense_gpu += _align(t.nbytes)
            else:
                dense_host += t.nbytes
        res = np.zeros((n_layer, n_expert), dtype=np.int64)
        freq, calibrated = np.full((n_layer, n_expert), 1.0 / n_expert), False
        if r is not None:
            for name, t in r.tensors.items():
                m = _EXPERT_RE.match(name)
                if m and int(m.group(1)) < n_layer and t.ne[2] == n_expert:
                    res[int(m.group(1)), :] += t.nbytes // n_expert
            tables = umia.Tables.from_metadata(r.metadata)
            if tables is not None and tables.expert_frequency.shape == (n_layer, n_expert):
                f = np.maximum(np.asarray(tables.expert_frequency, dtype=np.float64), 0.0)
                rows = f.sum(1, keepdims=True)
                freq = np.where(rows > 0, f / np.where(rows > 0, rows, 1.0), 1.0 / n_expert)
                calibrated = True
        return cls(dense_gpu=dense_gpu, dense_host=dense_host, dense_read=dense_read, expert_base=base,
                   expert_residual=res, frequency=freq, calibrated=calibrated, base_gpu_ok=gpu_ok, **sizes)


# ---------------------------------------------------------------------------------------------
# the hardware
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Hardware:
    """The cost model's numbers. Defaults are a desktop with PCIe 4.0 x16 and an RTX 4090-class
    GPU; ``host_bw_gbps=None`` measures host memory bandwidth with a quick numpy copy."""

    host_bw_gbps: float | None = None   # host RAM read bandwidth, GB/s (measured when None)
    pcie_gbps: float = 25.0             # host -> device over PCIe 4.0 x16 from pinned memory, GB/s
    pcie_latency_us: float = 15.0       # one copy plus the wait for it
    gpu_bw_gbps: float = 900.0          # device memory bandwidth, GB/s
    gpu_tflops: float = 40.0            # fp32 rate the dequantizing kernels reach, TFLOP/s
    cpu_gflops: float = 200.0           # rate of the host's quantized dot products, all threads, GFLOP/s
    context_reserve: int = 512 << 20    # device memory the CUDA context takes outside our allocations

    def host_bandwidth(self) -> float:
        return self.host_bw_gbps if self.host_bw_gbps else measure_host_bandwidth()


@functools.lru_cache(maxsize=1)
def measure_host_bandwidth(nbytes: int = 64 << 20, repeats: int = 3) -> float:
    """Host memory bandwidth in GB/s from the best of a few large numpy copies (bytes read plus
    bytes written). Cached: measured once per process."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def crossover_tokens(sizes: ModelSizes, hw: Hardware, host_bw_gbps: float, max_tokens: int = 1 << 16) -> int:
    """Prefill: the fewest tokens needing one expert's residual for which copying the residual to
    the GPU (PCIe time + GPU GEMM) beats the host's GEMM (max of reading R and its flops); 0 when
    the copy never wins or there is no residual."""
    r_bytes = float(sizes.expert_residual.max()) if sizes.expert_residual.size else 0.0
    if r_bytes <= 0:
        return 0
    flops_per_token = 2.0 * sizes.expert_params
    read = r_bytes / (host_bw_gbps * 1e9)
    copy = r_bytes / (hw.pcie_gbps * 1e9) + hw.pcie_latency_us * 1e-6
    n = np.arange(1, max_tokens + 1, dtype=np.float64)
    cpu = np.maximum(read, n * flops_per_token / (hw.cpu_gflops * 1e9))
    gpu = copy + n * flops_per_token / (hw.gpu_tflops * 1e12)
    wins = np.nonzero(gpu < cpu)[0]
    return int(wins[0] + 1) if wins.size else 0


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------

def _session_sizes(s: ModelSizes, n_ctx: int, n_batch: int, upload_residuals: bool, type_k: int = 0, type_v: int = 0):
    """rm_session_sizes_get for one session of this model: the numbers its backend allocates
    (type_k, type_v: the cache's element types, rm_type ids; 0: F32)."""
    p = ffi.new("rm_size_params *")
    p.type_k, p.type_v = type_k, type_v
    p.struct_size = ffi.sizeof("rm_size_params")
    for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_expert", "n_expert_used",
              "n_ff_exp", "n_ff_shexp", "n_vocab", "n_ff", "kv_lora_rank", "n_rot", "head_dim_v", "n_swa",
              "n_layer_swa", "n_head_kv_swa", "head_dim_swa", "n_head_swa", "index_head_dim",
              "index_n_head") + _LINEAR_SIZES + _HYPER_SIZES:
        setattr(p, k, getattr(s, k))
    p.n_ctx, p.n_batch = n_ctx, n_batch
    if upload_residuals and s.expert_residual.size:
        p.stage_expert_bytes = int(s.expert_residual.max())
    out = ffi.new("rm_session_sizes *")
    out.struct_size = ffi.sizeof("rm_session_sizes")
    _native.check(lib.rm_session_sizes_get(p, out))
    return out


def kv_cache_bytes(s: ModelSizes, n_ctx: int, cache_type_k: str = "f32", cache_type_v: str = "f32") -> int:
    """The bytes of one session's KV cache of n_ctx positions in these cache types (Model's
    cache_type_k / cache_type_v), as the session allocates it. ``s``: a ModelSizes, or anything
    with its shape fields (Model.info)."""
    from . import quants

    return int(_session_sizes(s, n_ctx, 1, False, quants.TYPES[cache_type_k.upper()].id,
                              quants.TYPES[cache_type_v.upper()].id).kv_cache)


def session_device_bytes(s: ModelSizes, n_ctx: int, n_batch: int, upload_residuals: bool) -> dict[str, int]:
    """Device bytes of one session, from the library (rm_session_sizes_get): the numbers the
    session's backend then allocates."""
    out = _session_sizes(s, n_ctx, n_batch, upload_residuals)
    parts = {"kv_cache": out.kv_cache, "activations": out.activations + out.split_routing,
             "split_scratch": out.split_scratch + out.split_stage}
    if out.recurrent_state:   # linear-attention layers: conv and delta-rule states, checkpoints, scratch
        parts["recurrent_state"] = out.recurrent_state
    return parts


@dataclasses.dataclass
class Plan:
    budget: int                      # the user's budget, bytes
    cap: int                         # what the library may allocate: budget minus the context reserve
    gpu_parts: dict[str, int]        # bytes by kind
    expert_on_gpu: np.ndarray        # (n_layer, n_expert) bool
    residual_budget: float
    per_token: dict[str, float]      # predicted bytes per decoded token
    crossover_tokens: int
    host_bw_gbps: float
    hardware: Hardware
    messages: list[str]
    n_ctx: int
    n_batch: int

    @property
    def gpu_bytes(self) -> int:
        return int(sum(self.gpu_parts.values()))

    @property
    def n_experts_gpu(self) -> int:
        return int(self.expert_on_gpu.sum())

    @property
    def n_experts(self) -> int:
        return int(self.expert_on_gpu.size)

    def native_mask(self) -> np.ndarray:
        """The ``expert_on_gpu`` array for rm_model_params: uint8, layer-major."""
        return np.ascontiguousarray(self.expert_on_gpu.astype(np.uint8).ravel())

    def as_dict(self) -> dict:
        return {
            "budget_bytes": self.budget, "cap_bytes": self.cap, "gpu_bytes": self.gpu_bytes,
            "gpu_parts": {k: int(v) for k, v in self.gpu_parts.items()},
            "n_experts": self.n_experts, "n_experts_gpu": self.n_experts_gpu,
            "experts_cpu_per_layer": [int(v) for v in (~self.expert_on_gpu).sum(1)],
            "residual_budget": self.residual_budget, "n_ctx": self.n_ctx, "n_batch": self.n_batch,
            "per_token_bytes": {k: float(v) for k, v in self.per_token.items()},
            "crossover_tokens": self.crossover_tokens, "host_bw_gbps": self.host_bw_gbps,
            "hardware": dataclasses.asdict(self.hardware), "messages": list(self.messages),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def summary(self) -> str:
        gib = _size
        mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
        lines = [f"GPU budget {gib(self.budget)}: plan uses {gib(self.gpu_bytes)} "
                 f"(context reserve {gib(self.budget - self.cap)} included)"]
        for k, v in self.gpu_parts.items():
            lines.append(f"  {k:22s} {gib(v):>12s}")
        lines.append(f"expert bases on the GPU: {self.n_experts_gpu} of {self.n_experts}")
        t = self.per_token
        lines.append(f"predicted per decoded token (residual budget {self.residual_budget:g}):")
        lines.append(f"  GPU reads   {mib(t['gpu_read']):>14s}  (~{t['gpu_ms']:.3f} ms at {self.hardware.gpu_bw_gbps:g} GB/s)")
        lines.append(f"  CPU reads   {mib(t['cpu_read']):>14s}  (~{t['cpu_ms']:.3f} ms at {self.host_bw_gbps:.1f} GB/s)")
        lines.append(f"  bus         {mib(t['bus']):>14s}  (activations only; no weights)")
        if self.crossover_tokens:
            lines.append(f"prefill crossover: an expert whose residual {self.crossover_tokens} or more tokens of a batch "
                         f"need gets the residual copied to the GPU (PCIe {self.hardware.pcie_gbps:g} GB/s) instead of "
                         f"a host GEMM (CPU {self.hardware.cpu_gflops:g} GFLOP/s)")
        else:
            lines.append("prefill crossover: never (the host's GEMM is always cheaper than copying a residual)")
        lines += self.messages
        return "\n".join(lines)


def plan(sizes: ModelSizes, gpu_memory: str | int, n_ctx: int, *, n_batch: int = 512,
         residual_budget: float = umia.PLAN_BUDGET, hardware: Hardware | None = None, n_sessions: int = 1) -> Plan:
    """Places the model on a GPU of ``gpu_memory`` bytes (see the module docstring), with room
    for ``n_sessions`` sessions (each its own KV cache and scratch: Model.fork_session, serving
    several requests at once)."""
    hw = hardware or Hardware()
    budget = parse_bytes(gpu_memory)
    cpu_only = [what for what, has in (
        ("hyper-connections", sizes.hc_count > 0),
        ("QSA sparse attention's indexer", sizes.index_head_dim > 0 and sizes.n_layer_linear > 0),
        ("the sparse attention's lightning indexer", sizes.index_head_dim > 0 and sizes.kv_lora_rank > 0)) if has]
    if cpu_only:
        raise PlanError(f"this model's {' and '.join(cpu_only)} run on the CPU backend only, so no part of it is placed "
                        "on a GPU: run it without a GPU budget")
    if n_ctx <= 0 or n_batch <= 0 or n_sessions <= 0:
        raise InvalidArgumentError(f"n_ctx ({n_ctx}), n_batch ({n_batch}) and n_sessions ({n_sessions}) must be > 0")
    residual_budget = umia.check_budget(residual_budget, allow_auto=False)
    host_bw = hw.host_bandwidth()
    cross = crossover_tokens(sizes, hw, host_bw)
    cap = budget - hw.context_reserve
    tables = lib.rm_device_expert_table_bytes(sizes.n_layer, sizes.n_expert)
    parts = {"dense_weights": sizes.dense_gpu, "expert_tables": tables}
    parts.update({k: n_sessions * v for k, v in session_device_bytes(sizes, n_ctx, n_batch, cross > 0).items()})
    fixed = sum(parts.values())
    if fixed > cap:
        raise PlanError(
            f"a GPU budget of {_size(budget)} cannot hold the dense part: attention, norms, router, shared "
            f"experts and output head ({_size(sizes.dense_gpu)}), the KV cache for {n_ctx} positions "
            f"({_size(parts['kv_cache'])}{'' if n_sessions == 1 else f' for {n_sessions} sessions'}) and scratch "
            f"({_size(parts['activations'] + parts['split_scratch'])}) need {_size(fixed + hw.context_reserve)} with "
            f"the CUDA context's {_size(hw.context_reserve)}; lower n_ctx or n_batch, or run on the CPU")
    # experts, most used first; ties in layer order so the plan is deterministic
    on = np.zeros((sizes.n_layer, sizes.n_expert), dtype=bool)
    order = np.lexsort((np.arange(on.size), -sizes.frequency.ravel()))
    left = cap - fixed
    placeable = np.repeat(sizes.base_gpu_ok, sizes.n_expert)
    base_flat = sizes.expert_base.ravel()
    for i in order:
        if placeable[i] and base_flat[i] <= left:
            on.flat[i] = True
            left -= int(base_flat[i])
    parts["expert_bases"] = int(sizes.expert_base[on].sum())
    parts["context_reserve"] = hw.context_reserve
    messages = []
    n_cpu = int((~on).sum())
    if not sizes.base_gpu_ok.all():
        messages.append(f"{int((~sizes.base_gpu_ok).sum())} layers have expert types the CUDA kernels lack; "
                        "their experts run on the CPU")
    if "recurrent_state" in parts:
        messages.append(f"{sizes.n_layer_linear} of {sizes.n_layer} layers have linear attention (Gated DeltaNet): "
                        f"their recurrent state ({_size(parts['recurrent_state'])}"
                        f"{'' if n_sessions == 1 else f' for {n_sessions} sessions'}) stands in for their KV cache, "
                        "on the GPU with the layers")
    if n_cpu == 0:
        messages.append("every expert base fits on the GPU; the CPU computes only the selected residual products")
    else:
        used = sizes.frequency[~on].sum() / sizes.n_layer
        messages.append(f"{n_cpu} of {on.size} expert bases do not fit and stay on the CPU at base precision: "
                        f"the least used ({'from calibration' if sizes.calibrated else 'uniform usage assumed: no calibration tables'}), "
                        f"{100 * used:.1f}% of expert slots")
    if sizes.dense_host:
        messages.append(f"{sizes.dense_host / 2**20:.1f} MiB of dense matrices have types the CUDA kernels lack "
                        "and run on the CPU")
    per_token = _per_token(sizes, on, residual_budget, n_ctx, host_bw, hw)
    return Plan(budget=budget, cap=cap, gpu_parts=parts, expert_on_gpu=on, residual_budget=residual_budget,
                per_token=per_token, crossover_tokens=cross, host_bw_gbps=host_bw, hardware=hw,
                messages=messages, n_ctx=n_ctx, n_batch=n_batch)


def _per_token(s: ModelSizes, on: np.ndarray, b: float, n_ctx: int, host_bw: float, hw: Hardware) -> dict[str, float]:
    """Expected bytes per decoded token on each side, at half-full context. Slot counts follow the
    frequency table: expert e of layer l is in K * freq[l, e] of a token's slots on average."""
    K = s.n_expert_used
    slots = K * s.frequency                                   # expected slots per (layer, expert)
    gpu_base = float((slots * s.expert_base * on).sum())
    cpu_base = float((slots * s.expert_base * ~on).sum())
    residual = float((b * slots * s.expert_residual).sum())
    kv = s.kv_bytes_per_pos * n_ctx / 2
    gpu_read = s.dense_read - s.dense_host + kv + gpu_base
    cpu_read = s.dense_host + cpu_base + residual + 4 * s.n_embd
    # activations per layer: routing down, and when the host has work the block input down, the
    # fix slots' gate/up down and h' + result up, the host experts' results up
    f, E, F = 4, s.n_embd, s.n_ff_exp
    fix = b * (slots * on).sum(1)                            # per layer
    host = (slots * ~on).sum(1)
    host_work = (fix + host) > 0
    bus_layer = K * 16 + 56 * K + host_work * f * E + fix * f * (2 * F + F + E) + host * f * E
    bus = float(bus_layer.sum()) + f * E + f * s.n_vocab
    return {"gpu_read": gpu_read, "cpu_read": cpu_read, "bus": bus,
            "gpu_ms": 1e3 * gpu_read / (hw.gpu_bw_gbps * 1e9), "cpu_ms": 1e3 * cpu_read / (host_bw * 1e9)}


def plan_files(path: str | os.PathLike, gpu_memory: str | int, n_ctx: int, *, residual: str | os.PathLike | None = "auto",
               n_batch: int = 512, residual_budget: float = umia.PLAN_BUDGET, hardware: Hardware | None = None,
               n_sessions: int = 1) -> Plan:
    return plan(ModelSizes.from_files(path, residual), gpu_memory, n_ctx, n_batch=n_batch,
                residual_budget=residual_budget, hardware=hardware, n_sessions=n_sessions)


# ---------------------------------------------------------------------------------------------
# a model larger than the memory: the experts streamed from the disk (Model(ram_budget=...))
# ---------------------------------------------------------------------------------------------

XC_ALIGN = 4096   # the expert cache reads whole 4 KiB blocks (O_DIRECT): a slot holds each matrix's


@dataclasses.dataclass
class StreamPlan:
    """What streaming the experts within ``budget`` bytes of RAM costs per decoded token: the cache
    holds the units (one expert's base, or its residual) a token uses most (the calibration's
    frequencies; uniform without them), and every other unit a token uses is read from the disk."""

    budget: int
    resident: int               # weights kept in memory: all but the routed experts
    cache: int                  # the expert cache's slots
    slots: int
    units: int                  # units in the files (bases, and residuals with a sidecar)
    hit_rate: float             # expected share of a token's units found in the cache
    disk_bytes: float           # expected bytes read from the disk per decoded token
    compute_bytes: float        # weight bytes a decoded token reads from memory
    disk_bw_gbps: float
    host_bw_gbps: float
    residual_budget: float
    calibrated: bool

    @property
    def disk_ms(self) -> float:
        return self.disk_bytes / self.disk_bw_gbps * 1e-6

    @property
    def compute_ms(self) -> float:
        return self.compute_bytes / self.host_bw_gbps * 1e-6

    @property
    def tok_s(self) -> float:
        """Decode tok/s with the reads after the compute (read-ahead only makes it faster)."""
        return 1e3 / (self.disk_ms + self.compute_ms)

    @property
    def tok_s_overlapped(self) -> float:
        """Decode tok/s with every read under the compute (perfect read-ahead): an upper bound."""
        return 1e3 / max(self.disk_ms, self.compute_ms)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(disk_ms=self.disk_ms, compute_ms=self.compute_ms, tok_s=self.tok_s, tok_s_overlapped=self.tok_s_overlapped)
        return d

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def summary(self) -> str:
        mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
        return "\n".join([
            f"RAM budget {_size(self.budget)}: {_size(self.resident)} resident (all but the routed experts), "
            f"{_size(self.cache)} of expert cache ({self.slots} of {self.units} units)",
            f"predicted per decoded token (residual budget {self.residual_budget:g}; expert use "
            f"{'from the calibration' if self.calibrated else 'uniform: no calibration'}):",
            f"  cache hit rate  {self.hit_rate:.3f}",
            f"  disk reads      {mib(self.disk_bytes):>12s}  (~{self.disk_ms:.1f} ms at {self.disk_bw_gbps:g} GB/s)",
            f"  memory reads    {mib(self.compute_bytes):>12s}  (~{self.compute_ms:.1f} ms at {self.host_bw_gbps:.1f} GB/s)",
            f"  decode          ~{self.tok_s:.1f} tok/s with the reads after the compute, at most "
            f"{self.tok_s_overlapped:.1f} with all of them under it"])


def stream_plan(path: str | os.PathLike, ram_budget: str | int, *, residual: str | os.PathLike | None = "auto",
                residual_budget: float = umia.PLAN_BUDGET, disk_bw_gbps: float = 3.0,
                host_bw_gbps: float | None = None) -> StreamPlan:
    """The cost of running ``path`` (and its sidecar) with ``Model(ram_budget=...)``."""
    path = os.fspath(path)
    if residual == "auto":
        cand = default_residual_path(path)
        residual = cand if os.path.isfile(cand) else None
    s = ModelSizes.from_files(path, residual)
    if s.n_expert <= 0:
        raise InvalidArgumentError(f"{path}: the model has no routed experts to stream")
    if disk_bw_gbps <= 0:
        raise InvalidArgumentError(f"disk bandwidth must be > 0 GB/s, got {disk_bw_gbps}")
    budget = parse_bytes(ram_budget)
    files = os.path.getsize(path) + (os.path.getsize(residual) if residual else 0)
    base, res = s.expert_base.astype(np.float64), s.expert_residual.astype(np.float64)
    resident = files - int(base.sum() + res.sum())
    n_mats = 3
    slot = int(max(base.max(), res.max())) + 2 * XC_ALIGN * n_mats
    cache_room = budget - resident
    if cache_room < s.n_expert_used * slot:
        raise PlanError(f"a RAM budget of {_size(budget)} does not hold the {_size(resident)} of weights that stay in "
                        f"memory and one token's {s.n_expert_used} experts ({_size(s.n_expert_used * slot)})")
    # uses per decoded token of each unit: K slots of each layer, shared by frequency; a residual
    # on the residual budget's share of them
    use_base = s.n_expert_used * s.frequency
    use_res = use_base * residual_budget if residual else np.zeros_like(use_base)
    uses = np.concatenate([use_base.ravel(), use_res.ravel()])
    sizes = np.concatenate([base.ravel(), res.ravel()])
    present = sizes > 0
    uses, sizes = uses[present], sizes[present]
    slots = min(cache_room // slot, uses.size)
    kept = np.zeros(uses.size, dtype=bool)
    kept[np.argsort(-uses, kind="stable")[:slots]] = True   # the cache settles on the most used units
    total_use = float(uses.sum())
    hit = float(uses[kept].sum()) / total_use if total_use else 0.0
    disk = float((uses[~kept] * sizes[~kept]).sum())
    compute = float(s.dense_read + (uses * sizes).sum())
    host_bw = host_bw_gbps if host_bw_gbps else measure_host_bandwidth()
    return StreamPlan(budget=budget, resident=resident, cache=int(slots * slot), slots=int(slots), units=int(uses.size),
                      hit_rate=hit, disk_bytes=disk, compute_bytes=compute, disk_bw_gbps=disk_bw_gbps,
                      host_bw_gbps=host_bw, residual_budget=residual_budget if residual else 0.0,
                      calibrated=s.calibrated)
