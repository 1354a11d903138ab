"""tools/bench_vs_llamacpp.py without a benchmark: the CMake arguments of each llama.cpp build
(--llama-isa), which build --isa picks, what it records of the CPU and of llama.cpp's build, our
worker's environment, and one tiny run from the repository root in an installed (not editable)
environment, where the source tree beside the tool has no native library and must not shadow the
installed package. No llama.cpp build or run, and no timing is asserted."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import llamacpp_oracle as oracle
import rapidmoe_gguf as rm
from rapidmoe_gguf.bundled import bundled_model_path

bench = oracle._tool("bench_vs_llamacpp")

# a CPU with every option: AVX-512 (with VBMI, VNNI, BF16), AVX-VNNI and AMX
ALL_FLAGS = {"avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq",
             "avx512_vbmi", "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"}
SYSTEM_INFO = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
               "AVX512 = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 0 | LLAMAFILE = 1 | OPENMP = 1 | ")


def options(isa: str, flags: set[str]) -> dict[str, str]:
    args = shlex.split(bench.llama_cmake_args(isa, flags))
    assert all(x.startswith("-D") and x.count("=") == 1 for x in args)
    names = [x[2:].split("=")[0] for x in args]
    assert len(names) == len(set(names))                 # each option once
    return dict(x[2:].split("=") for x in args)


def test_avx2_build_has_no_avx512_option_on():
    avx2 = options("avx2", ALL_FLAGS)
    wide = [k for k in avx2 if k.startswith(("GGML_AVX512", "GGML_AMX"))]
    assert "GGML_AVX512" in wide and "GGML_AMX_INT8" in wide
    assert all(avx2[k] == "OFF" for k in wide), avx2
    assert avx2["GGML_NATIVE"] == "OFF"
    # a desktop CPU's llama.cpp: AVX2 with AVX-VNNI and BMI2 where the CPU has them
    assert all(avx2[k] == "ON" for k in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX_VNNI", "GGML_BMI2"))
    assert options("best", ALL_FLAGS)["GGML_AVX512_VBMI"] == "ON"   # /proc/cpuinfo spells it avx512vbmi
    best = options("best", ALL_FLAGS)
    assert best["GGML_AVX512"] == best["GGML_AVX512_VNNI"] == best["GGML_AVX_VNNI"] == "ON"
    assert best["GGML_AMX_INT8"] == "OFF"                # AMX stays off in every build
    assert set(best) == set(avx2)                        # the same options, only the instruction sets differ
    assert all(best[k] == avx2[k] for k in best if not k.startswith(("GGML_AVX", "GGML_BMI2")))


def test_builds_follow_the_cpu():
    only_avx2 = {"avx", "avx2", "fma", "f16c", "bmi2"}
    assert options("best", only_avx2)["GGML_AVX512"] == "OFF" and options("best", only_avx2)["GGML_BMI2"] == "ON"
    assert options("avx2", {"avx"})["GGML_AVX2"] == "OFF"   # never an option the CPU lacks
    assert bench.llama_cmake_args() == bench.llama_cmake_args("best", bench.cpu_flags())


@pytest.mark.parametrize("argv, want", [
    (["--isa", "avx2"], (bench.DEFAULT_VENV + "-avx2", "avx2")),
    (["--isa", "avx512"], (bench.DEFAULT_VENV, "best")),
    ([], (bench.DEFAULT_VENV, "best")),
    (["--isa", "avx2", "--llama-isa", "best"], (bench.DEFAULT_VENV, "best")),
    (["--llama-isa", "avx2", "--llama-venv", "/x/v"], ("/x/v", "avx2")),
])
def test_isa_picks_the_llama_build(monkeypatch, argv, want):
    calls = []
    monkeypatch.setattr(bench, "install_llama", lambda venv, jobs, isa: calls.append((venv, isa)))
    assert bench.main(["--install-only", *argv]) == 0
    assert calls == [want]


def test_isa_the_cpu_lacks_is_refused(monkeypatch, capsys):
    # the native library would fall back to another set and the run be mislabelled
    monkeypatch.setattr(rm.kernels, "supported_isas", lambda: ["scalar", "avx2"])
    with pytest.raises(SystemExit):
        bench.main([bundled_model_path(), "--engines", "ours", "--isa", "avx512"])
    assert "--isa avx512: this CPU and build have scalar, avx2" in capsys.readouterr().err


def test_llama_build_features():
    features = bench.llama_features(SYSTEM_INFO)
    assert features[:3] == ["SSE3", "SSSE3", "AVX"] and "AVX512" in features and "AMX_INT8" not in features
    bench.check_llama_build("best", features, "v")
    with pytest.raises(SystemExit, match="AVX512"):
        bench.check_llama_build("avx2", features, "v")
    bench.check_llama_build("avx2", ["SSE3", "AVX", "AVX2", "F16C", "FMA"], "v")
    assert bench.llama_features("") == []


def test_cpu_info():
    text = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
            "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx avx2 avx512f avx512_vnni amx_int8\n\n"
            "processor\t: 1\nmodel name\t: something else\n")
    info = bench.cpu_info(text)
    assert info == {"model_name": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel", "family": 6,
                    "model": 143, "flags": {"avx2": True, "avx512f": True, "avx512_vnni": True,
                                            "avx_vnni": False, "amx_int8": True}}
    here = bench.cpu_info()
    assert set(here["flags"]) == set(bench.CPU_FLAGS)
    assert bench.cpu_info("")["model_name"] is None


def test_worker_env_puts_the_imported_package_first(monkeypatch):
    monkeypatch.setattr(bench, "package_root", lambda: "/installed/site-packages")
    monkeypatch.setenv("PYTHONPATH", "/mine")
    env = bench.worker_env("ours", "avx2")
    assert env["PYTHONPATH"].split(os.pathsep) == ["/installed/site-packages", "/mine"]
    assert env["RAPIDMOE_ISA"] == "avx2"
    monkeypatch.delenv("RAPIDMOE_ISA", raising=False)
    assert "RAPIDMOE_ISA" not in bench.worker_env("ours", None)
    assert bench.worker_env("llama.cpp", "avx2")["PYTHONPATH"] == "/mine"     # its own environment


def installed_python(tmp: Path) -> str:
    """A virtual environment in which rapidmoe_gguf is a plain copy of the built package (as a
    wheel installs it) and its dependencies come from this interpreter's site folders, listed in a
    .pth file (whose folders' own .pth files, an editable install's hook among them, are not run)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True)
    site = tmp / "site"
    shutil.copytree(Path(rm.__file__).parent, site / "rapidmoe_gguf",
                    ignore=shutil.ignore_patterns("models", "__pycache__"))
    import numpy
    from rapidmoe_gguf import _rm_cffi

    for so in Path(_rm_cffi.__file__).parent.glob("*.so"):    # an editable install keeps these apart
        shutil.copy2(so, site / "rapidmoe_gguf" / so.name)
    py = tmp / "venv" / "bin" / "python"
    venv_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    deps = {str(Path(m.__file__).parent.parent) for m in (numpy, __import__("cffi"))}
    Path(venv_site, "deps.pth").write_text("\n".join([str(site), *sorted(deps)]) + "\n")
    return str(py)


def test_in_place_run_uses_the_installed_package(tmp_path):
    py = installed_python(tmp_path)
    out = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAPIDMOE_ISA")}
    r = subprocess.run([py, "tools/bench_vs_llamacpp.py", bundled_model_path(), "--engines", "ours", "--runs", "1",
                        "--prompt", "4", "--decode", "2", "--prefill", "8", "--threads", "1", "--isa", "scalar",
                        "--json", str(out)], cwd=bench.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["raw"]["ours"][0]["package"] == str(tmp_path / "site" / "rapidmoe_gguf")
    assert data["ours_isa"] == {"requested": "scalar", "used": "scalar"} and data["llama_cpp"] is None
    assert set(data["cpu"]) == {"model_name", "vendor", "family", "model", "flags"}
    assert "ours: scalar kernels (--isa scalar)" in r.stdout and "CPU: " in r.stdout
