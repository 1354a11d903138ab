"""tools/bench_prefix_reuse.py on the tiny model: the reused turn keeps the whole earlier
conversation and evaluates only the new tokens, the cold one keeps nothing. Timings are printed,
never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_server import gguf  # noqa: F401  (a fixture)

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench_prefix_reuse.py"


def test_bench_prefix_reuse_keeps_the_history(gguf, tmp_path):
    out = tmp_path / "reuse.json"
    r = subprocess.run([sys.executable, str(TOOL), str(gguf), "--history", "40", "--answer", "4", "--turn", "6",
                        "--runs", "2", "--threads", "1", "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    # the 40 history tokens and the answer (its last token is in the cache once evaluated)
    assert len(data["kept"]) == 2 and all(43 <= k <= 44 for k in data["kept"])
    assert len(data["ttft_reused_s"]) == 2 and min(data["ttft_cold_s"]) > 0
    assert "prefix reused" in r.stdout and "cold prefill" in r.stdout


def test_bench_prefix_reuse_refuses_empty_sizes(gguf):
    r = subprocess.run([sys.executable, str(TOOL), str(gguf), "--history", "0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--history" in r.stderr
