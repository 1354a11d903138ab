#!/usr/bin/env python3
"""Write a large random Qwen3-MoE checkpoint (bf16, sharded safetensors + index, config.json,
tokenizer files) for converter and loader stress tests, tensor by tensor: memory stays near one
tensor whatever the size.

    python tools/make_big_checkpoint.py OUT_DIR [--size-gb 3.2] [--shard-mb 1000]

The layer count is chosen to reach --size-gb; the other dimensions are options (defaults give
~100 MB per layer, all multiples of 256 so every recipe's K-quants apply). The weights are random
normal (std 0.02; norm weights 1 +- 0.1): fit for measuring speed, memory and quantization error,
not for generating text. Needs numpy and tokenizers only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

VOCAB = 512


def tensor_list(n_layer: int, hidden: int, n_head: int, n_kv: int, head_dim: int,
                n_expert: int, expert_ff: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    t = [("model.embed_tokens.weight", (vocab, hidden))]
    for b in range(n_layer):
        p = f"model.layers.{b}."
        t += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (n_head * head_dim, hidden)),
            (p + "self_attn.k_proj.weight", (n_kv * head_dim, hidden)),
            (p + "self_attn.v_proj.weight", (n_kv * head_dim, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, n_head * head_dim)),
            (p + "self_attn.q_norm.weight", (head_dim,)),
            (p + "self_attn.k_norm.weight", (head_dim,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate.weight", (n_expert, hidden)),
        ]
        for x in range(n_expert):
            e = p + f"mlp.experts.{x}."
            t += [(e + "gate_proj.weight", (expert_ff, hidden)),
                  (e + "up_proj.weight", (expert_ff, hidden)),
                  (e + "down_proj.weight", (hidden, expert_ff))]
    t += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return t


def random_bf16(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> bytes:
    x = rng.standard_normal(math.prod(shape), dtype=np.float32)
    x = 1.0 + 0.1 * x if name.endswith("norm.weight") else 0.02 * x
    bits = x.view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return bits.astype("<u2").tobytes()


_DTYPE_BYTES = {"BF16": 2, "I64": 8, "I32": 4}


def write_shards(out: str, tensors: list[tuple[str, tuple[int, ...]]], shard_bytes: int,
                 seed: int, tensor_bytes=random_bf16) -> None:
    """Sharded bf16 safetensors plus model.safetensors.index.json, one tensor in memory at a time;
    tensor_bytes(rng, name, shape) makes each tensor's bytes. An entry (name, shape, dtype) names
    another safetensors dtype (I64, I32) for that tensor."""
    shards: list[list[tuple[str, tuple[int, ...], str]]] = [[]]
    size = 0
    for name, shape, *rest in tensors:
        dtype = rest[0] if rest else "BF16"
        n = _DTYPE_BYTES[dtype] * math.prod(shape)
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape, dtype))
        size += n
    rng = np.random.default_rng(seed)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name, shape, dtype in shard:
            n = _DTYPE_BYTES[dtype] * math.prod(shape)
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = fname
        header["__metadata__"] = {"format": "pt"}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(os.path.join(out, fname), "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            for name, shape, _ in shard:
                f.write(tensor_bytes(rng, name, shape))
        total += offset
        print(f"{fname}: {len(shard)} tensors, {offset / 1e6:.1f} MB", file=sys.stderr)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


def write_tokenizer(out: str, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = ["The quick brown fox jumps over the lazy dog. " * 4,
              "Mixture-of-experts models route each token to a few experts; 0123456789."] * 10
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    n = tok.get_vocab_size()
    if n < vocab:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(vocab - n)])
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
           "chat_template": "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                            "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                            "{{ '<|im_start|>assistant\\n' }}{% endif %}"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (created)")
    ap.add_argument("--size-gb", type=float, default=3.2, help="at least this many GB of weights")
    ap.add_argument("--shard-mb", type=float, default=1000, help="largest shard, MB")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--experts-used", type=int, default=4)
    ap.add_argument("--expert-ff", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    dims = dict(hidden=a.hidden, n_head=a.heads, n_kv=a.kv_heads, head_dim=a.head_dim,
                n_expert=a.experts, expert_ff=a.expert_ff, vocab=VOCAB)
    per_layer = 2 * sum(math.prod(s) for _, s in tensor_list(1, **dims) if ".layers." in _)
    fixed = 2 * sum(math.prod(s) for n, s in tensor_list(0, **dims))
    n_layer = max(1, math.ceil((a.size_gb * 1e9 - fixed) / per_layer))
    os.makedirs(a.out, exist_ok=True)
    tensors = tensor_list(n_layer, **dims)
    total = 2 * sum(math.prod(s) for _, s in tensors)
    print(f"{n_layer} layers, {total / 1e9:.3f} GB", file=sys.stderr)

    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "dtype": "bfloat16",
        "vocab_size": VOCAB, "hidden_size": a.hidden, "intermediate_size": 4 * a.hidden,
        "moe_intermediate_size": a.expert_ff, "num_hidden_layers": n_layer,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
        "num_experts": a.experts, "num_experts_per_tok": a.experts_used, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_shards(a.out, tensors, int(a.shard_mb * 1e6), a.seed)
    write_tokenizer(a.out, VOCAB)
    return 0


if __name__ == "__main__":
    sys.exit(main())
