"""llama.cpp as an oracle for the tests: its own converter (convert_hf_to_gguf.py from the
llama-cpp-python sdist), its quantizer and its engine (llama-cpp-python).

They are found where `tools/bench_vs_llamacpp.py --install-only` and `tools/make_llamacpp_files.py
--src-only` put them (CI runs both first), or at $LLAMA_CPP_PYTHON (an interpreter with llama_cpp)
and $LLAMA_CPP_SRC (the vendored llama.cpp folder). Tests that need them are marked `needs` and skip
where they are absent. llama.cpp's llama-imatrix and llama-quantize (for the types that need an
importance matrix) are built only by `tools/make_llamacpp_files.py --tools-only` (CI does not), into
~/.cache/rapidmoe/llamacpp-tools or $RAPIDMOE_LLAMACPP_TOOLS; tests that need them are marked
`needs_tools`. The child scripts and paths are the tools' own, loaded from tools/ without
putting that folder on sys.path.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _tool(name: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


_bench = _tool("bench_vs_llamacpp")
_files = _tool("make_llamacpp_files")
FTYPES = _files.FTYPES


@functools.cache
def python() -> str | None:
    """An interpreter that imports llama_cpp, or None."""
    py = os.environ.get("LLAMA_CPP_PYTHON") or _bench.llama_python(_bench.DEFAULT_VENV)
    if not os.path.exists(py):
        return None
    return py if subprocess.run([py, "-c", "import llama_cpp"], capture_output=True).returncode == 0 else None


@functools.cache
def src() -> str | None:
    """The folder holding llama.cpp's convert_hf_to_gguf.py, or None."""
    path = os.environ.get("LLAMA_CPP_SRC") or os.path.join(
        _files.DEFAULT_SRC, f"llama_cpp_python-{_bench.LLAMA_CPP_VERSION}", "vendor", "llama.cpp")
    return path if os.path.isfile(os.path.join(path, "convert_hf_to_gguf.py")) else None


def ready() -> bool:
    return python() is not None and src() is not None


needs = pytest.mark.skipif(not ready(), reason="llama.cpp is not at hand: run tools/bench_vs_llamacpp.py "
                           "--install-only and tools/make_llamacpp_files.py --src-only, or set "
                           "LLAMA_CPP_PYTHON and LLAMA_CPP_SRC")


@functools.cache
def tools() -> str | None:
    """The folder of built llama-imatrix and llama-quantize, or None."""
    return _files.tools_bin(os.environ.get("RAPIDMOE_LLAMACPP_TOOLS") or _files.DEFAULT_TOOLS)


needs_tools = pytest.mark.skipif(tools() is None, reason="llama.cpp's llama-imatrix and llama-quantize are not "
                                 "built: run tools/make_llamacpp_files.py --tools-only, or set "
                                 "RAPIDMOE_LLAMACPP_TOOLS to a build of them")


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd[:1] + cmd[3:6])}... failed:\n{r.stderr[-3000:]}"


def convert(hf_dir, out, pre: str, outtype: str = "f32", extra: tuple[str, ...] = ()) -> Path:
    """llama.cpp's converter on a checkpoint; a test tokenizer has no fingerprint llama.cpp knows,
    so its pre-tokenizer name is given (the converter's files are not edited)."""
    _run([sys.executable, "-c", _files._CONVERT, src(), pre, str(hf_dir), "--outtype", outtype,
          "--outfile", str(out), *extra])
    return Path(out)


def quantize(path, out, ftype: str, threads: int = 2) -> Path:
    """llama.cpp's quantizer: ftype is a name of tools/make_llamacpp_files.py's FTYPES."""
    _run([python(), "-c", _files._QUANTIZE, str(path), str(out), str(FTYPES[ftype]), str(threads)])
    return Path(out)


# every position's logits with an F32 KV cache; YaRN's betas from the file (-1), which
# llama-cpp-python's own defaults would otherwise override
_LOGITS = r"""
import sys, json, numpy as np
from llama_cpp import Llama
path, ids, n_ctx, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True, n_threads=2,
            type_k=0, type_v=0, yarn_beta_fast=-1, yarn_beta_slow=-1, verbose=False)
llm.eval(ids)
np.save(out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
"""


def logits(path, ids, tmp_path, n_ctx: int | None = None) -> np.ndarray:
    """llama.cpp's logits of every position of ids, one batch."""
    npy = Path(tmp_path) / "llamacpp-logits.npy"
    ids = [int(t) for t in ids]
    _run([python(), "-c", _LOGITS, str(path), json.dumps(ids), str(n_ctx or len(ids) + 8), str(npy)])
    return np.load(npy)
