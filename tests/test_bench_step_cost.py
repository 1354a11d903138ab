"""tools/bench_step_cost.py on the tiny model: one table row per context and prompt chunk, with a
step's time and its attention part (under 0.05 ms on this model, so it may print 0.0). Timings
are printed; only their signs and order are checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_server import gguf  # noqa: F401  (a fixture)

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench_step_cost.py"


def test_bench_step_cost_gives_a_row_per_context_and_chunk(gguf):
    r = subprocess.run([sys.executable, str(TOOL), str(gguf), "--context", "20,40", "--prompt", "2,4", "--runs", "2",
                        "--decoding-context", "8", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [(int(c), int(p)) for c, p, *_ in rows] == [(20, 2), (20, 4), (40, 2), (40, 4)]
    assert all(float(alone) > 0 and float(both) > 0 and 0 <= float(attn) <= float(both) for _, _, alone, both, attn in rows)


def test_bench_step_cost_refuses_empty_sizes(gguf):
    r = subprocess.run([sys.executable, str(TOOL), str(gguf), "--prompt", "0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--prompt" in r.stderr
