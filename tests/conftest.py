"""Shared fixtures: tiny random MoE checkpoints of every supported architecture, made with
transformers at test time (no downloads), and a tiny byte-level BPE tokenizer.

``tiny_hf(arch, dtype="float32", **overrides)`` (session-scoped, cached) returns the directory of
a saved checkpoint: config.json, model.safetensors, tokenizer.json, tokenizer_config.json (with a
ChatML chat template). ``arch`` is a transformers model_type from ``TINY_ARCHS``. Sizes are chosen
so K-quants apply (hidden 256, expert FF 256 or 512: multiples of 256), with 2 layers, 4 experts,
top-2 and a 320-entry vocabulary. Weights are random normal (std 0.05; norm weights 1 +- 0.1),
never zero, so every tensor carries information.

For the IQ types, which nothing here can quantize: ``random_iq_blocks`` and ``random_iq_weights``
(random valid blocks), and ``write_gguf_like`` to put them into a copy of a converted file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

# The suite's numbers are F32 math held against float oracles (transformers' logits, llama.cpp's,
# the scalar kernel set): its sessions keep an F32 KV cache unless a test asks for a type (the
# default, F16, and every other type have tests of their own: test_kv_cache.py). Subprocesses
# inherit it.
os.environ.setdefault("RAPIDMOE_CACHE_TYPE_K", "f32")
os.environ.setdefault("RAPIDMOE_CACHE_TYPE_V", "f32")


@pytest.fixture(autouse=True)
def _restore_sys_path():
    """The tools a test imports may put the source tree on sys.path; later tests, and the
    subprocesses they start with this process's path, must not see it (in an installed run the
    tree has no native library)."""
    saved = sys.path[:]
    yield
    sys.path[:] = saved

TINY_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")

# transformers model_type -> GGUF general.architecture
GGUF_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "olmoe": "olmoe"}

VOCAB = 320  # model vocab_size == tokenizer size, so no padding question arises
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Mixture-of-experts models route each token to a few experts.",
    "A residual holds the precision that the quantized base lost.",
    "hello world, hello experts; 0123456789 + - * / = ( ) [ ] { }",
    "Les modèles de langage prédisent le prochain jeton. Ünïcödé ✓ 漢字",
] * 20


def _base_config(arch: str) -> dict:
    common = dict(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=2, pad_token_id=0)
    if arch == "mixtral":
        return dict(common, intermediate_size=512, num_local_experts=4, num_experts_per_tok=2,
                    rope_theta=1e6)
    if arch == "qwen2_moe":
        return dict(common, intermediate_size=512, moe_intermediate_size=256,
                    shared_expert_intermediate_size=512, num_experts=4, num_experts_per_tok=2,
                    norm_topk_prob=False)
    if arch == "qwen3_moe":
        return dict(common, intermediate_size=512, moe_intermediate_size=256, head_dim=64,
                    num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    if arch == "olmoe":
        # OLMoE's k_norm is {n_kv_heads*head_dim} and llama.cpp expects {n_embd}: use n_kv = n_head.
        return dict(common, num_key_value_heads=4, intermediate_size=256, num_experts=4,
                    num_experts_per_tok=2, norm_topk_prob=False)
    raise ValueError(f"unknown tiny arch {arch!r}; choose from {TINY_ARCHS}")


def make_tiny_tokenizer(out_dir: str | os.PathLike[str]) -> None:
    """Train a ~300-entry byte-level BPE and save tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    n = tok.get_vocab_size()
    if n < VOCAB:  # the corpus ran out of merges: fill with reserved special tokens
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(VOCAB - n)])
    assert tok.get_vocab_size() == VOCAB
    out = Path(out_dir)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "add_bos_token": False, "add_eos_token": False,
        "model_max_length": 512, "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def make_tiny_hf(out_dir: str | os.PathLike[str], arch: str, dtype: str = "float32", *,
                 seed: int = 0, max_shard_size: str | None = None, tokenizer: bool = True,
                 weight_std: float = 0.05, head_std: float | None = None,
                 **overrides) -> Path:
    """Save a tiny random ``arch`` checkpoint (transformers model_type) to ``out_dir``.

    ``weight_std`` scales the random matrices (0.02 is transformers' own initializer range) and
    ``head_std`` the output head (default: weight_std), which sets how peaked the logits are;
    ``overrides`` replace config fields (e.g. ``moe_intermediate_size=288``); ``dtype`` is
    "float32" or "bfloat16"; ``max_shard_size`` (e.g. "300KB") saves shards plus an index.
    """
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_cls, model_cls = {
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM),
    }[arch]
    config = cfg_cls(**dict(_base_config(arch), **overrides))
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                std = head_std if head_std is not None and name.startswith("lm_head") else weight_std
                p.copy_(std * noise)
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    elif dtype != "float32":
        raise ValueError(f"dtype {dtype!r}: use float32 or bfloat16")
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, **kwargs)
    if tokenizer:
        make_tiny_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """Factory: ``tiny_hf(arch, dtype="float32", **overrides) -> Path`` (cached per arguments).
    Treat the directory as read-only; copy it before changing anything."""
    cache: dict[tuple, Path] = {}

    def make(arch: str, dtype: str = "float32", **kw) -> Path:
        key = (arch, dtype, tuple(sorted(kw.items())))
        if key not in cache:
            d = tmp_path_factory.mktemp(f"tiny-{arch}-{dtype}")
            cache[key] = make_tiny_hf(d, arch, dtype, **kw)
        return cache[key]

    return make


