#!/usr/bin/env python3
"""What a constraint (rapidmoe_gguf.grammar) costs per decoded token.

    python tools/bench_grammar.py [MODEL.gguf] [--tokens 128] [--runs 5] [--threads 2] [--grammar json|tools-auto]

Decodes the same number of tokens from the same prompt with and without a constraint, in
alternating runs on one loaded model, and prints the median decode tok/s of each and the
overhead. The constraint is a JSON object with one string of at least --tokens characters, so the
reply stays inside a string (where most tokens are allowed: the mask is the largest to compute)
for every measured step; the free runs ignore end-of-generation tokens so they decode as many.
MODEL defaults to the bundled model, whose forward pass is so short that the mask dominates: run
it on a model of the size you serve (tools/make_bench_model.py's, say) for a figure that means
something.

--grammar tools-auto measures instead the grammar of a request with tools under tool_choice auto
(rapidmoe_gguf.tool_grammar, hermes format) while the reply is still free text: the lazy
grammar's mask over text that has not opened a call (the model's vocabulary decides whether the
marker is one token, a mask of one token, or text, a lazy terminal over every token).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source tree
import rapidmoe_gguf as rm  # noqa: E402
from rapidmoe_gguf import grammar  # noqa: E402
from rapidmoe_gguf.bundled import bundled_model_path  # noqa: E402


def decode_tok_s(m: rm.Model, prompt: list[int], n: int, constrained: grammar.Grammar | None, seed: int) -> float:
    sampling = rm.SamplingParams(temperature=0.8, seed=seed)
    got = sum(1 for _ in m._generate(prompt, n, sampling, set(), None, None, constrained))
    t = m.last_timings
    if got != n:
        raise SystemExit(f"decoded {got} tokens, not {n}: raise the schema's minLength")
    return (t["gen_tokens"] - 1) / t["gen_s"]   # gen_s runs from the first token's sampling


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="a GGUF file (default: the bundled model)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--grammar", choices=("json", "tools-auto"), default="json")
    a = ap.parse_args(argv)
    path = a.model or bundled_model_path()
    with rm.Model(path, n_ctx=a.tokens + 64, n_threads=a.threads) as m:
        schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 8 * a.tokens}},
                  "required": ["text"], "additionalProperties": False}
        if a.grammar == "json":
            constrained = grammar.Grammar(m.tokenizer, schema)
            prompt = m.tokenize("Write a long story as JSON.")
        else:
            from rapidmoe_gguf import tool_calls, tool_grammar

            tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
            use = tool_calls.ToolUse(tool_calls.check_tools([tool]), "auto", True, tool_calls.HERMES)
            lark = tool_grammar.tool_call_lark(use, tool_grammar.Pieces(m.tokenizer), grammar.JSON_FORM)
            constrained = grammar.Grammar(m.tokenizer, where="tools", lark=lark)
            prompt = m.tokenize("Write a long story.")
        decode_tok_s(m, prompt, 8, constrained, 0)     # warm-up: pages in, the vocabulary given to the engine
        free, masked = [], []
        for r in range(a.runs):
            free.append(decode_tok_s(m, prompt, a.tokens, None, r))
            masked.append(decode_tok_s(m, prompt, a.tokens, constrained, r))
        f, g = statistics.median(free), statistics.median(masked)
        print(f"{os.path.basename(path)}: {a.grammar}, {a.tokens} tokens, {a.threads} threads, median of {a.runs} "
              "alternating runs")
        print(f"  free:        {f:8.1f} tok/s  ({min(free):.1f}..{max(free):.1f})")
        print(f"  constrained: {g:8.1f} tok/s  ({min(masked):.1f}..{max(masked):.1f})")
        print(f"  overhead: {100 * (f / g - 1):.1f} % per token (vocabulary {m.n_vocab})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
