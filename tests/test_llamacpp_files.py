"""tools/make_llamacpp_files.py's path for the types llama.cpp makes only with an importance matrix
(IQ2_XXS, IQ1_S, ...): llama.cpp's llama-imatrix and llama-quantize, built once with
llama-cpp-python's CMake flags.

The argument checks, the build's failure report, the reuse rules of the matrix and the atomic
outputs run everywhere, on stand-in tools (shell scripts) where a tool has to run. The whole path
on a tiny model runs where the real tools are built (`needs_tools`) and llama-cpp-python is at hand
(`needs`): its file is then read by our engine and by llama.cpp, whose logits must agree.
"""

from __future__ import annotations

import os
import shlex
import shutil

import numpy as np
import pytest

import llamacpp_oracle as llamacpp
from conftest import VOCAB, make_tiny_hf

files = llamacpp._files


def _fake_tools(d, quantize_rc: int = 0):
    """Stand-ins for llama-imatrix and llama-quantize: each logs its working folder and
    arguments; llama-imatrix writes its -o file, llama-quantize its output (or fails)."""
    d.mkdir(parents=True, exist_ok=True)
    log = d / "calls.log"
    imatrix = f"""#!/bin/sh
echo "imatrix $(pwd) $*" >> {shlex.quote(str(log))}
while [ $# -gt 0 ]; do [ "$1" = -o ] && echo matrix > "$2"; shift; done
"""
    quantize = f"""#!/bin/sh
echo "quantize $(pwd) $*" >> {shlex.quote(str(log))}
[ {quantize_rc} -ne 0 ] && {{ echo "half written" > "$4"; echo "llama-quantize: something broke" >&2; exit {quantize_rc}; }}
echo quantized > "$4"
"""
    for name, body in (("llama-imatrix", imatrix), ("llama-quantize", quantize)):
        (d / name).write_text(body)
        (d / name).chmod(0o755)
    return log


def _out_with_f16(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "llamacpp-f16.gguf").write_bytes(b"GGUF stand-in")  # present: the converter is not run
    return out


def test_llamacpp_files_rejects_bad_arguments_before_any_work(tmp_path, capsys):
    out = tmp_path / "never"
    cases = [
        (["--types", "IQ2_XXS,IQ9"], "unknown type(s) ['IQ9']"),
        (["--types", "IQ2_XXS", "--imatrix-text", str(tmp_path / "missing.txt")], "missing.txt: cannot read it"),
        (["--types", "IQ2_XXS", "--imatrix", str(tmp_path / "missing.gguf")], "missing.gguf: no such file"),
        (["--types", "IQ2_XXS", "--threads", "0"], "--threads 0"),
    ]
    (tmp_path / "empty.txt").write_text(" \n")
    (tmp_path / "m.gguf").write_bytes(b"x")
    cases += [
        (["--types", "IQ2_XXS", "--imatrix-text", str(tmp_path / "empty.txt")], "empty.txt: the file is empty"),
        (["--types", "IQ1_S", "--imatrix", str(tmp_path / "m.gguf"), "--imatrix-text", str(tmp_path / "empty.txt")],
         "not both"),
    ]
    for args, want in cases:
        with pytest.raises(SystemExit) as e:
            files.main([str(tmp_path / "no-hf"), str(out), *args])
        said = str(e.value.code) + capsys.readouterr().err
        assert want in said, (args, said)
        assert not out.exists()


