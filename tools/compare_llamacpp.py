#!/usr/bin/env python3
"""Same GGUF file, two engines: llama.cpp (through llama-cpp-python) and rapidmoe.

    python tools/compare_llamacpp.py MODEL.gguf [-f TEXT] [--tokens 512] [--llama-python PY]

Both engines evaluate the same token ids (tokenized once, by our tokenizer) from an empty cache;
the tool reports the mean KL divergence KL(llama.cpp || ours) of the next-token distributions,
its 99th percentile, the largest logit difference, and top-1 agreement. Our engine runs base only
(llama.cpp never reads the residual sidecar).

llama-cpp-python compiles llama.cpp for a long time; it runs in its own interpreter (--llama-python,
default: the venv that tools/bench_vs_llamacpp.py builds under ~/.cache/rapidmoe), which writes the
logits to a .npy file for this process to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_LLAMA_PY = Path.home() / ".cache" / "rapidmoe" / "llamacpp-venv" / "bin" / "python"

LLAMA_CHILD = r"""
import sys, json, numpy as np
from llama_cpp import Llama
path, ids_file, out, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ids = json.load(open(ids_file))
llm = Llama(model_path=path, n_ctx=len(ids) + 8, n_batch=len(ids), logits_all=True,
            n_threads=threads, verbose=False)
llm.eval(ids)
np.save(out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
"""


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main() -> int:
    import rapidmoe_gguf as rm
    from rapidmoe_gguf.bundled import bundled_heldout_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-f", "--file", default=None, help="text (default: the bundled held-out text)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-python", default=str(DEFAULT_LLAMA_PY))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    text = Path(args.file or bundled_heldout_path()).read_text(encoding="utf-8")
    with rm.Model(args.model, n_ctx=args.tokens + 8, n_threads=args.threads, residual=None) as m:
        ids = m.tokenize(text)[: args.tokens]
        ours = m.eval_logits(ids)
    with tempfile.TemporaryDirectory() as tmp:
        ids_file, out = os.path.join(tmp, "ids.json"), os.path.join(tmp, "llama.npy")
        Path(ids_file).write_text(json.dumps(ids))
        subprocess.run([args.llama_python, "-c", LLAMA_CHILD, args.model, ids_file, out, str(args.threads)],
                       check=True)
        theirs = np.load(out)
    lt, lo = log_softmax(theirs), log_softmax(ours)
    kl = (np.exp(lt) * (lt - lo)).sum(-1)
    result = {
        "model": args.model, "tokens": len(ids),
        "kld_mean": float(kl.mean()), "kld_p99": float(np.percentile(kl, 99)),
        "max_abs_logit_diff": float(np.abs(theirs - ours).max()),
        "top1": float((theirs.argmax(-1) == ours.argmax(-1)).mean()),
    }
    print(f"{args.model}: {len(ids)} tokens | KLD mean {result['kld_mean']:.3e} p99 {result['kld_p99']:.3e} | "
          f"max |dlogit| {result['max_abs_logit_diff']:.3e} | top-1 {result['top1']:.4f}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
