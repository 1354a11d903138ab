#!/usr/bin/env python3
"""Per-token error estimates tried in UMIA's score (docs/UMIA.md, "Tried and not kept").

    python tools/umia_token_scores.py [--chunks 24] [--calib-chunks 8] [--more-chunks 96]
                                      [--other /usr/share/common-licenses/GPL-3] [--fixed-shares]

UMIA scores a slot by its router weight g and its expert's mean error s[l, e]. This tool asks
whether a per-token estimate of the error, ``‖R x‖`` for the slot's input x, says which of a
layer's slots matter. The estimates, each the slot's value over its expert's calibration mean,
multiply UMIA's score (score = λ^0.5 · g · s[l, e] · ρ^p):

- ``sketch r``: ‖S_r V_rᵀ x‖² summed over the gate and up residuals, S_r V_rᵀ the first r rows of
  the SVD of the dequantized residual (what a sidecar would store: r · n_embd floats per matrix);
- ``exact gate/up``: ‖R_gate x‖² + ‖R_up x‖², the sketch at full rank;
- ``exact error``: ‖f_{B+R}(x) − f_B(x)‖, the error itself (what running the residual would tell;
  the best any estimate of the local error can do).

And, not causal, ``sensitivity``: g · ‖f_{B+R}(x) − f_B(x)‖ · ‖∂KL/∂y_l(t)‖, the twin's gradient
of the KL at base only with respect to the layer's MoE output at the token: how much the token's
error matters downstream.

Every feature comes from the oracle's f32 twin with every residual (rapidmoe_gguf/oracle.py); the
selection is UMIA's arbitration run offline (one global threshold over the calibration slots'
scores, then each layer's integral controller, gain 0.2, token by token), measured by the runtime
with that selection (``Model.set_residual_mask``), against every residual. Calibration: held-out
chunks after the --chunks evaluated ones; the evaluated texts: those --chunks, the --more-chunks
after the calibration chunks, and --other (text of another kind), never calibrated on. With
--fixed-shares each layer's share of the budget is UMIA's and the score only ranks within a layer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rapidmoe_gguf as rm  # noqa: E402
from rapidmoe_gguf import oracle, umia  # noqa: E402
from rapidmoe_gguf.bundled import bundled_heldout_path, bundled_model_path  # noqa: E402
from rapidmoe_gguf.evaluate import perplexity  # noqa: E402

RANKS = (4, 8, 16)
BUDGETS = (0.05, 0.1, 0.25)


class RecordingPair(oracle.TorchPair):
    """The twin, recording each slot's router weight, expert, error and residual sizes."""

    def __init__(self, base_path: str, residual_path: str):
        import torch

        super().__init__(base_path, residual_path)
        self.sketch = []    # per layer, per matrix: (expert, max rank, n_embd), rows of S V^T
        for L in self.layers:
            d = {}
            for mat in ("gate", "up"):
                base, full = L["experts"][mat]
                _, s, vh = torch.linalg.svd(full - base, full_matrices=False)
                d[mat] = s[:, :max(RANKS), None] * vh[:, :max(RANKS)]
            self.sketch.append(d)
        self.record = None
        self.inputs = []

    def _moe(self, h, L, m):
        import torch

        out = super()._moe(h, L, m)
        if self.record is None:
            return out
        il = next(i for i, layer in enumerate(self.layers) if layer is L)
        self.inputs.append(h.detach().norm(dim=-1).numpy())
        p = (h @ L["router"].T).softmax(-1)
        w, idx = p.topk(self.k, -1)
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        T = h.shape[0]
        rec = {k: np.zeros((T, self.k)) for k in ["error", "exact"] + [f"sketch{r}" for r in RANKS]}
        (gb, gw), (ub, uw), (db, dw) = (L["experts"][n] for n in ("gate", "up", "down"))
        silu = torch.nn.functional.silu
        with torch.no_grad():
            for e in range(self.n_expert):
                tok, slot = torch.nonzero(idx == e, as_tuple=True)
                if tok.numel() == 0:
                    continue
                x = h[tok]
                fb = (silu(x @ gb[e].T) * (x @ ub[e].T)) @ db[e].T
                fw = (silu(x @ gw[e].T) * (x @ uw[e].T)) @ dw[e].T
                t, s = tok.numpy(), slot.numpy()
                rec["error"][t, s] = (fw - fb).norm(dim=-1).numpy()
                rec["exact"][t, s] = ((x @ (gw[e] - gb[e]).T).pow(2).sum(-1) + (x @ (uw[e] - ub[e]).T).pow(2).sum(-1)).numpy()
                z2 = (x @ self.sketch[il]["gate"][e].T).pow(2) + (x @ self.sketch[il]["up"][e].T).pow(2)
                for r in RANKS:
                    rec[f"sketch{r}"][t, s] = z2[:, :r].sum(-1).numpy()
        rec["g"], rec["e"] = w.detach().numpy(), idx.numpy()
        if out.requires_grad:
            out.retain_grad()
        self.record.append((rec, out))
        return out


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def correlations(f: dict) -> str:
    """Per layer, over the scored tokens: how much the token's sensitivity varies (its coefficient
    of variation) and its Spearman correlation with causal features."""
    first = f["g"].shape[1] // 2
    sl = slice(first - 1, -1)
    out = []
    for layer in range(f["g"].shape[2]):
        y = f["token_sensitivity"][:, sl, layer].ravel()
        feats = {"previous entropy": f["previous_entropy"][:, sl], "top router weight": f["g"][:, sl, layer, 0],
                 "input norm": f["input_norm"][:, sl, layer]}
        out.append(f"layer {layer}: cv {y.std() / y.mean():.2f}, " + ", ".join(
            f"{k} {_spearman(v.ravel(), y):+.2f}" for k, v in feats.items()))
    return "; ".join(out)


