#!/usr/bin/env python3
"""Write the GGUF files users download, made by llama.cpp's own converter and quantizer, from a
Hugging Face checkpoint (e.g. the benchmark model of tools/make_bench_model.py).

    python tools/make_llamacpp_files.py HF_DIR OUT_DIR [--types Q4_K_M,Q5_K_M,Q6_K,Q8_0,Q4_0]
    python tools/make_llamacpp_files.py --src-only     # just download and unpack the converter

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

IQ2_XXS, IQ2_XS and IQ1_* need an importance matrix, which this tool does not make.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile

from bench_vs_llamacpp import DEFAULT_VENV, LLAMA_CPP_VERSION, llama_python

# llama.cpp's llama_ftype values (include/llama.h) for the files we benchmark
FTYPES = {"F16": 1, "Q4_0": 2, "Q8_0": 7, "Q3_K_M": 12, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
          "Q5_K_M": 17, "Q6_K": 18, "IQ3_XXS": 23, "IQ4_NL": 25, "IQ3_S": 26, "IQ4_XS": 30,
          "MXFP4_MOE": 38}   # MXFP4_MOE: MXFP4 experts, Q8_0 elsewhere (gpt-oss, make_bench_model.py --arch gpt-oss)
DEFAULT_SRC = os.path.join(os.path.expanduser("~"), ".cache", "rapidmoe", "llamacpp-src")

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
                    "--no-deps", "--no-binary", ":all:", "-d", cache], check=True)
    tars = glob.glob(os.path.join(cache, f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"))
    if not tars:
        raise SystemExit(f"no sdist of llama-cpp-python {LLAMA_CPP_VERSION} in {cache}")
    subprocess.run(["tar", "xzf", tars[0], "-C", cache], check=True)
    return root


def _has_mtp_option(hf: str) -> bool:
    """Qwen3.5-MoE and Qwen3-Next: llama.cpp's converter wants an MTP block unless told --no-mtp,
    and a checkpoint made by transformers (the benchmark model's) has none."""
    import json

    with open(os.path.join(hf, "config.json"), encoding="utf-8") as f:
        archs = json.load(f).get("architectures") or []
    return any(n in ("Qwen3_5MoeForCausalLM", "Qwen3NextForCausalLM") for n in archs)


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf", nargs="?", help="Hugging Face checkpoint directory")
    ap.add_argument("out", nargs="?", help="output directory")
    ap.add_argument("--src-only", action="store_true", help="download and unpack llama.cpp's converter into --src, then exit")
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K", help=f"comma-separated: {', '.join(FTYPES)}")
    ap.add_argument("--pre", default="qwen2", help="tokenizer.ggml.pre for a tokenizer the converter does not know")
    ap.add_argument("--src", default=DEFAULT_SRC, help="where the llama-cpp-python sdist is unpacked")
    ap.add_argument("--llama-venv", default=DEFAULT_VENV, help="bench_vs_llamacpp.py's environment")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    if a.src_only:
        print(llama_src(a.src))
        return 0
    if not a.hf or not a.out:
        ap.error("give the checkpoint directory and the output directory")
    types = [t for t in a.types.split(",") if t]
    unknown = [t for t in types if t not in FTYPES]
    if unknown:
        ap.error(f"unknown type(s) {unknown}; choose from {', '.join(FTYPES)}")
    os.makedirs(a.out, exist_ok=True)
    f16 = os.path.join(a.out, "llamacpp-f16.gguf")
    if not os.path.exists(f16):
        src = llama_src(a.src)
        print(f"converting {a.hf} with llama.cpp's converter -> {f16}", file=sys.stderr)
        extra = ["--no-mtp"] if _has_mtp_option(a.hf) else []
        _atomic(lambda tmp: subprocess.run([sys.executable, "-c", _CONVERT, src, a.pre, a.hf, "--outtype", "f16",
                                            "--outfile", tmp] + extra, check=True), f16)
    py = llama_python(a.llama_venv)
    if not os.path.exists(py):
        raise SystemExit(f"no llama-cpp-python at {a.llama_venv}: run tools/bench_vs_llamacpp.py --install-only")
    for t in types:
        out = os.path.join(a.out, f"llamacpp-{t.lower()}.gguf")
        if os.path.exists(out):
            continue
        print(f"quantizing with llama.cpp -> {out}", file=sys.stderr)
        _atomic(lambda tmp: subprocess.run([py, "-c", _QUANTIZE, f16, tmp, str(FTYPES[t]), str(a.threads)],
                                           check=True), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
