"""UMIA: Unified Multi-Level Importance Arbitration of residuals (the policy side; the per-token
decisions run in C, see ``rm_residual_policy`` in rapidmoe.h and docs/UMIA.md).

A slot is one activated (token, layer, expert). Its UMIA score estimates how much the final output
would move if that slot ran its base alone:

    score = layer_sensitivity[l]^c * gate^a * expert_sensitivity[l, e]

- token level: the router weight ``gate`` of the slot (how much of the MoE output it carries);
- expert level: the calibrated mean size of ``f_{B+R}(x) - f_B(x)`` for the expert, normalised so
  that ``gate^a * expert_sensitivity`` averages 1 over a layer's calibration slots;
- layer level: the calibrated KL divergence of the output when only that layer runs base only,
  raised to the power ``c = LAYER_POWER`` (0.5): the KL of a whole layer overstates what its
  low-gate slots are worth once its important slots have their residual (chosen on training text,
  see docs/UMIA.md).

Arbitration: one global threshold over the calibration scores of all layers gives each layer its
share of the budget (spend where it matters most); at run time each layer keeps its own threshold
on that share with an integral controller, so no decision waits for a later layer.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from ._native import check, ffi, lib
from .errors import FormatError, InvalidArgumentError, RapidMoEError
from .metadata import get_float_list, get_int, get_int_list, require

# The policy kinds are rm_policy_kind in rapidmoe.h, read from the library: name -> kind.
KIND = {ffi.string(lib.rm_policy_kind_name(k)).decode(): k for k in range(lib.RM_POLICY_COUNT)}
POLICIES = tuple(KIND)
SCORED = ("umia", "gate", "expert")          # policies whose scores are calibrated per layer
N_QUANTILES = 129
DEFAULT_GAIN = 0.2
LAYER_POWER = 0.5
KEY = "rapidmoe.umia."

# The residual budget: the share of activated (token, expert) slots that get their residual.
DEFAULT_BUDGET = 0.25        # Model, `rapidmoe run/serve/perplexity/bench`, and so the server
PLAN_BUDGET = 0.1            # what `rapidmoe plan` and planner.plan predict for when not told
# residual_budget="auto": where the controller starts and its limits (rm_auto_budget in rapidmoe.h)
AUTO_BUDGET = dict(start=0.05, min_budget=0.0, max_budget=0.5, increase=0.005, decrease=0.7, margin=0.1)


def check_budget(budget: float | str, allow_auto: bool = True) -> float | str:
    """The one check of a residual budget given by a user: a number in [0, 1] (returned as a
    float) or, where allowed, ``"auto"``; InvalidArgumentError otherwise."""
    if allow_auto and budget == "auto":
        return "auto"
    if isinstance(budget, numbers.Real) and 0.0 <= budget <= 1.0:
        return float(budget)
    want = "a number in [0, 1] or 'auto'" if allow_auto else "a number in [0, 1]"
    raise InvalidArgumentError(f"residual budget must be {want}, got {budget!r}")


@dataclasses.dataclass
class Tables:
    """What calibration measured; stored in the sidecar under ``rapidmoe.umia.*``."""

    n_layer: int
    n_expert: int
    expert_sensitivity: np.ndarray   # (n_layer, n_expert), normalised per layer
    layer_sensitivity: np.ndarray    # (n_layer,), KL when the layer runs base only
    expert_frequency: np.ndarray     # (n_layer, n_expert), share of the layer's slots
    quantiles: dict[str, np.ndarray]  # policy -> (n_layer, N_QUANTILES) of log scores
    n_tokens: int

    def layers(self, keep: np.ndarray) -> "Tables":
        """The tables of the layers keep marks."""
        return dataclasses.replace(
            self, n_layer=int(keep.sum()), expert_sensitivity=self.expert_sensitivity[keep],
            layer_sensitivity=self.layer_sensitivity[keep], expert_frequency=self.expert_frequency[keep],
            quantiles={k: q[keep] for k, q in self.quantiles.items()})

    def to_kv(self) -> dict[str, object]:
        kv: dict[str, object] = {
            KEY + "n_tokens": int(self.n_tokens),
            KEY + "shape": [int(self.n_layer), int(self.n_expert)],
            KEY + "expert_sensitivity": self.expert_sensitivity.astype(np.float32).ravel().tolist(),
            KEY + "layer_sensitivity": self.layer_sensitivity.astype(np.float32).tolist(),
            KEY + "expert_frequency": self.expert_frequency.astype(np.float32).ravel().tolist(),
        }
        for name, q in self.quantiles.items():
            kv[KEY + "quantiles." + name] = q.astype(np.float32).ravel().tolist()
        return kv

    @classmethod
    def from_metadata(cls, md: dict) -> "Tables | None":
        if KEY + "shape" not in md:
            return None
        try:
            shape = get_int_list(md, KEY + "shape")
            if len(shape) != 2 or min(shape) <= 0:
                raise FormatError(f"{KEY}shape: expected two positive integers, found {shape}")
            n_layer, n_expert = shape
            f = lambda k: np.asarray(require(get_float_list(md, KEY + k, finite=True), KEY + k),  # noqa: E731
                                     dtype=np.float64)
            return cls(
                n_layer, n_expert,
                f("expert_sensitivity").reshape(n_layer, n_expert),
                f("layer_sensitivity").reshape(n_layer),
                f("expert_frequency").reshape(n_layer, n_expert),
                {p: f("quantiles." + p).reshape(n_layer, N_QUANTILES) for p in SCORED},
                require(get_int(md, KEY + "n_tokens"), KEY + "n_tokens"),
            )
        except (FormatError, ValueError) as exc:
            raise FormatError(f"the sidecar's UMIA tables ({KEY}*) are malformed: {exc}") from exc


def slot_log_scores(policy: str, tables: Tables, layer: int, experts: np.ndarray, gates: np.ndarray,
                    gate_power: float = 1.0) -> np.ndarray:
    """log(score) of slots of one layer with the layer weight at power 1 (as calibration stores
    the quantiles; ``build`` rescales the layer term to LAYER_POWER). The formula is the C one
    (``native_log_scores``) in float64, so that calibration's quantiles keep their precision; a
    test holds the two equal."""
    g = np.log(np.maximum(gates, 1e-30))
    se = np.log(tables.expert_sensitivity[layer, experts])
    if policy == "gate":
        return g
    if policy == "expert":
        return se
    return gate_power * g + se + np.log(tables.layer_sensitivity[layer])


def native_log_scores(policy: str, gate_power: float, expert_score: np.ndarray, layer_score: float,
                      experts: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """log(score) of slots of one layer as a session scores them (rm_policy_log_scores, float32):
    ``expert_score`` the layer's n_expert scores, ``experts``/``gates`` each slot's."""
    es = np.ascontiguousarray(expert_score, dtype=np.float32)
    ex = np.ascontiguousarray(experts, dtype=np.int32)
    g = np.ascontiguousarray(gates, dtype=np.float32)
    out = np.empty(ex.size, dtype=np.float32)
    check(lib.rm_policy_log_scores(KIND[policy], gate_power, ffi.from_buffer("float[]", es), es.size, layer_score,
                                   ffi.from_buffer("int32_t[]", ex), ffi.from_buffer("float[]", g), ex.size,
                                   ffi.from_buffer("float[]", out)))
    return out


def _share_above(q: np.ndarray, t: float) -> np.ndarray:
    """Fraction of each layer's scores >= t, from the layers' quantile rows."""
    p = np.linspace(0.0, 1.0, q.shape[1])
    return np.array([1.0 - np.interp(t, row, p, left=0.0, right=1.0) for row in q])


def allocate(q: np.ndarray, budget: float) -> tuple[float, np.ndarray]:
    """The global threshold T at which the layers' shares above T average to budget, and each
    layer's share. Where T sits on a jump (many slots with equal scores, e.g. one expert's), the
    shares are interpolated between the two sides of the jump, so they still average to budget."""
    lo, hi = float(q.min()) - 1.0, float(q.max()) + 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _share_above(q, mid).mean() > budget:
            lo = mid
        else:
            hi = mid
    s_lo, s_hi = _share_above(q, lo), _share_above(q, hi)
    m_lo, m_hi = s_lo.mean(), s_hi.mean()
    w = (budget - m_hi) / (m_lo - m_hi) if m_lo > m_hi else 0.0
    return 0.5 * (lo + hi), s_hi + w * (s_lo - s_hi)


@dataclasses.dataclass
class PolicyArrays:
    """The arrays handed to rm_session_set_policy."""

    kind: int
    layer_budget: np.ndarray | None = None
    threshold0: np.ndarray | None = None
    expert_score: np.ndarray | None = None
    layer_score: np.ndarray | None = None
    layer_mask: np.ndarray | None = None     # 0: no residual in that layer
    gate_power: float = 1.0
    gain: float = DEFAULT_GAIN

    def spread(self, moe: np.ndarray) -> "PolicyArrays":
        """These arrays, computed for the layers moe marks, over every layer: the others get no
        budget and no residual (they have no slots)."""
        mask = moe.astype(np.uint8) if self.layer_mask is None else _spread(self.layer_mask, moe, 0)
        return dataclasses.replace(
            self, layer_budget=_spread(self.layer_budget, moe, 0.0), threshold0=_spread(self.threshold0, moe, 0.0),
            expert_score=_spread(self.expert_score, moe, 1.0), layer_score=_spread(self.layer_score, moe, 1.0),
            layer_mask=mask)


def _spread(values: np.ndarray | None, moe: np.ndarray, fill: float) -> np.ndarray | None:
    if values is None:
        return None
    out = np.full((moe.size,) + values.shape[1:], fill, dtype=values.dtype)
    out[moe] = values
    return out


def check_policy(policy: str) -> str:
    if policy not in KIND:
        raise InvalidArgumentError(f"unknown residual policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return policy


def moe_layers(info: dict) -> np.ndarray:
    """Which layers have routed experts (the rest, DeepSeek's and GLM's leading dense layers, have
    no slots): a bool per layer, from ``Model.info``."""
    return np.arange(info["n_layer"]) >= info.get("n_layer_dense_lead", 0)


def build(policy: str, budget: float, tables: Tables | None, n_layer: int, n_expert: int,
          moe: np.ndarray | None = None) -> PolicyArrays:
    """The arrays of a policy at a budget already checked by ``check_budget``. ``moe`` (a bool
    per layer, default all) marks the layers with routed experts: the budget is the share of
    their slots, and a layer without experts gets none."""
    check_policy(policy)
    if moe is not None and not moe.all() and policy not in ("none", "all", "random"):
        sub = build(policy, budget, tables and tables.layers(moe), int(moe.sum()), n_expert)
        return sub.spread(moe)
    if policy in ("none", "all"):
        return PolicyArrays(KIND[policy])
    if policy == "random":
        b = np.full(n_layer, budget)
        return PolicyArrays(KIND[policy], b, np.full(n_layer, np.log(max(1.0 - budget, 1e-9))))
    if tables is None:
        raise RapidMoEError(
            f"policy {policy!r} needs calibration tables in the sidecar: run `rapidmoe calibrate MODEL -f TEXT`")
    if (tables.n_layer, tables.n_expert) != (n_layer, n_expert):
        raise RapidMoEError(f"calibration tables are for {tables.n_layer}x{tables.n_expert} experts, "
                            f"the model has {n_layer}x{n_expert}")
    es = tables.expert_sensitivity.astype(np.float32)
    ls = tables.layer_sensitivity.astype(np.float32)
    if policy == "layer":
        # whole layers in order of sensitivity; the boundary layer gets the fractional rest
        share = np.zeros(n_layer)
        left = budget * n_layer
        for layer in np.argsort(-ls, kind="stable"):
            share[layer] = min(1.0, left)
            left -= share[layer]
        # score = log(ls) + u, u ~ U(0, 1): a threshold of log(ls) + 1 - share selects `share`
        return PolicyArrays(KIND[policy], share, np.log(ls) + 1.0 - share, layer_score=ls)
    q = tables.quantiles[policy]
    if policy == "umia":
        lp = np.log(tables.layer_sensitivity)
        q = q + ((LAYER_POWER - 1.0) * lp)[:, None]
        ls = np.exp(LAYER_POWER * lp).astype(np.float32)
    t, share = allocate(q, budget)
    return PolicyArrays(KIND[policy], share, np.full(n_layer, t), expert_score=es, layer_score=ls)
