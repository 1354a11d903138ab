#!/usr/bin/env python3
"""KL against the residual bytes read per token, every policy and the oracle, one panel per model.

    python tools/plot_quality_kl_bytes.py [ROWS.json ...] [--out docs/quality_kl_bytes.svg]

Reads the rows that ``tools/umia_oracle.py --json`` keeps (default: docs/QUALITY.oracle.json, the
bundled model, and docs/QUALITY.second.oracle.json, the second model) and writes an SVG by hand
(lines and markers; no plotting library needed). x: residual MiB read per decoded token, the
row's weight bytes per token less base only's; y: mean KL(reference ‖ policy) per token. Each
policy's line starts at base only (x = 0) and goes through its budgets; all residuals (KL 0 by
construction when the reference is the pair itself) is left out so the small budgets keep the
width, and its bytes are said in the panel's note.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INPUTS = (ROOT / "docs" / "QUALITY.oracle.json", ROOT / "docs" / "QUALITY.second.oracle.json")
POLICIES = ("oracle", "umia", "gate", "expert", "layer", "random")
COLORS = {"oracle": "#000000", "umia": "#d62728", "gate": "#1f77b4", "expert": "#2ca02c",
          "layer": "#9467bd", "random": "#8c8c8c"}
MiB = 2.0 ** 20
PANEL_W, PANEL_H = 470, 360
MARGIN = dict(left=78, right=16, top=44, bottom=66)


def nice_ticks(hi: float, n: int = 5) -> list[float]:
    """Ticks 0, s, 2s, ... covering [0, hi] with s a 1/2/5 multiple of a power of ten."""
    if hi <= 0:
        return [0.0, 1.0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    count = int(math.ceil(hi / step - 1e-9))
    return [i * step for i in range(count + 1)]


def fmt(v: float) -> str:
    return f"{v:.6g}" if v == 0 or 1e-3 <= abs(v) < 1e4 else f"{v:.1e}"


def series(rows: list[dict]) -> tuple[dict[str, list[tuple[float, float, float]]], dict, dict | None]:
    """Per policy the points (x MiB/token, KL, budget), base only's row and all residuals' row."""
    none = next((r for r in rows if r["policy"] == "none"), None)
    if none is None:
        raise SystemExit("rows without base only (policy none): cannot place x = 0")
    full = next((r for r in rows if r["policy"] == "all"), None)
    x0 = none["bytes_per_token"]
    out = {}
    for p in POLICIES:
        pts = sorted((r["budget"], (r["bytes_per_token"] - x0) / MiB, r["kld_mean"]) for r in rows if r["policy"] == p)
        if pts:
            out[p] = [(0.0, none["kld_mean"], 0.0)] + [(x, kl, b) for b, x, kl in pts]
    if not out:
        raise SystemExit("no policy rows to plot")
    return out, none, full


def panel(meta: dict, rows: list[dict], ox: float, legend: bool) -> list[str]:
    lines, none, full = series(rows)
    pw = PANEL_W - MARGIN["left"] - MARGIN["right"]
    ph = PANEL_H - MARGIN["top"] - MARGIN["bottom"]
    x_hi = max(x for pts in lines.values() for x, _, _ in pts)
    y_hi = max(kl for pts in lines.values() for _, kl, _ in pts)
    xt, yt = nice_ticks(x_hi), nice_ticks(y_hi)
    x_max, y_max = xt[-1], yt[-1]
    left, top = ox + MARGIN["left"], MARGIN["top"]

    def X(v):
        return left + pw * v / x_max

    def Y(v):
        return top + ph * (1.0 - v / y_max)

    arch = f", {meta['arch']}" if "arch" in meta else ""
    title = f"{meta.get('model', '?')} ({meta.get('recipe', '?')}{arch})"
    out = [f'<g class="panel" data-model="{escape(meta.get("model", "?"))}">',
           f'<text x="{left + pw / 2:.1f}" y="{top - 22}" text-anchor="middle" font-size="14" '
           f'font-weight="bold">{escape(title)}</text>',
           f'<text x="{left + pw / 2:.1f}" y="{top - 7}" text-anchor="middle" font-size="11">'
           f'{meta.get("tokens", "?")} scored held-out tokens; reference: '
           f'{escape("all residuals" if meta.get("reference") == "all" else str(meta.get("reference")))}</text>']
    for v in xt:
        out.append(f'<line x1="{X(v):.1f}" y1="{top}" x2="{X(v):.1f}" y2="{top + ph}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{X(v):.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11">{fmt(v)}</text>')
    for v in yt:
        out.append(f'<line x1="{left}" y1="{Y(v):.1f}" x2="{left + pw}" y2="{Y(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end" font-size="11">{fmt(v)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#000"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph + 36}" text-anchor="middle" font-size="12">'
               'residual MiB read per token (over base only)</text>')
    out.append(f'<text x="{ox + 16}" y="{top + ph / 2:.1f}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {ox + 16} {top + ph / 2:.1f})">KL(reference ‖ policy) per token</text>')
    if full is not None:
        out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph + 54}" text-anchor="middle" font-size="10" '
                   f'fill="#555">base only: KL {none["kld_mean"]:.3g}; all residuals: KL {full["kld_mean"]:.3g} at '
                   f'{fmt((full["bytes_per_token"] - none["bytes_per_token"]) / MiB)} MiB/token (not drawn)</text>')
    for p in reversed(POLICIES):          # the oracle on top
        if p not in lines:
            continue
        pts = lines[p]
        c, w = COLORS[p], 2.4 if p in ("oracle", "umia") else 1.4
        dash = ' stroke-dasharray="5 3"' if p == "oracle" else ""
        path = " ".join(f"{X(x):.1f},{Y(kl):.1f}" for x, kl, _ in pts)
        out.append(f'<polyline class="policy" data-policy="{p}" points="{path}" fill="none" stroke="{c}" '
                   f'stroke-width="{w}"{dash}/>')
        for x, kl, b in pts[1:]:
            tip = f"<title>{p} b={b:g}: KL {kl:.6f}, {x:.3f} MiB/token</title>"
            if p == "oracle":
                out.append(f'<rect x="{X(x) - 4:.1f}" y="{Y(kl) - 4:.1f}" width="8" height="8" fill="{c}">{tip}</rect>')
            else:
                out.append(f'<circle cx="{X(x):.1f}" cy="{Y(kl):.1f}" r="3.5" fill="{c}">{tip}</circle>')
    out.append(f'<circle cx="{X(0):.1f}" cy="{Y(none["kld_mean"]):.1f}" r="4.5" fill="#fff" stroke="#000">'
               f'<title>base only: KL {none["kld_mean"]:.6f}</title></circle>')
    if legend:
        lx, ly = left + pw - 92, top + 10
        out.append(f'<rect x="{lx - 8}" y="{ly - 6}" width="96" height="{16 * len(POLICIES) + 6}" fill="#fff" '
                   'stroke="#ccc"/>')
        for i, p in enumerate(POLICIES):
            y = ly + 16 * i + 6
            dash = ' stroke-dasharray="5 3"' if p == "oracle" else ""
            out.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 22}" y2="{y}" stroke="{COLORS[p]}" stroke-width="2"{dash}/>')
            out.append(f'<text x="{lx + 28}" y="{y + 4}" font-size="11">{p}</text>')
    out.append("</g>")
    return out


def render(datasets: list[dict]) -> str:
    width, height = PANEL_W * len(datasets), PANEL_H
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
             f'<rect width="{width}" height="{height}" fill="#fff"/>']
    for i, d in enumerate(datasets):
        parts += panel(d["meta"], d["rows"], i * PANEL_W, legend=i == 0)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", help="rows kept by tools/umia_oracle.py --json (one panel each)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "quality_kl_bytes.svg"))
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.inputs] or list(DEFAULT_INPUTS)
    datasets = []
    for p in paths:
        if not p.exists():
            raise SystemExit(f"{p}: not found (make it with tools/umia_oracle.py --json)")
        d = json.loads(p.read_text(encoding="utf-8"))
        if "rows" not in d or "meta" not in d:
            raise SystemExit(f"{p}: not the rows of tools/umia_oracle.py --json (no 'rows'/'meta')")
        datasets.append(d)
    Path(args.out).write_text(render(datasets), encoding="utf-8")
    print(f"wrote {args.out} ({len(datasets)} panel(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
