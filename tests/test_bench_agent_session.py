"""tools/bench_agent_session.py on the tiny model, our engine alone: every turn after the first
keeps the whole earlier prompt (prefix reuse) and evaluates only the scripted reply and the new
message. Timings are printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_server import gguf  # noqa: F401  (a fixture)

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench_agent_session.py"


def test_bench_agent_session_reuses_each_prompt(gguf, tmp_path):
    out = tmp_path / "session.json"
    r = subprocess.run([sys.executable, str(TOOL), str(gguf), "--engines", "ours", "--first", "40", "--turns", "3",
                        "--turn", "10", "--reply", "4", "--threads", "1", "--json", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    turns = json.loads(out.read_text())["ours"]["turns"]
    assert [t["prompt"] for t in turns] == [40, 54, 68]
    assert [t["reused"] for t in turns[1:]] == [40, 54]          # the earlier prompt, whole
    assert all(t["generated"] == 4 and 0 < t["ttft_s"] <= t["turn_s"] for t in turns)
    assert "| 3 | 68 |" in r.stdout and "total TTFT" in r.stdout