def random_iq_blocks(name: str, n_blocks: int, seed: int, d_scale: float = 0.01):
    """``n_blocks`` random blocks of IQ type ``name`` as a (n_blocks, block_bytes) uint8 array:
    random bytes (every index, sign and sub-block scale) with a finite fp16 super-block scale d
    drawn from d_scale * [0.5, 2). d is the first field, but for IQ1_M, which spreads it over the
    top nibbles of its four scale words (the last 8 bytes)."""
    import numpy as np

    from rapidmoe_gguf import quants

    t = quants.TYPES[name]
    r = np.random.default_rng(seed)
    raw = r.integers(0, 256, (n_blocks, t.block_bytes), dtype=np.uint8)
    d = (r.uniform(0.5, 2, n_blocks) * d_scale).astype(np.float16).view(np.uint16)
    if name == "IQ1_M":
        sc = raw[:, -8:].copy().view(np.uint16)
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        raw[:, -8:] = sc.view(np.uint8)
    else:
        raw[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    return raw


def random_iq_weights(name: str, shape: tuple, seed: int):
    """Random valid blocks of IQ type `name` for a float tensor of numpy shape `shape` (rows of
    shape[-1]), their scales chosen so the weights have a std of about 0.02, as the float
    model's; returns the blocks and gguf-py's dequantization of them."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf import quants as gq

    from rapidmoe_gguf import quants

    n_blocks = int(np.prod(shape)) // quants.TYPES[name].block_elems
    qtype = GGMLQuantizationType[name]
    unit = float(gq.dequantize(random_iq_blocks(name, 64, seed, d_scale=1.0), qtype).std())
    raw = random_iq_blocks(name, n_blocks, seed, d_scale=0.02 / unit)
    data = raw.reshape(*shape[:-1], -1)
    return data, gq.dequantize(data, qtype)


def write_gguf_like(src, dst, tensors: dict | None = None, kv: dict | None = None, *, drop=(),
                    rename: dict | None = None, add: dict | None = None) -> None:
    """Copies the GGUF file src to dst with some tensors replaced: tensors maps a name to
    (numpy data, raw ggml type or None for a float32 array); kv maps keys to new int values; the
    tensors named in drop are left out, those in rename renamed, and add's (name -> float32 array)
    appended."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        w.add_key_value(name, (kv or {}).get(name, field.contents()), vtype, sub_type=sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        data, raw = (tensors or {}).get(t.name, (t.data, t.tensor_type))
        w.add_tensor((rename or {}).get(t.name, t.name), data, raw_dtype=raw)
    for name, data in (add or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def assert_convert_refuses(hf, tmp_path, change: dict, error, words: str) -> None:
    """Converting a copy of the checkpoint hf whose config.json takes `change` raises error with
    `words` in its message, and leaves no output file."""
    import json
    import shutil

    import pytest

    import rapidmoe_gguf as rm

    hf = shutil.copytree(hf, tmp_path / "hf")
    config = json.loads((hf / "config.json").read_text())
    config.update(change)
    (hf / "config.json").write_text(json.dumps(config))
    with pytest.raises(error, match=words):
        rm.convert(hf, tmp_path / "m.gguf", recipe="f32", progress=False)
    assert not (tmp_path / "m.gguf").exists()


def logit_rel(ours, ref) -> float:
    """The largest relative logit error over positions: max |ours - ref| / max |ref|, per row."""
    import numpy as np

    return (np.abs(ours - ref).max(-1) / np.abs(ref).max(-1)).max()


def state_round_trip(path, prompt, rest, state_file, **model_kw):
    """Evaluates prompt, saves the state to state_file, feeds rest one token at a time; then, in a
    fresh Model, loads the state and feeds rest again. Returns both runs' logits of rest (a
    loaded state continues bit for bit: the caller compares them) and the fresh Model's reusable
    prefix of prompt + rest."""
    import numpy as np
    import rapidmoe_gguf as rm

    kw = {"n_ctx": 128, "n_threads": 2, **model_kw}
    with rm.Model(path, **kw) as m:
        m.eval(prompt)
        m.save_state(state_file)
        want = np.stack([m.eval([t]) for t in rest])
    with rm.Model(path, **kw) as m2:
        m2.load_state(state_file)
        reusable = m2._reusable(list(prompt) + list(rest))
        got = np.stack([m2.eval([t]) for t in rest])
    return want, got, reusable
