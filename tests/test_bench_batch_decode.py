"""tools/bench_batch_decode.py on the tiny model: one table row per N with positive rates.
Timings are printed; only their signs are checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_server import gguf  # noqa: F401  (a fixture)

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench_batch_decode.py"


def test_bench_batch_decode_gives_a_row_per_stream_count(gguf):
    r = subprocess.run([sys.executable, str(TOOL), str(gguf), "--streams", "1,3", "--steps", "4", "--threads", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(n) for n, *_ in rows] == [1, 3]
    assert all(float(b) > 0 and float(o) > 0 and float(q) > 0 for _, b, o, q in rows)


def test_bench_batch_decode_refuses_bad_streams(gguf):
    r = subprocess.run([sys.executable, str(TOOL), str(gguf), "--streams", "0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--streams" in r.stderr
