"""Quality measurement and UMIA calibration.

``perplexity`` follows llama.cpp's perplexity tool: the text is cut into chunks of n_ctx tokens,
each chunk is evaluated from an empty cache, and the second half of each chunk is scored (so
every scored token has at least n_ctx/2 tokens of context). Against a reference (by default the
same model with every residual applied) it also reports the KL divergence of the next-token
distributions and top-1 agreement.

``calibrate`` runs the model over calibration text and measures the tables UMIA scores with
(see umia.py), then stores them in the residual sidecar, atomically.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import umia
from .errors import InvalidArgumentError, RapidMoEError
from .gguf_rewrite import rewrite_with_kv   # callers of this module's have it from here too
from .model import Model


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _chunks(ids: list[int], n_ctx: int, max_chunks: int | None) -> list[list[int]]:
    if n_ctx < 4:
        raise InvalidArgumentError(f"n_ctx must be >= 4 for perplexity, got {n_ctx}")
    n = len(ids) // n_ctx
    if n == 0:
        raise InvalidArgumentError(f"the text has {len(ids)} tokens, fewer than one chunk of {n_ctx}")
    if max_chunks:
        n = min(n, max_chunks)
    return [ids[i * n_ctx:(i + 1) * n_ctx] for i in range(n)]


@dataclasses.dataclass
class PerplexityResult:
    ppl: float
    kld_mean: float | None
    kld_p99: float | None
    top1: float | None
    residual_rate: float
    bytes_per_token: float
    n_tokens: int
    policy: str
    budget: float | str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def perplexity(model: Model, ids: list[int], n_ctx: int, reference: Model | None = None,
               max_chunks: int | None = None, masks: np.ndarray | None = None) -> PerplexityResult:
    """Perplexity of ``model`` (with its current residual policy) over ids, and divergence from
    ``reference`` when given. ``masks`` (n_chunk, n_ctx, n_layer, n_expert_used): a given
    selection per chunk instead of the policy (``Model.set_residual_mask``; the oracle's)."""
    nll, kls, agree = [], [], []
    model.clear_stats()
    for i, chunk in enumerate(_chunks(ids, n_ctx, max_chunks)):
        if masks is not None:
            model.set_residual_mask(masks[i])
        first = n_ctx // 2
        lp = _log_softmax(model.eval_logits(chunk)[first - 1:-1].astype(np.float64))
        targets = np.asarray(chunk[first:])
        nll.append(-lp[np.arange(len(targets)), targets])
        if reference is not None:
            lr = _log_softmax(reference.eval_logits(chunk)[first - 1:-1].astype(np.float64))
            kls.append((np.exp(lr) * (lr - lp)).sum(-1))
            agree.append(lr.argmax(-1) == lp.argmax(-1))
    if masks is not None:
        model.set_residual_mask(None)
    nll = np.concatenate(nll)
    rate = model.stats()["residual_rate"]
    kl = np.concatenate(kls) if kls else None
    return PerplexityResult(
        ppl=float(np.exp(nll.mean())),
        kld_mean=float(kl.mean()) if kl is not None else None,
        kld_p99=float(np.percentile(kl, 99)) if kl is not None else None,
        top1=float(np.concatenate(agree).mean()) if agree else None,
        residual_rate=rate,
        bytes_per_token=model.bytes_per_token(rate),
        n_tokens=int(nll.size),
        policy=model.residual_policy,
        budget=model.residual_budget,
    )


# -- calibration ---------------------------------------------------------------------------------

def measure_tables(model: Model, ids: list[int], n_ctx: int = 256, max_tokens: int = 4096,
                   gate_power: float = 1.0) -> umia.Tables:
    """Runs ``model`` (it must have a residual sidecar) over ids and measures UMIA's tables."""
    if model.residual_path is None:
        raise RapidMoEError("calibration needs the residual sidecar beside the base file")
    L, X = model.info["n_layer"], model.info["n_expert"]
    moe = umia.moe_layers(model.info)   # leading dense layers have no slots: their rows stay neutral
    ids = ids[:max_tokens]
    chunks = _chunks(ids, n_ctx, None)

    # 1. expert level: |f_{B+R}(x) - f_B(x)| per (layer, expert), and every slot's gate, read
    #    back from the route log after each chunk.
    model.set_residual("all")
    model.clear_stats()
    model.set_calibration(True)
    slots_e, slots_g = [], []
    try:
        for chunk in chunks:
            model.eval_logits(chunk)
            exp, gates = model.route_log()
            slots_e.append(exp)
            slots_g.append(gates)
        delta, count = model.calibration()
    finally:
        model.set_calibration(False)
    active = model.stats()["active"].astype(np.float64)
    count = count.astype(np.float64)
    sens = np.where(count > 0, delta / np.maximum(count, 1), np.nan)
    for layer in range(L):  # experts never seen take their layer's mean
        row = sens[layer]
        row[np.isnan(row)] = np.nanmean(row) if np.isfinite(row).any() else 1.0
    se = np.concatenate(slots_e)    # (tokens, layer, slot)
    sg = np.concatenate(slots_g)
    sens[~moe] = 1.0
    for layer in np.flatnonzero(moe):  # normalise: gate^a * s_e averages 1 over the layer's slots
        m = np.mean(sg[:, layer] ** gate_power * sens[layer][se[:, layer]])
        sens[layer] /= max(m, 1e-30)
    sens = np.maximum(sens, 1e-12)
    freq = active / np.maximum(active.sum(1, keepdims=True), 1)

    # 2. layer level: KL of the output when only that layer runs base only
    ref = [_log_softmax(model.eval_logits(c).astype(np.float64)) for c in chunks]
    layer_kl = np.zeros(L)
    for layer in np.flatnonzero(moe):
        mask = np.ones(L, np.uint8)
        mask[layer] = 0
        model.set_layer_mask("all", mask)
        kl = [(np.exp(r) * (r - _log_softmax(model.eval_logits(c).astype(np.float64)))).sum(-1).mean()
              for c, r in zip(chunks, ref)]
        layer_kl[layer] = max(float(np.mean(kl)), 1e-12)
    model.set_residual("all")

    # 3. the score distribution of every scored policy, per layer
    tables = umia.Tables(L, X, sens, layer_kl, freq, {}, int(se.shape[0]))
    qs = np.linspace(0.0, 1.0, umia.N_QUANTILES)
    for policy in umia.SCORED:
        rows = []
        for layer in range(L):
            if not moe[layer]:
                rows.append(np.zeros_like(qs))
                continue
            sc = umia.slot_log_scores(policy, tables, layer, se[:, layer].ravel(), sg[:, layer].ravel(),
                                      gate_power)
            rows.append(np.quantile(sc, qs))
        tables.quantiles[policy] = np.stack(rows)
    return tables


def store_tables(residual_file: str, tables: umia.Tables) -> None:
    """Stores UMIA's tables in the sidecar (atomically)."""
    rewrite_with_kv(residual_file, tables.to_kv())


def calibrate(base_path: str, text: str, n_ctx: int = 256, max_tokens: int = 4096,
              n_threads: int = 0) -> umia.Tables:
    """Measures UMIA's tables for a RESplit pair on text and stores them in its sidecar."""
    with Model(base_path, n_ctx=n_ctx, n_threads=n_threads, residual_policy="all") as m:
        if m.residual_path is None:
            raise RapidMoEError(f"{base_path}: no residual sidecar to calibrate")
        ids = m.tokenize(text, add_special=False)
        tables = measure_tables(m, ids, n_ctx=n_ctx, max_tokens=max_tokens)
        sidecar = m.residual_path
    store_tables(sidecar, tables)
    return tables
