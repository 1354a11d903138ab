#!/usr/bin/env python3
"""Write the GGUF files users download, made by llama.cpp's own converter and quantizer, from a
Hugging Face checkpoint (e.g. the benchmark model of tools/make_bench_model.py).

    python tools/make_llamacpp_files.py HF_DIR OUT_DIR [--types Q4_K_M,Q5_K_M,Q6_K,Q8_0,Q4_0]
    python tools/make_llamacpp_files.py HF_DIR OUT_DIR --types IQ2_XXS [--imatrix-text TEXT]
    python tools/make_llamacpp_files.py --src-only     # just download and unpack the converter
    python tools/make_llamacpp_files.py --tools-only   # just build llama-imatrix and llama-quantize

Steps, each skipped when its output exists:

1. llama.cpp's converter (convert_hf_to_gguf.py, from the llama-cpp-python sdist of the version
   tools/bench_vs_llamacpp.py builds; downloaded once with pip into --src) writes
   OUT_DIR/llamacpp-f16.gguf. It runs with this interpreter (which needs torch and transformers)
   and the converter's own gguf-py. A locally trained tokenizer has a fingerprint the converter
   does not know, so its pre-tokenizer name is given with --pre (default qwen2, the benchmark
   model's); llama.cpp's files are not edited: the name is set on the converter's class at run time.
2. llama.cpp's quantizer (llama_model_quantize through llama-cpp-python, in the environment
   bench_vs_llamacpp.py builds, --llama-venv) writes OUT_DIR/llamacpp-<type>.gguf for each type:
   the mixes exactly as `llama-quantize` makes them (Q4_K_M: Q4_K with Q6_K for half of ffn_down
   and attn_v and for the output, ...).

The types llama.cpp refuses to make without an importance matrix (IMATRIX_TYPES: IQ2_XXS, IQ2_XS,
IQ2_S, IQ2_M, IQ1_S, IQ1_M, IQ3_XXS, IQ3_XS) take two more steps, because llama-cpp-python has no
call that computes one:

3. llama.cpp's llama-imatrix and llama-quantize are built once from the same sources, with the
   same CMake flags as llama-cpp-python (bench_vs_llamacpp.llama_cmake_args) but the tools on,
   into --llama-tools (default $RAPIDMOE_LLAMACPP_TOOLS, else ~/.cache/rapidmoe/llamacpp-tools;
   about 15 minutes on 2 cores, at nice 10, log beside it as <folder>-build.log; a failed build
   stops with the end of that log). A folder that already holds the two tools (a build folder or
   its bin/, e.g. one built by hand) is used as it is. (IQ3_XXS went through llama-cpp-python
   before, which 0.3.36 refuses without a matrix.)
4. llama-imatrix runs the F16 file over a text (--imatrix-text; default: this repository's
   README.md and docs/*.md concatenated, about 170 KB of English prose and tables) for
   IMATRIX_CHUNKS chunks of IMATRIX_CTX tokens and writes OUT_DIR/llamacpp-imatrix.gguf, once per
   model; the text it ran on is kept as OUT_DIR/llamacpp-imatrix.txt, and a later run with a
   different text stops rather than reuse the old matrix (delete both to recompute).
   --imatrix FILE uses a ready importance matrix instead. llama-quantize --imatrix then writes
   each such type. Both tools run inside OUT_DIR on relative names, so the files (which record
   the matrix's and the text's names) are the same bytes wherever OUT_DIR is.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from bench_vs_llamacpp import DEFAULT_VENV, LLAMA_CPP_VERSION, REPO, llama_cmake_args, llama_python

# llama.cpp's llama_ftype values (include/llama.h) for the files we benchmark
FTYPES = {"F16": 1, "Q4_0": 2, "Q8_0": 7, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
          "Q5_K_M": 17, "Q6_K": 18, "IQ3_XXS": 23, "IQ4_NL": 25, "IQ3_S": 26, "IQ4_XS": 30,
          "MXFP4_MOE": 38,   # MXFP4_MOE: MXFP4 experts, Q8_0 elsewhere (gpt-oss, make_bench_model.py --arch gpt-oss)
          "IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XS": 22, "IQ1_S": 24, "IQ2_S": 28, "IQ2_M": 29, "IQ1_M": 31}
# the file types whose tensors llama.cpp 0.3.36 will not quantize without an importance matrix
# (llama-quant.cpp, tensor_requires_imatrix; `llama-quantize --dry-run` says so for exactly these)
IMATRIX_TYPES = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS"}
IMATRIX_CHUNKS, IMATRIX_CTX = 8, 512
DEFAULT_SRC = os.path.join(os.path.expanduser("~"), ".cache", "rapidmoe", "llamacpp-src")
DEFAULT_TOOLS = os.path.join(os.path.expanduser("~"), ".cache", "rapidmoe", "llamacpp-tools")
TOOLS = ("llama-imatrix", "llama-quantize")

_CONVERT = r"""
import sys
src, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [src, src + "/gguf-py"]
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import runpy
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""

