"""tools/plot_quality_kl_bytes.py: the SVG of KL against residual bytes per token."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "plot_quality_kl_bytes.py"
NS = "{http://www.w3.org/2000/svg}"
MiB = 2 ** 20


def _rows(kl_none: float, base_bytes: float, slot_bytes: float) -> list[dict]:
    rows = [dict(policy="none", budget=0.0, kld_mean=kl_none, bytes_per_token=base_bytes),
            dict(policy="all", budget=1.0, kld_mean=0.0, bytes_per_token=base_bytes + slot_bytes)]
    for b in (0.05, 0.1, 0.25):
        for i, p in enumerate(("umia", "gate", "expert", "layer", "random", "oracle")):
            # the oracle lowest, random highest
            share = {"oracle": 0.6, "umia": 0.4}.get(p, 0.3 - 0.05 * i)
            rows.append(dict(policy=p, budget=b, kld_mean=kl_none * (1 - share * b / 0.25),
                             bytes_per_token=base_bytes + b * slot_bytes))
    return rows


def _run(tmp_path, *datasets):
    inputs = []
    for i, d in enumerate(datasets):
        p = tmp_path / f"rows{i}.json"
        p.write_text(json.dumps(d))
        inputs.append(str(p))
    out = tmp_path / "plot.svg"
    r = subprocess.run([sys.executable, str(TOOL), *inputs, "--out", str(out)], capture_output=True, text=True)
    return r, out


def test_plot_has_every_policy_per_model_at_its_bytes(tmp_path):
    a = dict(meta=dict(model="a.gguf", recipe="q4k-q8", tokens=3072, reference="all"),
             rows=_rows(6.5e-4, 4.0 * MiB, 3.2 * MiB))
    b = dict(meta=dict(model="b.gguf", recipe="q2k-q4", arch="llama", tokens=3072, reference="all"),
             rows=_rows(2.0e-2, 5.0 * MiB, 1.6 * MiB))
    r, out = _run(tmp_path, a, b)
    assert r.returncode == 0, r.stderr
    root = ET.parse(out).getroot()
    panels = [g for g in root.iter(NS + "g") if g.get("class") == "panel"]
    assert [g.get("data-model") for g in panels] == ["a.gguf", "b.gguf"]
    for g, d in zip(panels, (a, b)):
        lines = {pl.get("data-policy"): pl for pl in g.iter(NS + "polyline")}
        assert set(lines) == {"umia", "gate", "expert", "layer", "random", "oracle"}
        pts = {p: [tuple(map(float, xy.split(","))) for xy in pl.get("points").split()] for p, pl in lines.items()}
        for p, xy in pts.items():
            assert len(xy) == 4, p                          # base only, then the three budgets
            xs = [x for x, _ in xy]
            assert xs == sorted(xs) and xs[0] < xs[1], p    # x grows with the bytes
            assert len({xy[0] for xy in pts.values()}) == 1  # every line starts at base only
        # x is proportional to the residual bytes: budget 0.25 is 5x budget 0.05 from the origin
        x0, x05, x25 = pts["umia"][0][0], pts["umia"][1][0], pts["umia"][3][0]
        assert (x25 - x0) == pytest.approx(5 * (x05 - x0), rel=1e-3)
        # SVG y grows downwards: the oracle's lower KL is drawn below random's
        assert pts["oracle"][3][1] > pts["random"][3][1]
        text = "".join(t.text or "" for t in g.iter(NS + "text"))
        assert d["meta"]["model"] in text


def test_plot_refuses_rows_without_base_only(tmp_path):
    d = dict(meta=dict(model="a.gguf"), rows=[r for r in _rows(1e-3, MiB, MiB) if r["policy"] != "none"])
    r, out = _run(tmp_path, d)
    assert r.returncode != 0 and "base only" in r.stderr
    r, _ = _run(tmp_path, {"rows": []})
    assert r.returncode != 0 and "meta" in r.stderr
