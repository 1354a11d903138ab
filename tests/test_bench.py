"""`rapidmoe bench` and the engine's profile (rm_session_profile): the parts' times account for
the evaluation's, tokens are counted per kind of batch, clear_stats resets them, and the CLI
reports medians with the profile. No timing is asserted beyond consistency."""

from __future__ import annotations

import json
import os
import time

import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import bench, cli, kernels
from rapidmoe_gguf.bundled import bundled_model_path


def test_profile_accounts_for_the_evaluation_time():
    with rm.Model(bundled_model_path(), n_ctx=128, n_threads=2) as m:
        m.eval(list(range(5, 20)))
        m.clear_stats()
        p = m.profile()
        assert p["tokens"] == {"decode": 0, "prefill": 0}
        assert all(v == 0.0 for v in p["decode"].values()) and all(v == 0.0 for v in p["prefill"].values())
        t0 = time.perf_counter()
        m.eval(list(range(30, 70)))
        for t in range(8):
            m.eval([100 + t])
        elapsed = time.perf_counter() - t0
        p = m.profile()
        assert p["tokens"] == {"decode": 8, "prefill": 40}
        assert set(p["decode"]) == set(bench.PARTS_DOC) == set(p["prefill"])
        total = sum(p["decode"].values()) + sum(p["prefill"].values())
        assert 0.5 * elapsed < total <= elapsed
        for kind in ("decode", "prefill"):
            assert all(v >= 0.0 for v in p[kind].values())
            assert p[kind]["experts_in"] > 0 and p[kind]["attn_in"] > 0
        assert p["decode"]["output"] > 0          # every decoded token's logits
        assert p["prefill"]["shared"] >= 0


def test_bench_cli_reports_medians_and_the_profile(capsys):
    assert cli.main(["bench", "--json", "--runs", "2", "--prefill", "48", "--decode", "6", "--prompt", "4",
                     "--profile", "-t", "2", "--batch", "16"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["runs"] == 2 and len(r["decode_tok_s_all"]) == 2 and len(r["prefill_tok_s_all"]) == 2
    assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
    assert r["cpu_kernels"] == rm.cpu_isa() and r["cpu_kernels"] in ("scalar", "avx2", "avx512", "amx")
    assert r["cpu_kernels_reason"] == kernels.cpu_isa_reason() != ""
    assert 0 < r["decode_p50_ms"] <= r["decode_p99_ms"]
    assert sorted(r["decode_tok_s_all"])[0] <= r["decode_tok_s"] <= sorted(r["decode_tok_s_all"])[1]
    assert set(r["profile"]["decode_ms_per_token"]) == set(bench.PARTS_DOC)
    assert sum(r["profile"]["prefill_ms_per_token"].values()) > 0
    assert cli.main(["bench", "--runs", "1", "--prefill", "8", "--decode", "2", "--profile"]) == 0
    text = capsys.readouterr().out
    assert "decode" in text and "experts_in" in text and "total" in text
    assert f"({rm.cpu_isa()} kernels)" in text and kernels.cpu_isa_reason() in text


def test_bench_says_why_a_kernel_set_was_chosen(tmp_path):
    """The set in use and why: the CPU's best (or a lower one measured faster on its family), or the
    one $RAPIDMOE_ISA names, and for the AVX2 set whether it takes AVX-VNNI, in a fresh process (run
    outside the source tree, whose package is not built in a plain install)."""
    import subprocess
    import sys

    code = "import rapidmoe_gguf as rm; from rapidmoe_gguf import kernels; print(rm.cpu_isa(), kernels.cpu_isa_reason())"
    for isa in kernels.supported_isas():
        env = dict(os.environ, RAPIDMOE_ISA=isa)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             cwd=tmp_path).stdout
        if isa != "avx2":
            assert out.strip() == f"{isa} RAPIDMOE_ISA={isa}"
            continue
        # the AVX2 set also says whether its tiles take AVX-VNNI, and RAPIDMOE_AVX_VNNI=0 turns it off
        assert out.strip() in (f"{isa} RAPIDMOE_ISA={isa}; AVX-VNNI used", f"{isa} RAPIDMOE_ISA={isa}; AVX-VNNI not on this CPU")
        out = subprocess.run([sys.executable, "-c", code], env=dict(env, RAPIDMOE_AVX_VNNI="0"), capture_output=True,
                             text=True, check=True, cwd=tmp_path).stdout
        assert out.strip() == f"{isa} RAPIDMOE_ISA={isa}; AVX-VNNI off (RAPIDMOE_AVX_VNNI=0)"
    env = {k: v for k, v in os.environ.items() if k != "RAPIDMOE_ISA"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout
    isa, why = out.strip().split(" ", 1)
    assert isa in kernels.supported_isas() and why and not why.startswith("RAPIDMOE_ISA")


@pytest.mark.parametrize("bad", [["--runs", "0"], ["--decode", "0"], ["--batch", "0"]])
def test_bench_cli_rejects_bad_sizes(capsys, bad):
    assert cli.main(["bench", *bad]) != 0
    assert "must be >= 1" in capsys.readouterr().err