_QUANTIZE = r"""
import sys, llama_cpp
src, dst, ftype, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = ftype
p.nthread = threads
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p)
sys.exit(1 if rc else 0)
"""


def llama_src(cache: str) -> str:
    """The vendored llama.cpp of the llama-cpp-python sdist, downloaded and unpacked once."""
    root = os.path.join(cache, f"llama_cpp_python-{LLAMA_CPP_VERSION}", "vendor", "llama.cpp")
    if os.path.exists(os.path.join(root, "convert_hf_to_gguf.py")):
        return root
    os.makedirs(cache, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"llama-cpp-python=={LLAMA_CPP_VERSION}",
                    "--no-deps", "--no-binary", "llama-cpp-python", "-d", cache], check=True)
    tars = glob.glob(os.path.join(cache, f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"))
    if not tars:
        raise SystemExit(f"no sdist of llama-cpp-python {LLAMA_CPP_VERSION} in {cache}")
    subprocess.run(["tar", "xzf", tars[0], "-C", cache], check=True)
    return root


def _has_mtp_option(hf: str) -> bool:
    """Qwen3.5-MoE, Qwen3-Next and MiMo-V2-Flash: llama.cpp's converter wants an MTP block unless
    told --no-mtp, and a checkpoint made by transformers (the benchmark model's) has none."""
    import json

    with open(os.path.join(hf, "config.json"), encoding="utf-8") as f:
        archs = json.load(f).get("architectures") or []
    return any(n in ("Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM", "MiMoV2FlashForCausalLM") for n in archs)


def _atomic(run, out: str) -> None:
    """run(tmp) writes tmp; tmp becomes out only when run succeeds."""
    fd, tmp = tempfile.mkstemp(prefix=".part-", suffix=".gguf", dir=os.path.dirname(out) or ".")
    os.close(fd)
    try:
        run(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _tail(path: str, n: int = 25) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-n:])


def tools_bin(path: str) -> str | None:
    """The folder of built llama-imatrix and llama-quantize in path (a build folder or its bin/), or None."""
    for d in (os.path.join(path, "bin"), path):
        if all(os.access(os.path.join(d, t), os.X_OK) for t in TOOLS):
            return d
    return None


def tools_cmake_args() -> list[str]:
    """llama-cpp-python's CMake flags with the tools on, and nothing that needs the network."""
    same = [x for x in shlex.split(llama_cmake_args()) if not x.startswith("-DLLAMA_BUILD_TOOLS=")]
    return ["-DCMAKE_BUILD_TYPE=Release", *same, "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]


def build_tools(src: str, build: str, jobs: int) -> str:
    """llama-imatrix and llama-quantize from the llama.cpp in src, built into build unless they are
    there already; returns the folder holding them."""
    found = tools_bin(build)
    if found:
        return found
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("build_tools: cmake not found: install cmake (and ninja) to build llama.cpp's "
                         "llama-imatrix and llama-quantize, or give --llama-tools a folder where they are built")
    if not os.path.isfile(os.path.join(src, "CMakeLists.txt")):
        raise SystemExit(f"build_tools: no llama.cpp sources in {src} (CMakeLists.txt missing)")
    os.makedirs(build, exist_ok=True)
    log = os.path.abspath(build).rstrip(os.sep) + "-build.log"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [[cmake, "-S", src, "-B", build, *generator, *tools_cmake_args()],
             [cmake, "--build", build, "--target", *TOOLS, "-j", str(jobs)]]
    print(f"building llama.cpp's {' and '.join(TOOLS)} into {build} (~15 min on 2 cores; log: {log})", file=sys.stderr)
    rc = 0
    with open(log, "w") as f:
        for cmd in steps:
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            rc = subprocess.run(["nice", "-n", "10", *cmd], stdout=f, stderr=subprocess.STDOUT).returncode
            if rc:
                break
    found = tools_bin(build)
    if rc or found is None:
        raise SystemExit(f"build_tools: building llama.cpp's tools in {build} failed (exit {rc}); "
                         f"the end of {log}:\n{_tail(log)}")
    return found


def default_imatrix_text() -> str:
    """The text the importance matrix is computed on unless --imatrix-text is given: this
    repository's README.md and docs/*.md, concatenated in name order."""
    paths = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    return "\n\n".join(open(p, encoding="utf-8").read() for p in paths)


def read_imatrix_text(path: str | None) -> str:
    if path is None:
        return default_imatrix_text()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"--imatrix-text {path}: cannot read it as UTF-8 text ({e})")
    if not text.strip():
        raise SystemExit(f"--imatrix-text {path}: the file is empty")
    return text


def _run_tool(bin_dir: str, tool: str, args: list[str], cwd: str) -> None:
    """One of llama.cpp's tools, run in cwd; its output is shown only when it fails."""
    cmd = [os.path.join(bin_dir, tool), *args]
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if r.returncode:
        tail = "\n".join(r.stdout.splitlines()[-25:])
        raise SystemExit(f"{tool} failed (exit {r.returncode}) in {cwd}: {shlex.join(cmd)}\n{tail}")


def make_imatrix(bin_dir: str, out_dir: str, text: str, threads: int) -> str:
    """OUT_DIR/llamacpp-imatrix.gguf from llama-imatrix on the F16 file over text, once per model;
    the text is kept beside it as llamacpp-imatrix.txt. Returns the matrix's name in out_dir."""
    mat, txt = "llamacpp-imatrix.gguf", "llamacpp-imatrix.txt"
    mat_path, txt_path = os.path.join(out_dir, mat), os.path.join(out_dir, txt)
    kept = None
    if os.path.exists(txt_path):
        with open(txt_path, encoding="utf-8", errors="replace") as f:
            kept = f.read()
    if os.path.exists(mat_path):
        if kept is not None and kept != text:
            raise SystemExit(f"make_imatrix: {mat_path} was computed on another text ({txt_path}); "
                             "delete both to recompute it on this one")
        return mat
    if kept != text:
        _atomic_text(text, txt_path)
    print(f"computing llama.cpp's importance matrix ({IMATRIX_CHUNKS} chunks of {IMATRIX_CTX} tokens) -> {mat_path}",
          file=sys.stderr)
    _atomic(lambda tmp: _run_tool(bin_dir, "llama-imatrix", [
        "-m", "llamacpp-f16.gguf", "-f", txt, "-o", os.path.basename(tmp), "--chunks", str(IMATRIX_CHUNKS),
        "-c", str(IMATRIX_CTX), "-t", str(threads)], out_dir), mat_path)
    return mat


def _atomic_text(text: str, out: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".part-", suffix=".txt", dir=os.path.dirname(out) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf", nargs="?", help="Hugging Face checkpoint directory")
    ap.add_argument("out", nargs="?", help="output directory")
    ap.add_argument("--src-only", action="store_true", help="download and unpack llama.cpp's converter into --src, then exit")
    ap.add_argument("--tools-only", action="store_true", help="build llama-imatrix and llama-quantize into --llama-tools, then exit")
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K", help=f"comma-separated: {', '.join(FTYPES)}")
    ap.add_argument("--pre", default="qwen2", help="tokenizer.ggml.pre for a tokenizer the converter does not know")
    ap.add_argument("--src", default=DEFAULT_SRC, help="where the llama-cpp-python sdist is unpacked")
    ap.add_argument("--llama-venv", default=DEFAULT_VENV, help="bench_vs_llamacpp.py's environment")
    ap.add_argument("--llama-tools", default=os.environ.get("RAPIDMOE_LLAMACPP_TOOLS") or DEFAULT_TOOLS,
                    help="build folder (or its bin/) of llama-imatrix and llama-quantize: used if they are "
                         "there, else built into it (default $RAPIDMOE_LLAMACPP_TOOLS, else %(default)s)")
    ap.add_argument("--imatrix-text", help="text for the importance matrix (default: the repository's README.md "
                                           "and docs/*.md)")
    ap.add_argument("--imatrix", help="a ready importance matrix (llama-imatrix's GGUF) instead of computing one")
    ap.add_argument("--from-gguf", help="quantize this F16/BF16 GGUF instead of llama.cpp's conversion of the checkpoint "
                                        "(for families its converter does not take from transformers: DeepSeek-V4)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    if a.src_only:
        print(llama_src(a.src))
        return 0
    if a.tools_only:
        print(tools_bin(a.llama_tools) or build_tools(llama_src(a.src), a.llama_tools, a.threads))
        return 0
    if not a.hf or not a.out:
        ap.error("give the checkpoint directory and the output directory")
    types = [t for t in a.types.split(",") if t]
    unknown = [t for t in types if t not in FTYPES]
    if unknown:
        ap.error(f"unknown type(s) {unknown}; choose from {', '.join(FTYPES)}")
    if a.threads < 1:
        ap.error(f"--threads {a.threads}: give at least 1")
    want_imatrix = [t for t in types if t in IMATRIX_TYPES]
    if a.imatrix and not os.path.isfile(a.imatrix):
        ap.error(f"--imatrix {a.imatrix}: no such file")
    if a.imatrix and a.imatrix_text:
        ap.error("give --imatrix or --imatrix-text, not both")
    text = read_imatrix_text(a.imatrix_text) if want_imatrix and not a.imatrix else None
    py = llama_python(a.llama_venv)
    if len(want_imatrix) < len(types) and not os.path.exists(py):
        raise SystemExit(f"no llama-cpp-python at {a.llama_venv}: run tools/bench_vs_llamacpp.py --install-only")
    if a.from_gguf and not os.path.isfile(a.from_gguf):
        ap.error(f"--from-gguf {a.from_gguf}: no such file")
    os.makedirs(a.out, exist_ok=True)
    f16 = a.from_gguf or os.path.join(a.out, "llamacpp-f16.gguf")
    src = None
    if not os.path.exists(f16):
        src = llama_src(a.src)
        print(f"converting {a.hf} with llama.cpp's converter -> {f16}", file=sys.stderr)
        extra = ["--no-mtp"] if _has_mtp_option(a.hf) else []
        _atomic(lambda tmp: subprocess.run([sys.executable, "-c", _CONVERT, src, a.pre, a.hf, "--outtype", "f16",
                                            "--outfile", tmp] + extra, check=True), f16)
    for t in types:
        out = os.path.join(a.out, f"llamacpp-{t.lower()}.gguf")
        if os.path.exists(out) or t in IMATRIX_TYPES:
            continue
        print(f"quantizing with llama.cpp -> {out}", file=sys.stderr)
        _atomic(lambda tmp: subprocess.run([py, "-c", _QUANTIZE, f16, tmp, str(FTYPES[t]), str(a.threads)],
                                           check=True), out)
    todo = [t for t in want_imatrix if not os.path.exists(os.path.join(a.out, f"llamacpp-{t.lower()}.gguf"))]
    if todo:
        bin_dir = tools_bin(a.llama_tools) or build_tools(src or llama_src(a.src), a.llama_tools, a.threads)
        mat = os.path.abspath(a.imatrix) if a.imatrix else make_imatrix(bin_dir, a.out, text, a.threads)
        for t in todo:
            out = os.path.join(a.out, f"llamacpp-{t.lower()}.gguf")
            print(f"quantizing with llama-quantize and the importance matrix -> {out}", file=sys.stderr)
            _atomic(lambda tmp: _run_tool(bin_dir, "llama-quantize", [
                "--imatrix", mat, "llamacpp-f16.gguf", os.path.basename(tmp), t, str(a.threads)], a.out), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
