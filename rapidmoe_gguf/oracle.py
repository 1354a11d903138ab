"""The residual oracle: the selection of (token, layer, slot) residuals that minimises the KL
divergence from a reference at a given budget, using what a causal runtime cannot know (the whole
text, the reference's outputs, gradients). An upper reference for UMIA (docs/UMIA.md, "The oracle").

Two engines work together:

- ``TorchPair``: an f32 torch twin of a RESplit pair, from the GGUF files themselves (every tensor
  dequantized with gguf.quants; the experts once as base ``B`` and once as ``B + R``), for the
  Qwen3-MoE layer (per-head q/k RMSNorm, NEOX RoPE) and the Mixtral one (GGUF architecture
  ``llama``: no q/k norm, interleaved RoPE on the converter's permuted q/k rows, the chosen
  experts weighted by a softmax over their logits). Each slot's
  expert output is ``f_B(x) + m · (f_{B+R}(x) − f_B(x))`` with a mixing variable ``m``: m = 0 is
  base only, m = 1 the residual, and the gradient of the KL with respect to every m comes from one
  backward pass.
- the C runtime with a given selection (``Model.set_residual_mask``): every candidate is measured
  there, exactly as the tables measure the policies.

The search (``search``): start from the top slots by first-order gain (the gradient at base only,
and at the uniform point m = b; the better of the two as measured), then repeat: take the gradient
at the current selection, swap the selected slots that are cheapest to drop for the unselected ones
with the largest estimated gain, as many pairs as the estimate says pay, and keep the swap if the
measured KL drops (else try half as many). The budget holds within each group of positions
(default: the unscored context half and the scored half of every chunk, so the oracle cannot
move the budget from the context it does not score to the tokens it does).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .errors import InvalidArgumentError, RapidMoEError

SUPPORTED_ARCHS = ("qwen3moe", "llama")


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dev dependency
        raise RapidMoEError("the oracle needs torch (pip install torch)") from exc
    return torch


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# -- the f32 torch twin -------------------------------------------------------------------------

class TorchPair:
    """A RESplit pair (base GGUF + residual sidecar) as f32 torch tensors, for gradients."""

    def __init__(self, base_path: str, residual_path: str):
        import gguf
        from gguf.quants import dequantize

        torch = _torch()
        rb, rr = gguf.GGUFReader(base_path), gguf.GGUFReader(residual_path)
        arch = rb.fields["general.architecture"].contents()
        if arch not in SUPPORTED_ARCHS:
            raise RapidMoEError(f"TorchPair: {base_path}: architecture {arch!r} is not one the oracle models "
                                f"({', '.join(SUPPORTED_ARCHS)})")

        def kv(key, default=None):
            f = rb.fields.get(f"{arch}.{key}")
            return f.contents() if f is not None else default

        if kv("expert_count") is None:
            raise RapidMoEError(f"TorchPair: {base_path}: {arch!r} without experts: the oracle needs a MoE")

        def tensors(reader):
            return {t.name: torch.from_numpy(np.array(
                dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)]), dtype=np.float32))
                for t in reader.tensors}

        t, res = tensors(rb), tensors(rr)
        self.n_layer = kv("block_count")
        self.n_head, self.n_head_kv = kv("attention.head_count"), kv("attention.head_count_kv")
        self.head_dim = kv("attention.key_length", t["blk.0.attn_q.weight"].shape[0] // self.n_head)
        self.n_expert, self.k = kv("expert_count"), kv("expert_used_count")
        self.eps, self.theta = kv("attention.layer_norm_rms_epsilon"), kv("rope.freq_base", 10000.0)
        # the runtime's defaults (native/src/model/arch.c): both renormalise the top-k unless told otherwise
        self.norm_topk = bool(kv("expert_weights_norm", True))
        self.qk_norm = arch == "qwen3moe"
        self.rope_neox = arch == "qwen3moe"     # llama: adjacent pairs rotate together
        if kv("rope.dimension_count", self.head_dim) != self.head_dim:
            raise RapidMoEError(f"TorchPair: {base_path}: partial RoPE is not modelled")
        self.embd = t["token_embd.weight"]
        self.out_norm = t["output_norm.weight"]
        self.output = t.get("output.weight", self.embd)
        self.layers = []
        for il in range(self.n_layer):
            p = lambda n: t[f"blk.{il}.{n}.weight"]  # noqa: E731
            experts = {}
            for mat in ("gate", "up", "down"):
                name = f"blk.{il}.ffn_{mat}_exps"
                base = t[name + ".weight"]
                r = res.get(name + ".residual")
                if r is None:
                    raise RapidMoEError(f"TorchPair: {residual_path}: no residual {name}.residual")
                experts[mat] = (base, base + r)    # (expert, out, in)
            qk = dict(q_norm=p("attn_q_norm"), k_norm=p("attn_k_norm")) if self.qk_norm else {}
            self.layers.append(dict(attn_norm=p("attn_norm"), q=p("attn_q"), k=p("attn_k"), v=p("attn_v"),
                                    o=p("attn_output"), ffn_norm=p("ffn_norm"), router=p("ffn_gate_inp"),
                                    experts=experts, **qk))

    def _rms(self, x, w):
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * w

    def _attention(self, x, L):
        torch = _torch()
        T, D = x.shape[0], self.head_dim
        q = (x @ L["q"].T).view(T, self.n_head, D)
        k = (x @ L["k"].T).view(T, self.n_head_kv, D)
        if self.qk_norm:
            q, k = self._rms(q, L["q_norm"]), self._rms(k, L["k_norm"])
        v = (x @ L["v"].T).view(T, self.n_head_kv, D)
        inv = self.theta ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
        ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]      # (T, D/2)
        if self.rope_neox:
            # NEOX rope: element i rotates with element i + D/2
            cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

            def rope(a):
                a1, a2 = a[..., : D // 2], a[..., D // 2:]
                return a * cos + torch.cat([-a2, a1], -1) * sin
        else:
            # interleaved rope: element 2i rotates with element 2i + 1
            cos, sin = ang.cos()[:, None], ang.sin()[:, None]

            def rope(a):
                a0, a1 = a[..., 0::2], a[..., 1::2]
                return torch.stack([a0 * cos - a1 * sin, a0 * sin + a1 * cos], -1).flatten(-2)

        q, k = rope(q), rope(k)
        rep = self.n_head // self.n_head_kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return torch.einsum("hts,shd->thd", att, v).reshape(T, -1) @ L["o"].T

    def _moe(self, h, L, m, margins=None):
        """h: (T, n_embd); m: (T, k) mixing of each slot (0 base, 1 base + residual); margins: a
        list that gets, per token, the router logit gap between the k-th and the next expert."""
        torch = _torch()
        logits = h @ L["router"].T
        if margins is not None:
            top = logits.topk(self.k + 1, -1).values
            margins.append((top[:, self.k - 1] - top[:, self.k]).detach())
        p = logits.softmax(-1)
        w, idx = p.topk(self.k, -1)          # sorted by weight, as the runtime's slots are
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        (gb, gw), (ub, uw), (db, dw) = (L["experts"][n] for n in ("gate", "up", "down"))
        for e in range(self.n_expert):
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            xe = h[tok]
            fb = (torch.nn.functional.silu(xe @ gb[e].T) * (xe @ ub[e].T)) @ db[e].T
            fw = (torch.nn.functional.silu(xe @ gw[e].T) * (xe @ uw[e].T)) @ dw[e].T
            y = fb + m[tok, slot, None] * (fw - fb)
            out = out.index_add(0, tok, w[tok, slot, None] * y)
        return out

    def logits(self, ids, m, margins=None):
        """Logits (T, n_vocab) of a fresh sequence ids with slot mixing m: (T, n_layer, k).
        margins: a list that gets one (T,) tensor per layer, the router's gap at the k-th expert
        (a near-zero gap is a near-tie that the runtime's rounding may resolve the other way)."""
        torch = _torch()
        x = self.embd[torch.as_tensor(np.asarray(ids), dtype=torch.long)]
        for il, L in enumerate(self.layers):
            x = x + self._attention(self._rms(x, L["attn_norm"]), L)
            x = x + self._moe(self._rms(x, L["ffn_norm"]), L, m[:, il], margins)
        return self._rms(x, self.out_norm) @ self.output.T


# -- the problem and the search -----------------------------------------------------------------

@dataclasses.dataclass
class Problem:
    """Text cut into chunks of n_ctx (scored as ``evaluate.perplexity`` scores them: the
    predictions at positions n_ctx/2 - 1 .. n_ctx - 2) and the reference's log-probabilities there."""

    chunks: list[list[int]]
    ref_lp: list[np.ndarray]       # per chunk: (n_ctx/2, n_vocab) float32
    n_layer: int
    k: int

    @property
    def n_ctx(self) -> int:
        return len(self.chunks[0])

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    def groups(self) -> np.ndarray:
        """The budget group of each slot, shape (n_chunk, n_ctx, n_layer, k): 0 the context
        positions whose predictions are not scored, 1 the rest."""
        g = (np.arange(self.n_ctx) >= self.first - 1).astype(np.int8)
        return np.broadcast_to(g[None, :, None, None], (len(self.chunks), self.n_ctx, self.n_layer, self.k)).copy()


def _scored_lp(model, chunk: list[int], first: int) -> np.ndarray:
    """model's log-probabilities at a chunk's scored positions, computed in f64 and kept in f32
    (as the reference's): the measured side is rounded as the reference is, so an output equal to
    the reference's bit for bit is at KL 0 exactly, not at the rounding's +-1e-8 (which differs
    with the kernel set)."""
    return _log_softmax(model.eval_logits(chunk)[first - 1:-1].astype(np.float64)).astype(np.float32)


def make_problem(reference, ids: list[int], n_ctx: int, max_chunks: int | None, n_layer: int, k: int) -> Problem:
    """The chunks of ids and the log-probabilities of ``reference`` (a Model with its policy set)."""
    from .evaluate import _chunks

    chunks = _chunks(ids, n_ctx, max_chunks)
    ref = [_scored_lp(reference, c, n_ctx // 2) for c in chunks]
    return Problem(chunks, ref, n_layer, k)


def chunk_kl(model, problem: Problem, sel: np.ndarray, c: int) -> float:
    """Sum over chunk c's scored tokens of KL(reference || model with selection sel[c])."""
    model.set_residual_mask(sel[c])
    lq = _scored_lp(model, problem.chunks[c], problem.first).astype(np.float64)
    lr = problem.ref_lp[c].astype(np.float64)
    return float((np.exp(lr) * (lr - lq)).sum())


def measured_kl(model, problem: Problem, sel: np.ndarray) -> float:
    """Mean KL(reference || model with selection sel) over the scored tokens, measured by the
    runtime. sel: (n_chunk, n_ctx, n_layer, k) of 0/1."""
    total = sum(chunk_kl(model, problem, sel, c) for c in range(len(problem.chunks)))
    model.set_residual_mask(None)
    return total / sum(r.shape[0] for r in problem.ref_lp)


def twin_reference(pair: TorchPair, problem: Problem) -> list[np.ndarray]:
    """The twin's own log-probabilities with every residual (m = 1) at the scored positions."""
    torch = _torch()
    first = problem.first
    with torch.no_grad():
        return [pair.logits(c, torch.ones(len(c), problem.n_layer, problem.k))[first - 1:-1].log_softmax(-1).numpy()
                for c in problem.chunks]


def kl_gradient(pair: TorchPair, problem: Problem, m: np.ndarray, ref_lp: list[np.ndarray] | None = None) -> np.ndarray:
    """d mean-KL / d m for every slot, from the torch twin: m (n_chunk, n_ctx, n_layer, k); the
    KL from ref_lp (default the problem's reference)."""
    torch = _torch()
    ref_lp = problem.ref_lp if ref_lp is None else ref_lp
    n_tok = sum(r.shape[0] for r in ref_lp)
    first = problem.first
    grads = np.zeros_like(m, dtype=np.float64)
    for c, chunk in enumerate(problem.chunks):
        mt = torch.tensor(m[c], dtype=torch.float32, requires_grad=True)
        lq = pair.logits(chunk, mt)[first - 1:-1].log_softmax(-1)
        lr = torch.from_numpy(ref_lp[c])
        kl = (lr.exp() * (lr - lq)).sum() / n_tok
        kl.backward()
        grads[c] = mt.grad.numpy()
    return grads


def _top_per_group(score: np.ndarray, groups: np.ndarray, quota: dict[int, int]) -> np.ndarray:
    """1 for the quota[g] highest-scoring slots of each group g."""
    sel = np.zeros(score.shape, np.uint8)
    fs, fg, out = score.ravel(), groups.ravel(), sel.reshape(-1)
    for g, q in quota.items():
        idx = np.flatnonzero(fg == g)
        if q > 0:
            out[idx[np.argsort(-fs[idx], kind="stable")[:q]]] = 1
    return sel


def quotas(groups: np.ndarray, budget: float) -> dict[int, int]:
    """Slots each group may select: round(budget * its size)."""
    return {int(g): int(round(budget * np.count_nonzero(groups == g))) for g in np.unique(groups)}


@dataclasses.dataclass
class SearchResult:
    selection: np.ndarray          # (n_chunk, n_ctx, n_layer, k) uint8
    kl: float                      # measured
    trace: list[tuple[str, float]]  # (step, measured KL) of every accepted candidate
    n_gradients: int
    n_measurements: int


def search(model, pair: TorchPair, problem: Problem, budget: float, iterations: int = 2, relaxed: int = 6,
           polish: int = 300, groups: np.ndarray | None = None, tries: int = 4, twin_target: bool = True,
           log=None) -> SearchResult:
    """The oracle's selection at ``budget`` (see the module docstring). twin_target: the gradients
    are of the KL from the twin's own all-residual output (else from the problem's reference)."""
    if not 0.0 <= budget <= 1.0:
        raise InvalidArgumentError(f"oracle budget must be in [0, 1], got {budget!r}")
    groups = problem.groups() if groups is None else groups
    quota = quotas(groups, budget)
    shape = groups.shape
    n_grad = n_meas = 0
    trace: list[tuple[str, float]] = []

    def measure(sel, what):
        nonlocal n_meas
        n_meas += 1
        kl = measured_kl(model, problem, sel)
        if log:
            log(f"  {what}: KL {kl:.6f}")
        return kl

    target = twin_reference(pair, problem) if twin_target else None
    best, best_kl = None, math.inf
    for name, m0 in (("gradient at base only", np.zeros(shape)), (f"gradient at m = {budget:g}", np.full(shape, budget))):
        if budget in (0.0, 1.0):
            break
        g = kl_gradient(pair, problem, m0, target)
        n_grad += 1
        sel = _top_per_group(-g, groups, quota)
        kl = measure(sel, name)
        if kl < best_kl:
            best, best_kl = sel, kl
    if best is None:   # budget 0 or 1: one selection
        best = np.full(shape, np.uint8(budget == 1.0))
        best_kl = measure(best, "the only selection")
    trace.append(("start", best_kl))

    if 0.0 < budget < 1.0:
        # Frank-Wolfe on the relaxation m in [0, 1], sum of m per group = quota: each step moves
        # m towards the selection the gradient at m prefers; each iterate rounded to its top
        # slots is a candidate.
        m = best.astype(np.float64)
        for it in range(relaxed):
            g = kl_gradient(pair, problem, m, target)
            n_grad += 1
            step = 2.0 / (it + 3.0)
            m = (1.0 - step) * m + step * _top_per_group(-g, groups, quota)
            sel = _top_per_group(m - 1e-9 * g / (np.abs(g).max() + 1e-30), groups, quota)
            kl = measure(sel, f"relaxed step {it + 1}")
            if kl < best_kl:
                best, best_kl = sel, kl
                trace.append((f"relaxed step {it + 1}", kl))
    for it in range(iterations if 0.0 < budget < 1.0 else 0):
        # swaps: the selected slots cheapest to drop for the unselected with the largest gain
        g = kl_gradient(pair, problem, best.astype(np.float64), target)
        n_grad += 1
        cand = _swaps(best, g, groups, quota)
        improved, tried = False, set()
        for t in range(tries):
            sel = cand(0.5 ** (2 * t + 2))
            if sel is None or sel.tobytes() in tried:
                continue
            tried.add(sel.tobytes())
            kl = measure(sel, f"swap round {it + 1}, {0.5 ** (2 * t + 2):g} of the paying pairs")
            if kl < best_kl:
                best, best_kl, improved = sel, kl, True
                trace.append((f"swap round {it + 1}", kl))
                break
        if not improved:
            break
    if 0.0 < budget < 1.0 and polish > 0:
        best, best_kl, ng, nm = _polish(model, pair, problem, best, groups, target, polish, trace, log)
        n_grad, n_meas = n_grad + ng, n_meas + nm
    return SearchResult(best, best_kl, trace, n_grad, n_meas)


def _polish(model, pair, problem: Problem, best: np.ndarray, groups: np.ndarray, target, limit: int, trace, log):
    """Single swaps (one selected slot out, one unselected slot of its group in), in order of their
    estimated change from one gradient, each measured on the chunks it touches and kept when it
    lowers the KL; a swap whose slots an earlier kept swap moved is skipped. A new gradient and
    list after a pass that kept any, until ``limit`` chunk evaluations or a pass with no gain."""
    n_tok = sum(r.shape[0] for r in problem.ref_lp)
    per_chunk = np.array([chunk_kl(model, problem, best, c) for c in range(len(problem.chunks))])
    n_grad, n_meas = 0, len(problem.chunks)
    chunk_of = np.broadcast_to(np.arange(best.shape[0])[:, None, None, None], best.shape).ravel()
    flat, fg = best.ravel().copy(), groups.ravel()
    improved = True
    while improved and n_meas < limit:
        g = kl_gradient(pair, problem, flat.reshape(best.shape).astype(np.float64), target).ravel()
        n_grad += 1
        cands = []
        for grp in np.unique(fg):
            on = np.flatnonzero((fg == grp) & (flat == 1))
            off = np.flatnonzero((fg == grp) & (flat == 0))
            if on.size and off.size:   # the most promising swaps of the group: est = g_add - g_drop
                on = on[np.argsort(-g[on], kind="stable")[:64]]
                off = off[np.argsort(g[off], kind="stable")[:64]]
                est = g[off][None, :] - g[on][:, None]
                order = np.argsort(est, axis=None, kind="stable")[:limit]
                cands += [(est[a, b], on[a], off[b]) for a, b in zip(*np.unravel_index(order, est.shape))]
        cands.sort(key=lambda t: t[0])
        improved = False
        for _, i, j in cands:
            if n_meas >= limit:
                break
            if flat[i] != 1 or flat[j] != 0:
                continue
            flat[i], flat[j] = 0, 1
            sel = flat.reshape(best.shape)
            touched = sorted({int(chunk_of[i]), int(chunk_of[j])})
            new = {c: chunk_kl(model, problem, sel, c) for c in touched}
            n_meas += len(touched)
            if sum(new.values()) < sum(per_chunk[c] for c in touched) - 1e-15:
                for c, v in new.items():
                    per_chunk[c] = v
                improved = True
                trace.append(("swap", float(per_chunk.sum() / n_tok)))
                if log:
                    log(f"  single swap: KL {per_chunk.sum() / n_tok:.6f}")
            else:
                flat[i], flat[j] = 1, 0
    model.set_residual_mask(None)
    return flat.reshape(best.shape), float(per_chunk.sum() / n_tok), n_grad, n_meas


def _swaps(sel: np.ndarray, g: np.ndarray, groups: np.ndarray, quota: dict[int, int]):
    """A function of a fraction f: sel with, in each group, the first f of the pairs (cheapest
    selected slot to drop, best unselected slot to add) whose estimated change g_add - g_drop is
    negative swapped; None when no pair pays."""
    fs, fg, fg_grad = sel.ravel(), groups.ravel(), g.ravel()
    plans = []
    for grp in quota:
        on = np.flatnonzero((fg == grp) & (fs == 1))
        off = np.flatnonzero((fg == grp) & (fs == 0))
        drop = on[np.argsort(-fg_grad[on], kind="stable")]    # removing costs -g: cheapest first
        add = off[np.argsort(fg_grad[off], kind="stable")]    # adding changes KL by g: best first
        n = min(drop.size, add.size)
        pays = fg_grad[add[:n]] - fg_grad[drop[:n]] < 0
        plans.append((drop, add, int(np.count_nonzero(pays))))
    if all(p[2] == 0 for p in plans):
        return lambda f: None

    def make(f: float) -> np.ndarray | None:
        out = fs.copy()
        moved = 0
        for drop, add, n in plans:
            s = int(math.ceil(f * n))
            out[drop[:s]], out[add[:s]] = 0, 1
            moved += s
        return out.reshape(sel.shape) if moved else None

    return make
