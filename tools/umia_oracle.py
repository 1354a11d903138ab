#!/usr/bin/env python3
"""UMIA and its ablations against the residual oracle (rapidmoe_gguf/oracle.py, docs/UMIA.md).

    python tools/umia_oracle.py [--model PAIR.gguf] [--text TEXT] [--chunks 24] [--budgets 0.05,0.1,0.25]
                                [--markdown docs/QUALITY.md] [--section NAME]
                                [--json ROWS.json | --from-json ROWS.json]

Defaults: the bundled pair and its held-out text. Reference: the same pair with every residual
(KL(all || selection)), or --reference F32.gguf. Every policy (none, all, umia, gate, expert,
layer, random) and the oracle run on the same chunks; "closed" is 1 - KLD / KLD(none), and UMIA's
share is its closure over the oracle's. With --markdown the section between the markers
``<!-- umia_oracle: begin -->`` and ``<!-- umia_oracle: end -->`` of that file is rewritten (added
at its end when absent); with --section NAME the markers are ``<!-- umia_oracle NAME: begin -->``
and ``<!-- umia_oracle NAME: end -->``, so that each model keeps its own table; --json keeps every
row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rapidmoe_gguf as rm  # noqa: E402
from rapidmoe_gguf import oracle  # noqa: E402
from rapidmoe_gguf.bundled import bundled_heldout_path, bundled_model_path  # noqa: E402
from rapidmoe_gguf.evaluate import perplexity  # noqa: E402

POLICIES = ("umia", "gate", "expert", "layer", "random")
BEGIN, END = "<!-- umia_oracle: begin -->", "<!-- umia_oracle: end -->"


def markers(section: str | None) -> tuple[str, str]:
    if not section:
        return BEGIN, END
    if not section.replace("-", "").replace("_", "").isalnum():
        raise SystemExit(f"--section {section!r}: letters, digits, '-' and '_' only")
    return f"<!-- umia_oracle {section}: begin -->", f"<!-- umia_oracle {section}: end -->"


def run(args) -> tuple[list[dict], dict]:
    import torch

    torch.set_num_threads(max(args.threads, 1))
    model_path = args.model or bundled_model_path()
    bundled = args.model is None or os.path.realpath(args.model) == os.path.realpath(bundled_model_path())
    text = Path(args.text or bundled_heldout_path()).read_text(encoding="utf-8")
    budgets = [float(b) for b in args.budgets.split(",")]
    rows, meta = [], {}
    opts = dict(n_ctx=args.ctx, n_threads=args.threads)
    with rm.Model(model_path, **opts) as m, rm.Model(args.reference or model_path, **opts) as ref:
        if m.residual_path is None:
            raise SystemExit(f"{model_path}: no residual sidecar")
        if args.reference is None:
            ref.set_residual("all")
        ids = m.tokenize(text, add_special=False)
        t0 = time.time()
        pair = oracle.TorchPair(model_path, m.residual_path)
        problem = oracle.make_problem(ref, ids, args.ctx, args.chunks, m.info["n_layer"], m.info["n_expert_used"])

        def row(name, budget, masks=None, **extra):
            r = perplexity(m, ids, args.ctx, reference=ref, max_chunks=args.chunks, masks=masks)
            st = m.stats()
            layer_rate = st["residual"].sum(1) / np.maximum(st["active"].sum(1), 1)
            rows.append(dict(r.as_dict(), policy=name, budget=budget, layer_rate=layer_rate.round(3).tolist(), **extra))
            closed = 1.0 - r.kld_mean / rows[0]["kld_mean"] if rows[0]["kld_mean"] > 0 else float("nan")
            print(f"{name:7s} b={budget:<5g} kld {r.kld_mean:.6f} closed {closed:6.1%} p99 {r.kld_p99:.5f} "
                  f"top1 {r.top1:.4f} rate {r.residual_rate:.4f} [{time.time() - t0:.0f}s]", flush=True)

        for policy, budget in (("none", 0.0), ("all", 1.0)):
            m.set_residual(policy)
            row(policy, budget)
        for b in budgets:
            for policy in POLICIES:
                m.set_residual(policy, b)
                row(policy, b)
            m.set_residual("none")
            res = oracle.search(m, pair, problem, b, polish=args.polish, log=print if args.verbose else None)
            row("oracle", b, masks=res.selection, gradients=res.n_gradients, measurements=res.n_measurements,
                search_kl=res.kl)
        meta = dict(model=os.path.basename(model_path), recipe=m.metadata.get("rapidmoe.recipe", "?"),
                    bundled=bundled, arch=m.info["arch"], n_layer=m.info["n_layer"],
                    n_expert=m.info["n_expert"], n_expert_used=m.info["n_expert_used"],
                    reference=os.path.basename(args.reference) if args.reference
                    else "all", tokens=rows[0]["n_tokens"], chunks=len(problem.chunks), n_ctx=args.ctx,
                    seconds=round(time.time() - t0), threads=args.threads, budgets=budgets)
    return rows, meta


def markdown(rows: list[dict], meta: dict, section: str | None = None) -> str:
    none = next(r["kld_mean"] for r in rows if r["policy"] == "none")
    ref = "the same pair with every residual (KL(all ‖ policy))" if meta["reference"] == "all" else meta["reference"]
    begin, end = markers(section)
    command = "python tools/umia_oracle.py --markdown docs/QUALITY.md" if meta.get("bundled", True) else (
        f"python tools/umia_oracle.py --model {meta['model']} --text HELDOUT --markdown docs/QUALITY.md "
        f"--section {section}" if section else f"python tools/umia_oracle.py --model {meta['model']} --text HELDOUT "
        "--markdown docs/QUALITY.md")
    where = ("Unlike the tables above (which need the training run, `tools/quality_study.py --run`), this one "
             "runs on the shipped pair." if meta.get("bundled", True) else
             "The pair and its held-out text (HELDOUT) live outside the package; how they are made is "
             "said above the table.")
    lines = [
        begin,
        f"## Against the oracle: {meta['model']} ({meta['recipe']})",
        "",
        f"Generated by `{command}` (docs/UMIA.md, \"The oracle\"). "
        + (f"Architecture `{meta['arch']}`, {meta['n_layer']} layers, {meta['n_expert']} experts, top-{meta['n_expert_used']}. "
           if "arch" in meta else "")
        + f"Text: {meta['tokens']} scored held-out tokens ({meta['chunks']} chunks of {meta['n_ctx']}). "
        f"Reference: {ref}.",
        "closed: 1 − KLD / KLD(none); share: a policy's closure over the oracle's at that budget. The",
        "oracle knows the reference's outputs and the whole text (not deployable); it spends the budget",
        "exactly, in the context half and the scored half of each chunk alike. "
        f"The run took {meta['seconds']} s on {meta['threads']} thread(s). {where}",
        "",
        "| policy | budget | rate | PPL | KLD | closed | share of oracle | KLD p99 | top-1 | MiB/token |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        closed = 1.0 - r["kld_mean"] / none
        orc = next((o for o in rows if o["policy"] == "oracle" and o["budget"] == r["budget"]), None)
        share = f"{closed / (1.0 - orc['kld_mean'] / none):.0%}" if orc and r["policy"] not in ("none", "all") else "–"
        lines.append(f"| {r['policy']} | {r['budget']:g} | {r['residual_rate']:.3f} | {r['ppl']:.3f} | "
                     f"{r['kld_mean']:.6f} | {closed:.0%} | {share} | {r['kld_p99']:.5f} | {r['top1']:.4f} | "
                     f"{r['bytes_per_token'] / 2**20:.3f} |")
    if all("layer_rate" in r for r in rows):
        lines += ["", "Share of each layer's slots that got the residual (realised):", ""]
        for b in meta["budgets"]:
            lines.append(f"- budget {b:g}: " + ", ".join(
                f"{r['policy']} {r['layer_rate']}" for r in rows
                if r["budget"] == b and r["policy"] in ("umia", "gate", "oracle")))
    lines += ["", "UMIA's share of the oracle's closure: " + "; ".join(
        f"budget {b:g}: {_share(rows, b, none):.0%}" for b in meta["budgets"]) + ".", end]
    return "\n".join(lines)


def _share(rows, b, none) -> float:
    kl = {r["policy"]: r["kld_mean"] for r in rows if r["budget"] == b}
    return (1.0 - kl["umia"] / none) / (1.0 - kl["oracle"] / none)


def write_section(path: Path, section: str, name: str | None = None) -> None:
    begin, end = markers(name)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="base GGUF of a RESplit pair (default: the bundled model)")
    ap.add_argument("--text", help="held-out text (default: the bundled model's)")
    ap.add_argument("--reference", help="reference GGUF (default: the same pair with every residual)")
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--budgets", default="0.05,0.1,0.25")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--polish", type=int, default=300, help="chunk evaluations for the oracle's single swaps")
    ap.add_argument("--markdown", help="file whose oracle section is (re)written")
    ap.add_argument("--section", help="name of the section (its markers) in --markdown, one per model")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--verbose", action="store_true", help="print every candidate the search measures")
    ap.add_argument("--from-json", help="write the section from the rows a --json run kept, without running")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        rows, meta = saved["rows"], saved["meta"]
    else:
        rows, meta = run(args)
    section = markdown(rows, meta, args.section)
    print(section)
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.markdown:
        write_section(Path(args.markdown), section, args.section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