def features(pair: RecordingPair, chunks: list[list[int]]) -> dict[str, np.ndarray]:
    """Each slot's features, (chunk, token, layer, slot), and the token's downstream sensitivity."""
    import torch

    per_chunk = []
    first = len(chunks[0]) // 2
    for chunk in chunks:
        T = len(chunk)
        pair.record = []
        with torch.no_grad():
            full = pair.logits(chunk, torch.ones(T, pair.n_layer, pair.k)).log_softmax(-1)
            lr = full[first - 1:-1]
        pair.record, pair.inputs = [], []
        lq = pair.logits(chunk, torch.zeros(T, pair.n_layer, pair.k, requires_grad=True))[first - 1:-1].log_softmax(-1)
        (lr.exp() * (lr - lq)).sum().backward()
        recs = pair.record
        pair.record = None
        f = {k: np.stack([r[k] for r, _ in recs], 1) for k in recs[0][0]}
        sens = np.stack([o.grad.norm(dim=-1).numpy() for _, o in recs], 1)[..., None]
        f["sensitivity"] = f["g"] * f["error"] * np.maximum(sens, 1e-30)
        f["token_sensitivity"] = sens[..., 0]
        ent = -(full.exp() * full).sum(-1).numpy()          # the prediction's entropy at each position
        f["previous_entropy"] = np.concatenate([[0.0], ent[:-1]])
        f["input_norm"] = np.stack([h for h in pair.inputs], 1)
        per_chunk.append(f)
    return {k: np.stack([f[k] for f in per_chunk]) for k in per_chunk[0]}


ESTIMATES = {"umia": None, **{f"sketch {r}": f"sketch{r}" for r in RANKS}, "exact gate/up": "exact",
             "exact error": "error"}


def log_scores(name: str, f: dict, calib: dict, tables: umia.Tables) -> np.ndarray:
    """UMIA's log score of every slot of f, times the estimate over its expert's calibration mean."""
    if name == "sensitivity":
        return np.log(f["sensitivity"])
    L = f["g"].shape[2]
    lay = np.arange(L)[None, None, :, None]
    s = umia.LAYER_POWER * np.log(tables.layer_sensitivity)[lay] + np.log(np.maximum(f["g"], 1e-30)) \
        + np.log(tables.expert_sensitivity)[lay, f["e"]]
    key = ESTIMATES[name]
    if key is None:
        return s
    mean = np.ones((L, tables.n_expert))
    for layer in range(L):
        for e in range(tables.n_expert):
            on = calib["e"][:, :, layer] == e
            mean[layer, e] = calib[key][:, :, layer][on].mean() if on.any() else np.nan
        mean[layer, np.isnan(mean[layer])] = np.nanmean(mean[layer])
    power = 0.5 if key != "error" else 1.0    # squared norms for the residual sizes
    return s + power * (np.log(np.maximum(f[key], 1e-30)) - np.log(mean[lay, f["e"]]))


