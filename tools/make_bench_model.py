#!/usr/bin/env python3
"""Write the benchmark model: a random-weight Qwen3-MoE checkpoint with Qwen3-30B-A3B's per-layer
shapes, and its GGUF conversions.

Shapes per layer are those of Qwen3-30B-A3B (hidden 2048, 128 experts, top-8 with renormalised
weights, expert FFN 768, 32 query and 4 KV heads of dim 128); the model has 4 layers and a
32000-token vocabulary: 2.62 B parameters, about 0.29 B of them read per decoded token. Weights
are N(0, 0.02) (norm weights 1), stored as bf16: fit for measuring speed and memory, not for
generating text. The tokenizer is a byte-level BPE with Qwen2's pre-tokenizer, trained in seconds
on local text; the config's vocab_size pads the vocabulary to 32000.

    python tools/make_bench_model.py OUT_DIR                      # checkpoint + GGUF files
    python tools/make_bench_model.py OUT_DIR --layers 1 --experts 16 --check   # small, for development
    python tools/make_bench_model.py OUT_DIR --arch gpt-oss       # gpt-oss-20b's shapes

``--arch gpt-oss`` writes a GptOssForCausalLM instead, with gpt-oss-20b's per-layer shapes (hidden
2880, 32 experts, top-4, expert FFN 2880, 64 query and 8 KV heads of 64, sliding window 128 on
every other layer, YaRN factor 32 over 4096, attention sinks and biases), 4 layers, the same
vocabulary: its experts fused per layer (gate_up_proj, down_proj) as transformers stores them.
Rows of 2880 are no multiple of 256, so K-quant recipes fall back to 32-element types there; the
gpt-oss formats are mxfp4 (llama.cpp's MXFP4_MOE layout) and q8_0.

OUT_DIR/hf is the Hugging Face checkpoint (config.json, sharded model safetensors + index,
tokenizer.json, tokenizer_config.json), written tensor by tensor so memory stays near one tensor.
Then rapidmoe_gguf.convert writes OUT_DIR/bench-<name>.gguf for each --formats entry:

    q4_0     Q4_0 experts, no residual        q8_0     Q8_0 everywhere
    q4_k     Q4_K experts, no residual        q4k-q8   Q4_K experts + a Q8_0 residual sidecar

``--check`` loads the checkpoint with transformers' Qwen3MoeForCausalLM and runs a forward pass
(small models only: it materialises the model in float32).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import sys
import time

import numpy as np

from make_big_checkpoint import write_shards  # the sharded bf16 writer (tools/)

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# name -> (recipe, convert() overrides)
FORMATS = {
    "q4_0": ("q4_0-q4_0", {"residual_type": "none"}),
    "q8_0": ("q8_0", {}),
    "q4_k": ("q4k-q8", {"residual_type": "none"}),
    "q4k-q8": ("q4k-q8", {}),
    "mxfp4": ("mxfp4", {}),
    "mxfp4-q8": ("mxfp4-q8", {}),
}
# --arch: (the defaults it changes, the formats written by default)
ARCH_DEFAULTS = {
    "qwen3moe": ({}, "q4_0,q8_0,q4_k,q4k-q8"),
    "gpt-oss": (dict(experts=32, experts_used=4, hidden=2880, expert_ff=2880, heads=64, kv_heads=8, head_dim=64),
                "mxfp4,q8_0"),
}


def hf_config(a) -> dict:
    """config.json, through transformers' own Qwen3MoeConfig (or GptOssConfig) so that every field
    is spelled as it spells it."""
    from transformers import GptOssConfig, Qwen3MoeConfig

    if a.arch == "gpt-oss":
        cfg = GptOssConfig(
            vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.expert_ff, num_hidden_layers=a.layers,
            num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
            num_local_experts=a.experts, num_experts_per_tok=a.experts_used, sliding_window=128,
            max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=0,
            eos_token_id=2, torch_dtype="bfloat16",
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096})
        d = cfg.to_dict()
        d["architectures"] = ["GptOssForCausalLM"]
        return d

    cfg = Qwen3MoeConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=6144, moe_intermediate_size=a.expert_ff,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim, num_experts=a.experts, num_experts_per_tok=a.experts_used, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2,
        torch_dtype="bfloat16",
    )
    d = cfg.to_dict()
    d["architectures"] = ["Qwen3MoeForCausalLM"]
    return d


def tensor_list(a) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the checkpoint, with its shape, in the original per-expert layout."""
    if a.arch == "gpt-oss":
        return gpt_oss_tensor_list(a)
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p = f"model.layers.{b}."
        t += [(p + "input_layernorm.weight", (a.hidden,)),
              (p + "self_attn.q_proj.weight", (q, a.hidden)),
              (p + "self_attn.k_proj.weight", (kv, a.hidden)),
              (p + "self_attn.v_proj.weight", (kv, a.hidden)),
              (p + "self_attn.o_proj.weight", (a.hidden, q)),
              (p + "self_attn.q_norm.weight", (a.head_dim,)),
              (p + "self_attn.k_norm.weight", (a.head_dim,)),
              (p + "post_attention_layernorm.weight", (a.hidden,)),
              (p + "mlp.gate.weight", (a.experts, a.hidden))]
        for x in range(a.experts):
            e = p + f"mlp.experts.{x}."
            t += [(e + "gate_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "up_proj.weight", (a.expert_ff, a.hidden)),
                  (e + "down_proj.weight", (a.hidden, a.expert_ff))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


def gpt_oss_tensor_list(a) -> list[tuple[str, tuple[int, ...]]]:
    """gpt-oss's tensors: biased attention with sinks, a biased router, each layer's experts fused
    (gate and up interleaved in gate_up_proj, matrices as (in, out))."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    t = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
    for b in range(a.layers):
        p = f"model.layers.{b}."
        s, m = p + "self_attn.", p + "mlp."
        t += [(p + "input_layernorm.weight", (a.hidden,)),
              (s + "q_proj.weight", (q, a.hidden)), (s + "q_proj.bias", (q,)),
              (s + "k_proj.weight", (kv, a.hidden)), (s + "k_proj.bias", (kv,)),
              (s + "v_proj.weight", (kv, a.hidden)), (s + "v_proj.bias", (kv,)),
              (s + "o_proj.weight", (a.hidden, q)), (s + "o_proj.bias", (a.hidden,)),
              (s + "sinks", (a.heads,)),
              (p + "post_attention_layernorm.weight", (a.hidden,)),
              (m + "router.weight", (a.experts, a.hidden)), (m + "router.bias", (a.experts,)),
              (m + "experts.gate_up_proj", (a.experts, a.hidden, 2 * a.expert_ff)),
              (m + "experts.gate_up_proj_bias", (a.experts, 2 * a.expert_ff)),
              (m + "experts.down_proj", (a.experts, a.expert_ff, a.hidden)),
              (m + "experts.down_proj_bias", (a.experts, a.hidden))]
    t += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
    return t


def bf16_bytes(x: np.ndarray) -> bytes:
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()  # round to nearest even


def bench_bf16(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> bytes:
    """Norm weights 1, every other weight N(0, 0.02)."""
    if name.endswith("norm.weight"):
        return bf16_bytes(np.ones(shape, np.float32))
    return bf16_bytes(rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))


def corpus(max_bytes: int = 8 << 20):
    """Local English text: the GCIDE dictionary when installed, else Python's own sources."""
    gcide = "/usr/share/dictd/gcide.dict.dz"
    if os.path.exists(gcide):
        with gzip.open(gcide, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read(max_bytes)
        yield from text.splitlines()
        return
    n = 0
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        yield from text.splitlines()
        n += len(text)
        if n > max_bytes:
            return


def write_tokenizer(out: str, n_tokens: int) -> int:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=n_tokens, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False, "add_eos_token": False,
           "model_max_length": 40960, "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return tok.get_vocab_size()


def check_with_transformers(hf: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(hf)
    ids = tok("The quick brown fox jumps over the lazy dog.", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()
    print(f"  transformers: loaded, {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params, "
          f"logits {tuple(logits.shape)} finite", file=sys.stderr)


def convert_all(hf: str, out: str, formats: list[str], threads: int) -> dict[str, str]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the source tree
    try:
        from rapidmoe_gguf import convert
    except ImportError as exc:
        raise SystemExit(f"cannot import rapidmoe_gguf.convert ({exc}): build the package, then rerun to convert")
    written = {}
    for name in formats:
        recipe, kw = FORMATS[name]
        path = os.path.join(out, f"bench-{name}.gguf")
        t0 = time.perf_counter()
        convert(hf, path, recipe, n_threads=threads, **kw)
        print(f"  {os.path.basename(path)}: {os.path.getsize(path) / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
        written[name] = path
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (created)")
    ap.add_argument("--arch", choices=sorted(ARCH_DEFAULTS), default="qwen3moe",
                    help="the architecture and its default shapes (default: %(default)s)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--experts-used", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--expert-ff", type=int, default=768)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32000, help="config vocab_size (the model's rows)")
    ap.add_argument("--tokenizer-size", type=int, default=8000, help="tokens the BPE learns (<= --vocab)")
    ap.add_argument("--formats", default=None, help=f"comma-separated: {', '.join(FORMATS)}; "
                    "empty writes only the checkpoint (default: q4_0,q8_0,q4_k,q4k-q8; gpt-oss: mxfp4,q8_0)")
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=0, help="quantizer threads (0: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="load the checkpoint with transformers (small models)")
    ap.add_argument("--force", action="store_true", help="rewrite the checkpoint if it exists")
    pre = ap.parse_known_args(argv)[0]
    shapes, default_formats = ARCH_DEFAULTS[pre.arch]
    ap.set_defaults(**shapes)                       # the arch's shapes unless given on the command line
    a = ap.parse_args(argv)
    formats = [f for f in (default_formats if a.formats is None else a.formats).split(",") if f]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        ap.error(f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}")
    if a.tokenizer_size > a.vocab:
        ap.error("--tokenizer-size must not exceed --vocab")

    hf = os.path.join(a.out, "hf")
    os.makedirs(hf, exist_ok=True)
    tensors = tensor_list(a)
    n_params = sum(math.prod(s) for _, s in tensors)
    done = os.path.exists(os.path.join(hf, "model.safetensors.index.json"))
    if done and not a.force:
        print(f"{hf}: checkpoint exists (use --force to rewrite)", file=sys.stderr)
    else:
        print(f"{hf}: {n_params / 1e9:.3f} B parameters, {2 * n_params / 1e9:.2f} GB bf16", file=sys.stderr)
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump(hf_config(a), f, indent=2)
        n_tok = write_tokenizer(hf, a.tokenizer_size)
        print(f"  tokenizer: {n_tok} tokens (vocab padded to {a.vocab})", file=sys.stderr)
        write_shards(hf, tensors, int(a.shard_gb * 1e9), a.seed, bench_bf16)
    if a.check:
        check_with_transformers(hf)
    if formats:
        convert_all(hf, a.out, formats, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