def test_llamacpp_files_imatrix_types_are_known_file_types():
    assert files.IMATRIX_TYPES <= set(files.FTYPES)
    assert {"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M", "IQ3_XXS"} <= files.IMATRIX_TYPES
    # made without one through llama-cpp-python, as before
    assert not files.IMATRIX_TYPES & {"Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "IQ4_XS", "IQ4_NL", "IQ3_S"}


def test_llamacpp_files_tools_use_llama_cpp_pythons_cmake_flags():
    args = files.tools_cmake_args()
    same = [x for x in shlex.split(files.llama_cmake_args()) if not x.startswith("-DLLAMA_BUILD_TOOLS=")]
    assert [x for x in args if x in same] == same
    assert [x for x in args if x.startswith("-DLLAMA_BUILD_TOOLS=")] == ["-DLLAMA_BUILD_TOOLS=ON"]
    assert {"-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"} <= set(args)


def test_llamacpp_files_tools_found_in_a_build_folder_or_its_bin(tmp_path):
    assert files.tools_bin(str(tmp_path)) is None
    _fake_tools(tmp_path / "bin")
    assert files.tools_bin(str(tmp_path)) == str(tmp_path / "bin")
    assert files.tools_bin(str(tmp_path / "bin")) == str(tmp_path / "bin")
    (tmp_path / "bin" / "llama-quantize").unlink()
    assert files.tools_bin(str(tmp_path)) is None


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake")
def test_llamacpp_files_failed_build_says_where_and_why(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.14)\nmessage(FATAL_ERROR "sources broken on purpose")\n')
    with pytest.raises(SystemExit) as e:
        files.build_tools(str(src), str(tmp_path / "build"), 1)
    msg = str(e.value.code)
    assert "build_tools: building llama.cpp's tools" in msg and "failed" in msg
    assert str(tmp_path / "build-build.log") in msg and "sources broken on purpose" in msg


def test_llamacpp_files_build_needs_cmake_and_sources(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="no llama.cpp sources in"):
        files.build_tools(str(tmp_path / "nowhere"), str(tmp_path / "build"), 1)
    monkeypatch.setattr(files.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="cmake not found"):
        files.build_tools(str(tmp_path), str(tmp_path / "build"), 1)
    _fake_tools(tmp_path / "built" / "bin")  # already built: no cmake needed
    assert files.build_tools(str(tmp_path / "nowhere"), str(tmp_path / "built"), 1) == str(tmp_path / "built" / "bin")


def test_llamacpp_files_default_text_is_the_repository_docs():
    text = files.default_imatrix_text()
    with open(os.path.join(files.REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(files.REPO, "docs", "PERFORMANCE.md"), encoding="utf-8") as f:
        perf = f.read()
    assert text.startswith(readme) and perf in text and len(text) > 50_000


def test_llamacpp_files_imatrix_made_once_per_text_and_tools_run_in_out_dir(tmp_path):
    out = _out_with_f16(tmp_path)
    log = _fake_tools(tmp_path / "tools" / "bin")
    (tmp_path / "a.txt").write_text("some text")
    args = [str(tmp_path / "no-hf"), str(out), "--types", "IQ2_XXS,IQ1_M", "--llama-tools", str(tmp_path / "tools"),
            "--imatrix-text", str(tmp_path / "a.txt"), "--threads", "3"]
    assert files.main(args) == 0
    calls = log.read_text().splitlines()
    assert len(calls) == 3 and calls[0].startswith(f"imatrix {out} -m llamacpp-f16.gguf -f llamacpp-imatrix.txt -o .part-")
    assert calls[0].endswith(f"--chunks {files.IMATRIX_CHUNKS} -c {files.IMATRIX_CTX} -t 3")
    assert calls[1].startswith(f"quantize {out} --imatrix llamacpp-imatrix.gguf llamacpp-f16.gguf .part-")
    assert calls[1].endswith(" IQ2_XXS 3") and calls[2].endswith(" IQ1_M 3")
    assert (out / "llamacpp-imatrix.txt").read_text() == "some text"
    assert (out / "llamacpp-imatrix.gguf").read_text() == "matrix\n"
    assert (out / "llamacpp-iq2_xxs.gguf").read_text() == "quantized\n"
    assert not [p for p in os.listdir(out) if p.startswith(".part-")]

    # again with one more type: the matrix is reused, only the new file made
    assert files.main([*args[:3], "IQ2_XXS,IQ1_M,IQ2_XS", *args[4:]]) == 0
    calls = log.read_text().splitlines()
    assert len(calls) == 4 and calls[3].endswith(" IQ2_XS 3")
    # another text with the old matrix in place: stop, rather than reuse a matrix of other text
    (tmp_path / "b.txt").write_text("other text")
    with pytest.raises(SystemExit, match="was computed on another text"):
        files.main([*args[:3], "IQ2_S", *args[4:7], str(tmp_path / "b.txt")])
    assert len(log.read_text().splitlines()) == 4 and not (out / "llamacpp-iq2_s.gguf").exists()


def test_llamacpp_files_failed_quantize_leaves_no_file(tmp_path):
    out = _out_with_f16(tmp_path)
    _fake_tools(tmp_path / "tools", quantize_rc=3)
    (tmp_path / "m.gguf").write_text("ready matrix")
    with pytest.raises(SystemExit) as e:
        files.main([str(tmp_path / "no-hf"), str(out), "--types", "IQ2_XXS", "--llama-tools", str(tmp_path / "tools"),
                    "--imatrix", str(tmp_path / "m.gguf")])
    msg = str(e.value.code)
    assert "llama-quantize failed (exit 3)" in msg and "something broke" in msg
    assert f"--imatrix {tmp_path / 'm.gguf'}" in msg
    assert sorted(os.listdir(out)) == ["llamacpp-f16.gguf"]  # no matrix computed, no partial file


# ---------------------------------------------------------------------------------------------
# The real tools on a tiny model
# ---------------------------------------------------------------------------------------------

@llamacpp.needs
@llamacpp.needs_tools
def test_llamacpp_files_iq2_xxs_with_imatrix_runs_in_both_engines(tmp_path):
    """llama.cpp's IQ2_XXS file (IQ2_XXS experts and attention, Q4_K attn_v, Q2_K embeddings, Q5_K
    output) made through the importance matrix: the same bytes in any output folder, and our
    logits on it against llama.cpp's. Every token uses all 4 experts, so that the two engines'
    float sums cannot pick different experts at near ties.

    Both engines round each activation to an int8 of Q8_K at the same scale, and their float sums
    agree to ~3e-7, so a value within that of a half step rounds up in one and down in the other:
    on one file made on a Xeon, position 33's attention output held 14.500004 steps, llama.cpp
    took 14 and we took 15 (a float64 sum with Q8_K rounding takes 15; with that one int8 as 14
    it matches llama.cpp to 2e-7), which moved that position's logits by 1.7e-2. With two layers
    the step reached every later position through layer 1's keys; with one, it stays at its own
    position, so all but 2 positions must agree to 1e-4 and every one to 5e-2 (a wrong grid,
    sign or scale moves every position by far more). Measured on the Xeon with one layer: 47 of
    48 positions to 3.7e-7, position 33 at 1.4e-2; the IQ2_XXS grids are the same in both."""
    import gguf

    import rapidmoe_gguf as rm

    hf = make_tiny_hf(tmp_path / "hf", "qwen3_moe", num_experts_per_tok=4, num_hidden_layers=1)
    tools = os.path.dirname(llamacpp.tools())
    args = ["--types", "IQ2_XXS", "--llama-tools", tools, "--threads", "2"]
    assert files.main([str(hf), str(tmp_path / "a"), *args]) == 0
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "llamacpp-f16.gguf", tmp_path / "b")
    assert files.main([str(hf), str(tmp_path / "b"), *args]) == 0
    for name in ("llamacpp-imatrix.gguf", "llamacpp-iq2_xxs.gguf"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name

    mat = gguf.GGUFReader(str(tmp_path / "a" / "llamacpp-imatrix.gguf"))
    assert mat.fields["imatrix.datasets"].contents() == ["llamacpp-imatrix.txt"]
    assert "blk.0.ffn_down_exps.weight.in_sum2" in {t.name for t in mat.tensors}
    path = tmp_path / "a" / "llamacpp-iq2_xxs.gguf"
    r = gguf.GGUFReader(str(path))
    assert r.fields["quantize.imatrix.file"].contents() == "llamacpp-imatrix.gguf"
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert all(types[f"blk.0.ffn_{w}_exps.weight"] == "IQ2_XXS" for w in ("gate", "up", "down"))

    ids = np.random.default_rng(3).integers(3, VOCAB, 48).tolist()
    with rm.Model(path, n_ctx=64, n_threads=2) as m:
        ours = m.eval_logits(ids)
    theirs = llamacpp.logits(path, ids, tmp_path, n_ctx=64)
    assert np.all(np.isfinite(ours))
    rel = np.abs(ours - theirs).max(-1) / np.abs(theirs).max(-1)
    off = np.flatnonzero(rel > 1e-4)
    assert len(off) <= 2 and rel.max() <= 5e-2, f"positions {off.tolist()}: {rel[off]}"