def select(score: np.ndarray, calib_score: np.ndarray, umia_calib: np.ndarray, budget: float, k: int,
           fixed_shares: bool) -> np.ndarray:
    """UMIA's arbitration of the scores: the global threshold over the calibration scores (or
    UMIA's layer shares with fixed_shares), then each layer's integral controller."""
    qs = np.linspace(0.0, 1.0, umia.N_QUANTILES)
    L = score.shape[2]
    quant = lambda s: np.stack([np.quantile(s[:, :, layer].ravel(), qs) for layer in range(L)])  # noqa: E731
    t, share = umia.allocate(quant(calib_score), budget)
    tau = np.full(L, t)
    if fixed_shares:
        _, share = umia.allocate(quant(umia_calib), budget)
        tau = np.array([np.quantile(calib_score[:, :, layer].ravel(), 1.0 - share[layer]) for layer in range(L)])
    sel = np.zeros(score.shape, np.uint8)
    for c in range(score.shape[0]):
        for i in range(score.shape[1]):
            on = score[c, i] >= tau[:, None]
            sel[c, i] = on
            tau += umia.DEFAULT_GAIN * (on.sum(1) - share * k)
    return sel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=24, help="evaluated chunks at the start of the held-out text")
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--more-chunks", type=int, default=96, help="evaluated chunks after the calibration ones")
    ap.add_argument("--other", default="/usr/share/common-licenses/GPL-3", help="text of another kind")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--fixed-shares", action="store_true", help="UMIA's layer shares; the score ranks within a layer")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    path = bundled_model_path()
    n = args.ctx
    with rm.Model(path, n_ctx=n, n_threads=1) as m, rm.Model(path, n_ctx=n, n_threads=1) as ref:
        ref.set_residual("all")
        pair = RecordingPair(path, m.residual_path)
        held = m.tokenize(Path(bundled_heldout_path()).read_text(encoding="utf-8"), add_special=False)
        other = m.tokenize(Path(args.other).read_text(encoding="utf-8"), add_special=False)
        cut = lambda ids, c0, c: [ids[i * n:(i + 1) * n] for i in range(c0, min(c0 + c, len(ids) // n))]  # noqa: E731
        c1 = args.chunks + args.calib_chunks
        calib = features(pair, cut(held, args.chunks, args.calib_chunks))
        texts = [("held-out", cut(held, 0, args.chunks)), ("held-out, more", cut(held, c1, args.more_chunks)),
                 (Path(args.other).name, cut(other, 0, len(other) // n))]
        names = list(ESTIMATES) + ["sensitivity"]
        cal = {name: log_scores(name, calib, calib, m.umia_tables) for name in names}
        K = m.info["n_expert_used"]
        for label, chunks in texts:
            if not chunks:
                continue
            ids = [t for c in chunks for t in c]
            f = features(pair, chunks)
            print(f"{label}: the token's sensitivity ||dKL/dy_l(t)||: {correlations(f)}", flush=True)
            m.set_residual("none")
            none = perplexity(m, ids, n, reference=ref).kld_mean
            for b in BUDGETS:
                m.set_residual("umia", b)
                shipped = perplexity(m, ids, n, reference=ref).kld_mean
                out = [f"UMIA as shipped {1 - shipped / none:.0%}"]
                for name in names:
                    sel = select(log_scores(name, f, calib, m.umia_tables), cal[name], cal["umia"], b, K,
                                 args.fixed_shares)
                    r = perplexity(m, ids, n, reference=ref, masks=sel)
                    out.append(f"{name} {1 - r.kld_mean / none:.0%}")
                print(f"{label} ({len(chunks)} chunks) b={b:g}: " + " | ".join(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
