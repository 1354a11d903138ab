#!/usr/bin/env python3
"""Time to first token of a chat's next turn, with the cached prefix reused against a cold prefill.

A conversation holds HISTORY tokens (the repository's README, tokenized, as the text of earlier
turns) and the model has answered it. The next turn adds TURN new tokens. With prefix reuse the
session keeps the history in its KV cache and evaluates only the new tokens (as `rapidmoe chat`,
the server's slots and `Model.generate` do); cold, it evaluates the whole conversation from an
empty cache (``reuse_prefix = False``, as every request did before prefix reuse). Both run in the
same process on the same session, alternating, and the tool prints the median of each and their
ratio.

    python tools/bench_prefix_reuse.py MODEL.gguf [--history 1000] [--turn 24] [--runs 5] [--threads 2]

The hybrid architectures (Qwen3.5-MoE, Qwen3-Next) go back to the checkpoint of their recurrent
states at the end of the last prompt (docs/ARCHITECTURE.md): where the cache still ends inside
the new prompt they keep all of it, otherwise they re-evaluate from that checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from rapidmoe_gguf import Model
from rapidmoe_gguf.sampling import SamplingParams

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def history_tokens(model: Model, n: int) -> list[int]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    ids = model.tokenize(text)
    while len(ids) < n:
        ids += model.tokenize(text, add_special=False)
    return ids[:n]


def first_token_s(model: Model, prompt: list[int], reuse: bool) -> tuple[float, int]:
    """Seconds from the call to the first generated token, and how many prompt tokens were kept."""
    model.reuse_prefix = reuse
    greedy = SamplingParams(temperature=0.0)
    t0 = time.perf_counter()
    it = model.generate_tokens(prompt, 1, greedy, stop_ids=set())
    next(it)
    dt = time.perf_counter() - t0
    for _ in it:
        pass
    return dt, model.last_timings["prompt_reused"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--history", type=int, default=1000, help="tokens of earlier turns")
    ap.add_argument("--turn", type=int, default=24, help="new tokens of the next turn")
    ap.add_argument("--answer", type=int, default=16, help="tokens the model answers the history with")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.history < 1 or a.turn < 1 or a.runs < 1:
        ap.error("--history, --turn and --runs must be at least 1")
    model = Model(a.model, n_ctx=a.history + a.answer + a.turn + 64, n_threads=a.threads)
    hist = history_tokens(model, a.history)
    turn = history_tokens(model, a.history + a.turn)[a.history:]
    greedy = SamplingParams(temperature=0.0)
    warm, cold, kept = [], [], []
    for _ in range(a.runs):
        # the earlier turns and the model's answer, as the chat left them
        model.reuse_prefix = False
        answer = list(model.generate_tokens(hist, a.answer, greedy, stop_ids=set()))
        prompt = hist + answer + turn
        dt, k = first_token_s(model, prompt, reuse=True)
        warm.append(dt)
        kept.append(k)
        dt, _ = first_token_s(model, prompt, reuse=False)
        cold.append(dt)
    w, c = statistics.median(warm), statistics.median(cold)
    print(f"{os.path.basename(a.model)}: {a.threads} threads, history {a.history} tokens + answer {a.answer}, "
          f"next turn {a.turn} tokens, median of {a.runs}")
    print(f"  time to first token, prefix reused: {w * 1e3:.1f} ms ({statistics.median(kept)} tokens kept)")
    print(f"  time to first token, cold prefill:  {c * 1e3:.1f} ms")
    print(f"  cold / reused: {c / w:.1f}x")
    if statistics.median(kept) == 0:
        print("  (no prefix was reused)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "history": a.history, "answer": a.answer,
                       "turn": a.turn, "runs": a.runs, "ttft_reused_s": warm, "ttft_cold_s": cold,
                       "kept": kept}, f, indent=1)


if __name__ == "__main__":
    main()
