#!/usr/bin/env python3
"""Turns a finished tools/train_tiny_moe.py run into the model bundled with the package.

    python tools/ship_tiny_moe.py --run runs/tiny-moe

1. converts RUN/hf with our converter to a RESplit pair (recipe q4k-q8: Q4_K expert bases, Q8_0
   residuals, Q8_0 for the other matrices) at rapidmoe_gguf/models/tiny-moe{,.residual}.gguf;
2. records how the model was made (corpus, licence, seed, steps, held-out perplexity) in the base
   file's ``rapidmoe.training.*`` keys;
3. calibrates UMIA on training text (never the held-out text) and stores the tables in the sidecar;
4. copies the held-out text beside the model, for `rapidmoe perplexity` and the quality study.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rapidmoe_gguf import convert  # noqa: E402
from rapidmoe_gguf.bundled import BUNDLED_NAME, MODEL_DIR  # noqa: E402
from rapidmoe_gguf.evaluate import calibrate, rewrite_with_kv  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="the output folder of tools/train_tiny_moe.py")
    ap.add_argument("--recipe", default="q4k-q8")
    ap.add_argument("--calib-tokens", type=int, default=8192, help="training tokens used to calibrate UMIA")
    ap.add_argument("--out-dir", default=MODEL_DIR)
    args = ap.parse_args()

    run = Path(args.run)
    info = json.loads((run / "train_info.json").read_text())
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, BUNDLED_NAME)
    report = convert(run / "hf", base, recipe=args.recipe, progress=False)
    print(f"converted: {report.base_path} + {report.residual_path} "
          f"(experts {report.bpw_base:.3f} bpw base, {report.bpw_total:.3f} bpw with residual)")

    rewrite_with_kv(base, {
        "general.name": "rapidmoe tiny-moe",
        "rapidmoe.training.corpus": f"{info['corpus']} ({info['corpus_license']})",
        "rapidmoe.training.seed": int(info["seed"]),
        "rapidmoe.training.steps": int(info["steps"]),
        "rapidmoe.training.tokens": int(info["tokens_seen"]),
        "rapidmoe.training.heldout_ppl": float(info["heldout_ppl"]),
        "rapidmoe.training.tool": "tools/train_tiny_moe.py",
    })

    # calibration text: the start of the training split (disjoint from the held-out text)
    with open(run / "train.txt", encoding="utf-8") as f:
        calib_text = f.read(args.calib_tokens * 6)
    calibrate(base, calib_text, n_ctx=256, max_tokens=args.calib_tokens)
    shutil.copyfile(run / "heldout.txt", os.path.join(args.out_dir, "tiny-moe.heldout.txt"))
    total = sum(os.path.getsize(os.path.join(args.out_dir, n)) for n in os.listdir(args.out_dir))
    print(f"shipped {args.out_dir}: {total / 2**20:.2f} MiB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
