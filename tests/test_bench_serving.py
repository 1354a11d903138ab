"""tools/bench_serving.py on the tiny model: its server run (N streams, the long prompt among
four) and its llama.cpp worker (batched decode of N sequences) each give their numbers. The
numbers themselves are not checked: tests never assert timings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import llamacpp_oracle as oracle
from test_server import gguf  # noqa: F401  (a fixture)

bench = oracle._tool("bench_serving")
SMALL = ["--streams", "1,2", "--prompt", "8", "--decode", "8", "--long", "48", "--prefill-chunk", "8"]


def _check(result: dict) -> None:
    for n in ("1", "2"):
        r = result[n]
        assert r["decode_tok_s"] > 0 and r["ttft_s"] > 0 and 0 < r["itl_p50_s"] <= r["itl_p99_s"]
    long = result["long"]
    assert long["itl_p50_before_s"] > 0 and long["itl_p99_during_s"] > 0


def test_bench_serving_through_the_server(gguf, tmp_path):
    out = tmp_path / "serving.json"
    assert bench.main([str(gguf), "--skip-llamacpp", "--json", str(out), *SMALL]) == 0
    data = json.loads(out.read_text())
    _check(data["ours"])
    assert data["llama.cpp"] is None and "| 2 |" in data["table"]
    if data["ours"]["metrics"] is not None:
        ok = [ln for ln in data["ours"]["metrics"].splitlines()
              if ln.startswith('rapidmoe_requests_total{status="ok"}')]
        assert float(ok[0].split()[-1]) >= 4     # the warm-ups and the streams (the long ones hang up)


@pytest.mark.slow
@pytest.mark.skipif(oracle.python() is None, reason="llama-cpp-python is not installed")
def test_bench_serving_llamacpp_worker(gguf):
    r = subprocess.run([oracle.python(), bench.__file__, "--llama-worker", str(gguf), "--threads", "2", *SMALL,
                        "--llama-batch", "64"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    _check(json.loads(r.stdout.strip().splitlines()[-1]))
