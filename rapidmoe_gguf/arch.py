"""Supported MoE architectures as data.

What a GGUF file of each architecture holds, as the runtime reads it, has one source: the C
table in ``native/src/model/arch.c`` (keys with defaults and ranges, per-layer tensor templates with
shapes, behaviour flags), which the loader walks. ``native_archs()`` reads that table through
``rm_arch_describe``; ``GGUFFile.hparams()`` reads a file's hyperparameters by it, with the
loader's own code (the planner's way in).

This module adds what only the converter needs, one ``ArchSpec`` row per GGUF
``general.architecture``: which Hugging Face config keys give which GGUF hyperparameters
(``HParam``), which HF tensors become which GGUF tensors (``TensorSpec``), and how (q/k row
permutation, dense layers refused). tests/test_arch_table.py proves these rows and the C rows
describe the same files: the same keys filling the same values, the same tensor names, shapes
and presence, the same flags.

Shapes are in ggml ``ne`` order (``ne[0]`` is the row length, the fastest-varying dimension) and
are written as names of model dimensions (``"n_embd"``, ``"n_ff_exp"``, ...) that
``resolve_hparams`` computes from the config.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gguf import Keys

from .errors import FormatError, UnsupportedError

FLOAT32_MAX = 3.4028234663852886e38

REQUIRED = object()  # HParam.default: the config must provide the value


@dataclasses.dataclass(frozen=True)
class HParam:
    """One hyperparameter: a GGUF key, where to find it in config.json, and its fallback.

    ``key`` is a gguf ``Keys`` template (``"{arch}.embedding_length"``) or None for a dimension
    that only sizes tensors. ``hf`` lists config keys tried in order; a dotted name looks inside a
    nested dict (``"rope_parameters.rope_theta"``) and a null value counts as absent. ``default``
    is a constant, a callable of the dims resolved so far, or REQUIRED. ``dim`` names the value in
    the dims mapping that tensor shapes refer to.
    """

    key: str | None
    hf: tuple[str, ...]
    kind: str  # "u32" | "f32" | "bool" | "str" | "sections" (a list of at most 4, padded to 4) |
    #            "u32s" | "bools" | "f32s" (one value per layer) | "dict" (a dimension only: a mapping or None)
    default: Any = REQUIRED
    dim: str | None = None


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One GGUF tensor and the HF tensor(s) it comes from.

    ``gguf`` and ``hf`` may contain ``{bid}`` (the layer: one tensor per layer) and ``hf`` may
    contain ``{xid}`` (the expert: the per-expert HF matrices are stacked along a new slowest
    dimension, so ``ne[-1]`` is ``n_expert``). ``role`` drives the type a recipe gives it:
    ``"expert"`` (base + residual), ``"router"`` (kept F32 as llama.cpp does), anything else
    (1-D tensors F32, matrices the recipe's other type).
    """

    gguf: str
    hf: str
    ne: tuple[str, ...]
    role: str
    optional: bool = False          # may be absent from the checkpoint (tied lm_head, biases)
    transform: str | None = None    # "permute_q" | "permute_k" | "flatten", one of FUSED, or a name in sources.TRANSFORMS
    #                                 (with hf "", a name in sources.GENERATED: a tensor made from the dims)
    # only in some layers: "dense" | "moe" | "q_lora" | "q_direct" | "indexed" (sparse attention's own
    # indexer) | "ple" (the layers config.json's ple_layer_ids lists), or with ArchSpec.layer_kind the kind it gives: "full" | "linear" (the hybrids) | "sliding"
    layers: str | None = None

    @property
    def per_layer(self) -> bool:
        return "{bid}" in self.gguf

    @property
    def per_expert(self) -> bool:
        return "{xid}" in self.hf


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """How a Hugging Face checkpoint becomes a file of one architecture. The behaviour the runtime
    gives that file (q/k norm kind, RoPE layout, shared-expert gating) is the C row's alone
    (``native_archs()``); here only what conversion does about it (``permute_qk``)."""

    name: str                          # general.architecture
    hf_architectures: tuple[str, ...]  # config.json "architectures" entries that map here
    hparams: tuple[HParam, ...]
    tensors: tuple[TensorSpec, ...]
    permute_qk: bool = False           # HF q/k rows are permuted to llama.cpp's interleaved RoPE
    output_from_embd: bool = False     # llama.cpp falls back to token_embd when output is absent
    check_config: Callable[[Mapping[str, Any]], None] | None = None  # refuse configs we cannot express
    sliding_window: bool = False       # the runtime honours config.json's sliding_window
    # the config as the hparams read it: values derived from several fields, per-architecture
    # defaults transformers does not save (DeepSeek-V3's sigmoid scores)
    prepare_config: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    hf_rope_interleaved: bool = False  # HF rows already hold llama.cpp's interleaved RoPE pairs (no permutation)
    drop_hf_layers_from: str | None = None  # a dim: HF layers from that index on (MTP blocks) are not converted
    rope_scaling: tuple[str, ...] = ()  # rope types beside the default that the runtime computes
    extra_kv: Callable[[Mapping[str, Any]], dict[str, tuple[Any, str]]] | None = None  # keys written only sometimes
    layer_kind: Callable[[Mapping[str, Any], int], str] | None = None  # "full" | "linear" | "sliding" per layer
    skipped: tuple[tuple[str, str], ...] = ()  # HF tensor name prefixes not converted (logged), with what they hold
    # tensors made of several checkpoint tensors, with the keys that describe them: a name in
    # sources.EXTRA_PLANS (qwen4exp's "ple": the n-gram table and its hash constants)
    extra_plan: str | None = None
    # a multimodal checkpoint (config.json with a text_config): the prefix its text model's tensors
    # have, and the text-only model's prefix they are read under
    text_model: tuple[str, str] | None = None


# ---------------------------------------------------------------------------------------------
# Building blocks shared by the rows
# ---------------------------------------------------------------------------------------------

def _head_dim(d: Mapping[str, Any]) -> int:
    return d["n_embd"] // d["n_head"]


_COMMON_HPARAMS = (
    HParam(Keys.LLM.VOCAB_SIZE, ("vocab_size",), "u32", dim="n_vocab"),
    HParam(Keys.LLM.CONTEXT_LENGTH, ("max_position_embeddings",), "u32", dim="n_ctx_train"),
    HParam(Keys.LLM.EMBEDDING_LENGTH, ("hidden_size",), "u32", dim="n_embd"),
    HParam(Keys.LLM.BLOCK_COUNT, ("num_hidden_layers",), "u32", dim="n_layer"),
    HParam(Keys.Attention.HEAD_COUNT, ("num_attention_heads",), "u32", dim="n_head"),
    HParam(Keys.Attention.HEAD_COUNT_KV, ("num_key_value_heads",), "u32",
           default=lambda d: d["n_head"], dim="n_head_kv"),
    HParam(Keys.Attention.KEY_LENGTH, ("head_dim",), "u32", default=_head_dim, dim="head_dim"),
    HParam(Keys.Attention.VALUE_LENGTH, ("head_dim",), "u32", default=_head_dim, dim="head_dim_v"),
    HParam(Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",), "f32", dim="rms_eps"),
    HParam(Keys.Rope.FREQ_BASE, ("rope_parameters.rope_theta", "rope_theta"), "f32",
           default=10000.0, dim="rope_base"),
    HParam(Keys.Rope.DIMENSION_COUNT, (), "u32", default=lambda d: d["head_dim"], dim="n_rot"),
    HParam(Keys.LLM.EXPERT_COUNT, ("num_experts", "num_local_experts"), "u32", dim="n_expert"),
    HParam(Keys.LLM.EXPERT_USED_COUNT, ("num_experts_per_tok",), "u32", dim="n_expert_used"),
)


def _norm_topk(hf: tuple[str, ...], default: bool) -> HParam:
    return HParam(Keys.LLM.EXPERT_WEIGHTS_NORM, hf, "bool", default=default, dim="norm_topk")


_GLOBAL_TENSORS = (
    TensorSpec("token_embd.weight", "model.embed_tokens.weight", ("n_embd", "n_vocab"), "embd"),
    TensorSpec("output_norm.weight", "model.norm.weight", ("n_embd",), "norm"),
    TensorSpec("output.weight", "lm_head.weight", ("n_embd", "n_vocab"), "output", optional=True),
)


def _attention(qk_norm: str = "none", bias: bool = False, permute: bool = False) -> tuple[TensorSpec, ...]:
    p = "model.layers.{bid}."
    a = p + "self_attn."
    t = [
        TensorSpec("blk.{bid}.attn_norm.weight", p + "input_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.attn_q.weight", a + "q_proj.weight", ("n_embd", "n_q"), "attn",
                   transform="permute_q" if permute else None),
        TensorSpec("blk.{bid}.attn_k.weight", a + "k_proj.weight", ("n_embd", "n_kv"), "attn",
                   transform="permute_k" if permute else None),
        TensorSpec("blk.{bid}.attn_v.weight", a + "v_proj.weight", ("n_embd", "n_kv"), "attn"),
        TensorSpec("blk.{bid}.attn_output.weight", a + "o_proj.weight", ("n_q", "n_embd"), "attn"),
    ]
    if bias:
        t += [
            TensorSpec("blk.{bid}.attn_q.bias", a + "q_proj.bias", ("n_q",), "bias", optional=True),
            TensorSpec("blk.{bid}.attn_k.bias", a + "k_proj.bias", ("n_kv",), "bias", optional=True),
            TensorSpec("blk.{bid}.attn_v.bias", a + "v_proj.bias", ("n_kv",), "bias", optional=True),
        ]
    if qk_norm != "none":
        q_ne, k_ne = (("head_dim",), ("head_dim",)) if qk_norm == "per_head" else (("n_q",), ("n_kv",))
        t += [
            TensorSpec("blk.{bid}.attn_q_norm.weight", a + "q_norm.weight", q_ne, "norm"),
            TensorSpec("blk.{bid}.attn_k_norm.weight", a + "k_norm.weight", k_ne, "norm"),
        ]
    return tuple(t)


def _moe(prefix: str, gate: str, up: str, down: str, shared_gated: bool = False) -> tuple[TensorSpec, ...]:
    """The MoE block under ``model.layers.{bid}.<prefix>``; gate/up/down name the per-expert
    projections (``gate_proj`` or Mixtral's ``w1``/``w3``/``w2``)."""
    p = "model.layers.{bid}."
    m = p + prefix + "."
    x = m + "experts.{xid}."
    t = [
        TensorSpec("blk.{bid}.ffn_norm.weight", p + "post_attention_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.ffn_gate_inp.weight", m + "gate.weight", ("n_embd", "n_expert"), "router"),
        TensorSpec("blk.{bid}.ffn_gate_exps.weight", x + gate + ".weight",
                   ("n_embd", "n_ff_exp", "n_expert"), "expert"),
        TensorSpec("blk.{bid}.ffn_up_exps.weight", x + up + ".weight",
                   ("n_embd", "n_ff_exp", "n_expert"), "expert"),
        TensorSpec("blk.{bid}.ffn_down_exps.weight", x + down + ".weight",
                   ("n_ff_exp", "n_embd", "n_expert"), "expert"),
    ]
    if shared_gated:
        s = m + "shared_expert."
        t += [
            TensorSpec("blk.{bid}.ffn_gate_inp_shexp.weight", m + "shared_expert_gate.weight",
                       ("n_embd",), "shexp_gate", transform="flatten"),
            TensorSpec("blk.{bid}.ffn_gate_shexp.weight", s + "gate_proj.weight", ("n_embd", "n_ff_shexp"), "shexp"),
            TensorSpec("blk.{bid}.ffn_up_shexp.weight", s + "up_proj.weight", ("n_embd", "n_ff_shexp"), "shexp"),
            TensorSpec("blk.{bid}.ffn_down_shexp.weight", s + "down_proj.weight", ("n_ff_shexp", "n_embd"), "shexp"),
        ]
    return tuple(t)


def _all_layers_moe(config: Mapping[str, Any]) -> None:
    """Qwen MoE configs can make some layers dense; llama.cpp's qwen*moe graphs cannot."""
    step = config.get("decoder_sparse_step", 1)
    dense = config.get("mlp_only_layers") or []
    if step not in (None, 1) or dense:
        raise UnsupportedError(
            f"config.json: dense layers (decoder_sparse_step={step}, mlp_only_layers={list(dense)}) "
            "are not supported; every layer must be an MoE layer")


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

LLAMA = ArchSpec(  # Mixtral
    name="llama",
    hf_architectures=("MixtralForCausalLM",),
    hparams=_COMMON_HPARAMS + (
        HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff_exp"),
        _norm_topk((), True),
    ),
    tensors=_GLOBAL_TENSORS + _attention(permute=True) + _moe("block_sparse_moe", "w1", "w3", "w2"),
    permute_qk=True,
    output_from_embd=True,
)

QWEN2MOE = ArchSpec(
    name="qwen2moe",
    hf_architectures=("Qwen2MoeForCausalLM",),
    hparams=_COMMON_HPARAMS + (
        HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff"),
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
        HParam(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, ("shared_expert_intermediate_size",), "u32",
               dim="n_ff_shexp"),
        _norm_topk(("norm_topk_prob",), False),
    ),
    tensors=_GLOBAL_TENSORS + _attention(bias=True)
    + _moe("mlp", "gate_proj", "up_proj", "down_proj", shared_gated=True),
    check_config=_all_layers_moe,
)

QWEN3MOE = ArchSpec(
    name="qwen3moe",
    hf_architectures=("Qwen3MoeForCausalLM",),
    hparams=_COMMON_HPARAMS + (
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
        HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32",
               default=lambda d: d["n_ff_exp"], dim="n_ff"),
        _norm_topk(("norm_topk_prob",), True),
    ),
    tensors=_GLOBAL_TENSORS + _attention(qk_norm="per_head")
    + _moe("mlp", "gate_proj", "up_proj", "down_proj"),
    output_from_embd=True,
    check_config=_all_layers_moe,
)

OLMOE = ArchSpec(
    name="olmoe",
    hf_architectures=("OlmoeForCausalLM",),
    hparams=_COMMON_HPARAMS + (
        HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff_exp"),
        _norm_topk(("norm_topk_prob",), False),
    ),
    tensors=_GLOBAL_TENSORS + _attention(qk_norm="full") + _moe("mlp", "gate_proj", "up_proj", "down_proj"),
)

# ---------------------------------------------------------------------------------------------
# DeepSeek and GLM: leading dense layers, ungated shared experts, sigmoid/softmax routing with a
# selection bias, expert groups and a scale; DeepSeek's multi-head latent attention
# ---------------------------------------------------------------------------------------------

_GATING = {"softmax": 1, "sigmoid": 2}


def _leading_dense(config: Mapping[str, Any]) -> int:
    """first_k_dense_replace, or the leading "dense" entries of mlp_layer_types (GLM-4.7-Flash)."""
    types = config.get("mlp_layer_types")
    first_k = config.get("first_k_dense_replace")
    if types is None:
        return int(first_k or 0)
    n = next((i for i, t in enumerate(types) if t != "dense"), len(types))
    if any(t == "dense" for t in types[n:]):
        raise UnsupportedError(f"config.json: mlp_layer_types {list(types)}: only leading dense layers are "
                               "supported (llama.cpp's leading_dense_block_count)")
    if first_k is not None and int(first_k) != n:
        raise FormatError(f"config.json: first_k_dense_replace {first_k} disagrees with mlp_layer_types ({n} "
                          "leading dense layers)")
    return n


def _deepseek_routing(config: Mapping[str, Any], scoring: str) -> dict[str, Any]:
    """The router's keys: scores, groups (V2 uses them only with group_limited_greedy), renormalisation."""
    func = config.get("scoring_func") or scoring
    if func not in _GATING:
        raise UnsupportedError(f"config.json: scoring_func '{func}' is not supported (softmax or sigmoid)")
    out = {"_gating": _GATING[func], "_n_dense": _leading_dense(config)}
    method = config.get("topk_method")
    groups = method in (None, "noaux_tc", "group_limited_greedy")
    out["_n_group"] = int(config.get("n_group") or 1) if groups else 1
    out["_topk_group"] = int(config.get("topk_group") or out["_n_group"]) if groups else 1
    if method not in (None, "greedy", "noaux_tc", "group_limited_greedy"):
        raise UnsupportedError(f"config.json: topk_method '{method}' is not supported")
    return out


def _check_moe_layers(config: Mapping[str, Any]) -> None:
    if not config.get("n_shared_experts"):
        raise UnsupportedError("config.json: n_shared_experts must be at least 1 (llama.cpp's layout has shared experts)")


def _prepare_glm4moe(config: Mapping[str, Any]) -> Mapping[str, Any]:
    _check_moe_layers(config)
    rope = config.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.5))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return dict(config, _n_rot=int(head_dim * factor), **_deepseek_routing(config, "sigmoid"),
                _norm_topk=bool(config.get("norm_topk_prob", True)))


def _prepare_deepseek2(config: Mapping[str, Any]) -> Mapping[str, Any]:
    _check_moe_layers(config)
    names = config.get("architectures") or []
    v2 = "DeepseekV2ForCausalLM" in names
    if config.get("rope_interleave") is False:
        raise UnsupportedError("config.json: rope_interleave false is not supported (llama.cpp's deepseek2 "
                               "rotates interleaved pairs)")
    out = dict(config, **_deepseek_routing(config, "softmax" if v2 else "sigmoid"))
    # DeepSeek-V2 never renormalises (transformers' DeepseekV2TopkRouter); V3 and GLM do by default
    out["_norm_topk"] = False if v2 else bool(config.get("norm_topk_prob", True))
    out["_q_lora_rank"] = int(config.get("q_lora_rank") or 0)
    return out


def _deepseek_yarn(config: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """YaRN's keys as llama.cpp's deepseek2 reads them. llama.cpp takes mscale = mscale_all_dim and
    the betas as 32 and 1; other values would run differently there, so they are refused."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        return {}
    where = "config.json: rope_parameters"
    msa = rope.get("mscale_all_dim")
    if not msa or rope.get("mscale", msa) != msa:
        raise UnsupportedError(f"{where}: YaRN needs mscale_all_dim, and mscale equal to it (llama.cpp's deepseek2)")
    if rope.get("beta_fast", 32) != 32 or rope.get("beta_slow", 1) != 1 or rope.get("attention_factor") is not None:
        raise UnsupportedError(f"{where}: YaRN with beta_fast 32, beta_slow 1 and no attention_factor only "
                               "(llama.cpp's deepseek2)")
    return {
        "{arch}.rope.scaling.type": ("yarn", "str"),
        "{arch}.rope.scaling.factor": (_coerce(rope["factor"], "f32", f"{where}.factor"), "f32"),
        "{arch}.rope.scaling.original_context_length": (
            _coerce(rope["original_max_position_embeddings"], "u32", f"{where}.original_max_position_embeddings"), "u32"),
        "{arch}.rope.scaling.yarn_log_multiplier": (0.1 * float(msa), "f32"),
    }


def _deepseek_moe_hparams() -> tuple[HParam, ...]:
    return (
        HParam(Keys.LLM.EXPERT_COUNT, ("n_routed_experts",), "u32", dim="n_expert"),
        HParam(Keys.LLM.EXPERT_USED_COUNT, ("num_experts_per_tok",), "u32", dim="n_expert_used"),
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
        HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff"),
        HParam(Keys.LLM.EXPERT_SHARED_COUNT, ("n_shared_experts",), "u32", default=0, dim="n_expert_shared"),
        HParam(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, ("_n_dense",), "u32", default=0, dim="n_layer_dense_lead"),
        HParam(Keys.LLM.EXPERT_GATING_FUNC, ("_gating",), "u32", dim="gating"),
        HParam(Keys.LLM.EXPERT_WEIGHTS_SCALE, ("routed_scaling_factor",), "f32", default=1.0,
               dim="expert_weights_scale"),
        HParam(Keys.LLM.EXPERT_GROUP_COUNT, ("_n_group",), "u32", default=1, dim="n_group"),
        HParam(Keys.LLM.EXPERT_GROUP_USED_COUNT, ("_topk_group",), "u32", default=lambda d: d["n_group"],
               dim="n_group_used"),
        HParam(Keys.LLM.EXPERT_WEIGHTS_NORM, ("_norm_topk",), "bool", default=False, dim="norm_topk"),
        # the checkpoint's next-token-prediction layers are not converted
        HParam(Keys.LLM.NEXTN_PREDICT_LAYERS, (), "u32", default=0, dim="n_layer_nextn"),
        HParam(Keys.LLM.CONTEXT_LENGTH, ("max_position_embeddings",), "u32", dim="n_ctx_train"),
    )


def _deepseek_ffn(ffn_norm: str) -> tuple[TensorSpec, ...]:
    p = "model.layers.{bid}."
    m = p + "mlp."
    x = m + "experts.{xid}."
    s = m + "shared_experts."
    return (
        TensorSpec(ffn_norm, p + "post_attention_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.ffn_gate_inp.weight", m + "gate.weight", ("n_embd", "n_expert"), "router", layers="moe"),
        TensorSpec("blk.{bid}.exp_probs_b.bias", m + "gate.e_score_correction_bias", ("n_expert",), "bias",
                   optional=True, layers="moe"),
        TensorSpec("blk.{bid}.ffn_gate_exps.weight", x + "gate_proj.weight", ("n_embd", "n_ff_exp", "n_expert"),
                   "expert", layers="moe"),
        TensorSpec("blk.{bid}.ffn_up_exps.weight", x + "up_proj.weight", ("n_embd", "n_ff_exp", "n_expert"),
                   "expert", layers="moe"),
        TensorSpec("blk.{bid}.ffn_down_exps.weight", x + "down_proj.weight", ("n_ff_exp", "n_embd", "n_expert"),
                   "expert", layers="moe"),
        TensorSpec("blk.{bid}.ffn_gate_shexp.weight", s + "gate_proj.weight", ("n_embd", "n_ff_shexp"), "shexp",
                   layers="moe"),
        TensorSpec("blk.{bid}.ffn_up_shexp.weight", s + "up_proj.weight", ("n_embd", "n_ff_shexp"), "shexp",
                   layers="moe"),
        TensorSpec("blk.{bid}.ffn_down_shexp.weight", s + "down_proj.weight", ("n_ff_shexp", "n_embd"), "shexp",
                   layers="moe"),
        TensorSpec("blk.{bid}.ffn_gate.weight", m + "gate_proj.weight", ("n_embd", "n_ff"), "dense", layers="dense"),
        TensorSpec("blk.{bid}.ffn_up.weight", m + "up_proj.weight", ("n_embd", "n_ff"), "dense", layers="dense"),
        TensorSpec("blk.{bid}.ffn_down.weight", m + "down_proj.weight", ("n_ff", "n_embd"), "dense", layers="dense"),
    )


def _glm_head_dim(d: Mapping[str, Any]) -> int:
    return d["n_embd"] // d["n_head"]


GLM4MOE = ArchSpec(  # GLM-4.5 / 4.6 and their Air versions
    name="glm4moe",
    hf_architectures=("Glm4MoeForCausalLM",),
    hparams=(
        HParam(Keys.LLM.VOCAB_SIZE, ("vocab_size",), "u32", dim="n_vocab"),
        HParam(Keys.LLM.EMBEDDING_LENGTH, ("hidden_size",), "u32", dim="n_embd"),
        HParam(Keys.LLM.BLOCK_COUNT, ("num_hidden_layers",), "u32", dim="n_layer"),
        HParam(Keys.Attention.HEAD_COUNT, ("num_attention_heads",), "u32", dim="n_head"),
        HParam(Keys.Attention.HEAD_COUNT_KV, ("num_key_value_heads",), "u32",
               default=lambda d: d["n_head"], dim="n_head_kv"),
        HParam(Keys.Attention.KEY_LENGTH, ("head_dim",), "u32", default=_glm_head_dim, dim="head_dim"),
        HParam(Keys.Attention.VALUE_LENGTH, ("head_dim",), "u32", default=_glm_head_dim, dim="head_dim_v"),
        HParam(Keys.Rope.DIMENSION_COUNT, ("_n_rot",), "u32", dim="n_rot"),
        HParam(Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",), "f32", dim="rms_eps"),
        HParam(Keys.Rope.FREQ_BASE, ("rope_parameters.rope_theta", "rope_theta"), "f32",
               default=10000.0, dim="rope_base"),
    ) + _deepseek_moe_hparams(),
    tensors=_GLOBAL_TENSORS + _attention(qk_norm="per_head", bias=True)[:-2] + (
        TensorSpec("blk.{bid}.attn_q_norm.weight", "model.layers.{bid}.self_attn.q_norm.weight", ("head_dim",),
                   "norm", optional=True),
        TensorSpec("blk.{bid}.attn_k_norm.weight", "model.layers.{bid}.self_attn.k_norm.weight", ("head_dim",),
                   "norm", optional=True),
    ) + _deepseek_ffn("blk.{bid}.post_attention_norm.weight"),
    output_from_embd=True,
    prepare_config=_prepare_glm4moe,
    drop_hf_layers_from="n_layer",
)


def _mla_attention() -> tuple[TensorSpec, ...]:
    p = "model.layers.{bid}."
    a = p + "self_attn."
    return (
        TensorSpec("blk.{bid}.attn_norm.weight", p + "input_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.attn_q_a.weight", a + "q_a_proj.weight", ("n_embd", "q_lora_rank"), "attn",
                   layers="q_lora"),
        TensorSpec("blk.{bid}.attn_q_a_norm.weight", a + "q_a_layernorm.weight", ("q_lora_rank",), "norm",
                   layers="q_lora"),
        TensorSpec("blk.{bid}.attn_q_b.weight", a + "q_b_proj.weight", ("q_lora_rank", "n_q"), "attn",
                   layers="q_lora"),
        TensorSpec("blk.{bid}.attn_q.weight", a + "q_proj.weight", ("n_embd", "n_q"), "attn", layers="q_direct"),
        TensorSpec("blk.{bid}.attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight", ("n_embd", "n_kv_a"), "attn"),
        TensorSpec("blk.{bid}.attn_kv_a_norm.weight", a + "kv_a_layernorm.weight", ("kv_lora_rank",), "norm"),
        # kv_b_proj, split per head into k's up-projection (transposed) and v's, as llama.cpp stores them
        TensorSpec("blk.{bid}.attn_k_b.weight", a + "kv_b_proj.weight", ("n_nope", "kv_lora_rank", "n_head"), "attn",
                   transform="k_b"),
        TensorSpec("blk.{bid}.attn_v_b.weight", a + "kv_b_proj.weight", ("kv_lora_rank", "head_dim_v", "n_head"),
                   "attn", transform="v_b"),
        TensorSpec("blk.{bid}.attn_output.weight", a + "o_proj.weight", ("n_v", "n_embd"), "attn"),
    )


DEEPSEEK2 = ArchSpec(  # DeepSeek-V2/V3/R1, Kimi-K2, GLM-4.7-Flash
    name="deepseek2",
    hf_architectures=("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeLiteForCausalLM"),
    hparams=(
        HParam(Keys.LLM.VOCAB_SIZE, ("vocab_size",), "u32", dim="n_vocab"),
        HParam(Keys.LLM.EMBEDDING_LENGTH, ("hidden_size",), "u32", dim="n_embd"),
        HParam(Keys.LLM.BLOCK_COUNT, ("num_hidden_layers",), "u32", dim="n_layer"),
        HParam(Keys.Attention.HEAD_COUNT, ("num_attention_heads",), "u32", dim="n_head"),
        HParam(Keys.Attention.HEAD_COUNT_KV, (), "u32", default=1, dim="n_head_kv"),   # one latent for all heads
        HParam(Keys.Attention.Q_LORA_RANK, ("_q_lora_rank",), "u32", default=0, dim="q_lora_rank"),
        HParam(Keys.Attention.KV_LORA_RANK, ("kv_lora_rank",), "u32", dim="kv_lora_rank"),
        HParam(Keys.Rope.DIMENSION_COUNT, ("qk_rope_head_dim",), "u32", dim="n_rot"),
        HParam(Keys.Attention.KEY_LENGTH_MLA, (), "u32", default=lambda d: d["n_nope"] + d["n_rot"], dim="head_dim"),
        HParam(Keys.Attention.VALUE_LENGTH_MLA, ("v_head_dim",), "u32", dim="head_dim_v"),
        # llama.cpp also writes the latent's sizes as the (single) KV head's
        HParam(Keys.Attention.KEY_LENGTH, (), "u32", default=lambda d: d["kv_lora_rank"] + d["n_rot"], dim="n_kv_a"),
        HParam(Keys.Attention.VALUE_LENGTH, (), "u32", default=lambda d: d["kv_lora_rank"], dim="mla_value_length"),
        HParam(Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",), "f32", default=1e-6, dim="rms_eps"),
        HParam(Keys.Rope.FREQ_BASE, ("rope_parameters.rope_theta", "rope_theta"), "f32",
               default=10000.0, dim="rope_base"),
    ) + _deepseek_moe_hparams(),
    tensors=_GLOBAL_TENSORS + _mla_attention() + _deepseek_ffn("blk.{bid}.ffn_norm.weight"),
    output_from_embd=True,
    hf_rope_interleaved=True,
    prepare_config=_prepare_deepseek2,
    drop_hf_layers_from="n_layer",
    rope_scaling=("yarn",),
    extra_kv=_deepseek_yarn,
)


def _glm_dsa_indexer_types(config: Mapping[str, Any]) -> list[bool]:
    """Per layer, whether it runs its own indexer (transformers' indexer_types, or the pattern or
    the frequency and offset it derives them from); a layer that does not takes the previous one's."""
    n = int(config.get("num_hidden_layers") or 0)
    types = config.get("indexer_types")
    if types is None and (pattern := config.get("index_topk_pattern")) is not None:
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else list(pattern)
    if types is None:
        freq = max(int(config.get("index_topk_freq", 1) or 1), 1)
        offset = int(config.get("index_skip_topk_offset", 2))
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    types = list(types)[:n]
    if len(types) < n or any(t not in ("full", "shared") for t in types):
        raise FormatError(f"config.json: indexer_types {types!r} must name 'full' or 'shared' for each of {n} layers")
    if types and types[0] != "full":
        raise FormatError("config.json: indexer_types: layer 0 must run its own indexer ('full')")
    return [t == "full" for t in types]


def _prepare_dsa(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    """DeepSeek-V3's routing keys (_prepare_deepseek2) for a family with sparse attention, whose
    indexer reads the q low rank."""
    if not config.get("q_lora_rank"):
        raise UnsupportedError(f"config.json: {family} without q_lora_rank is not supported (the indexer reads the "
                               "q low rank)")
    return dict(_prepare_deepseek2(config))


def _prepare_glm_dsa(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return dict(_prepare_dsa(config, "GLM-5"), _indexer_types=_glm_dsa_indexer_types(config))


def _glm_dsa_tensors() -> tuple[TensorSpec, ...]:
    a = "model.layers.{bid}.self_attn.indexer."
    on = dict(layers="indexed")
    mla = tuple(t for t in _mla_attention() if t.layers != "q_direct")   # the q low rank is required
    return _GLOBAL_TENSORS + mla + (
        TensorSpec("blk.{bid}.indexer.attn_q_b.weight", a + "wq_b.weight", ("q_lora_rank", "n_index_q"), "attn", **on),
        TensorSpec("blk.{bid}.indexer.attn_k.weight", a + "wk.weight", ("n_embd", "index_head_dim"), "attn", **on),
        TensorSpec("blk.{bid}.indexer.k_norm.weight", a + "k_norm.weight", ("index_head_dim",), "norm", **on),
        TensorSpec("blk.{bid}.indexer.k_norm.bias", a + "k_norm.bias", ("index_head_dim",), "bias", **on),
        TensorSpec("blk.{bid}.indexer.proj.weight", a + "weights_proj.weight", ("n_embd", "index_n_head"), "attn", **on),
    ) + _deepseek_ffn("blk.{bid}.ffn_norm.weight")


GLM_DSA = dataclasses.replace(  # GLM-5: DeepSeek-V3's MLA with DeepSeek sparse attention
    DEEPSEEK2,
    name="glm-dsa",
    hf_architectures=("GlmMoeDsaForCausalLM",),
    hparams=DEEPSEEK2.hparams + (
        HParam(Keys.Attention.Indexer.HEAD_COUNT, ("index_n_heads",), "u32", dim="index_n_head"),
        HParam(Keys.Attention.Indexer.KEY_LENGTH, ("index_head_dim",), "u32", dim="index_head_dim"),
        HParam(Keys.Attention.Indexer.TOP_K, ("index_topk",), "u32", dim="index_top_k"),
        # per layer, whether it runs its own indexer (llama.cpp's key; gguf-py 0.19 has no name for it)
        HParam("{arch}.attention.indexer.types", ("_indexer_types",), "bools", dim="indexer_layers"),
        HParam(None, (), "u32", default=lambda d: d["index_n_head"] * d["index_head_dim"], dim="n_index_q"),
    ),
    tensors=_glm_dsa_tensors(),
    prepare_config=_prepare_glm_dsa,
)

DEEPSEEK32 = dataclasses.replace(  # DeepSeek-V3.2: GLM-5's sparse attention, every layer its own indexer
    GLM_DSA,
    name="deepseek32",
    hf_architectures=("DeepseekV32ForCausalLM",),
    hparams=tuple(h for h in GLM_DSA.hparams if h.dim != "indexer_layers"),
    prepare_config=lambda config: _prepare_dsa(config, "DeepSeek-V3.2"),
)

# gpt-oss stores each layer's experts as one tensor per projection, experts along dimension 0,
# gate and up interleaved along the last (gate at even, up at odd indices) and every matrix
# transposed against nn.Linear's (in, out): a TensorSpec with one of these transforms takes expert
# e's slab of such a tensor (role "expert") or the matching half of a bias (role "f32").
FUSED = {
    "fused_gate": (slice(0, None, 2), True),     # gate_up_proj[e][:, 0::2].T
    "fused_up": (slice(1, None, 2), True),       # gate_up_proj[e][:, 1::2].T
    "fused_down": (slice(None), True),           # down_proj[e].T
    "even": (slice(0, None, 2), False),          # gate_up_proj_bias[:, 0::2]
    "odd": (slice(1, None, 2), False),           # gate_up_proj_bias[:, 1::2]
    "stacked": (slice(None), False),             # proj[e]: (experts, out, in), nn.Linear's orientation (Step-3.5's)
}

# The per-expert matrices that transformers' fused expert classes (Qwen3.5-MoE's, Qwen3-Next's) keep
# stacked in one tensor per layer, as published checkpoints may store them: per-expert HF name ->
# (the stacked tensor beside "experts.", which part of its rows). gate_up_proj is (n_expert,
# 2 * n_ff_exp, n_embd) with the gate rows first; down_proj is (n_expert, n_embd, n_ff_exp).
STACKED_EXPERTS = {
    "gate_proj.weight": ("gate_up_proj", 0),
    "up_proj.weight": ("gate_up_proj", 1),
    "down_proj.weight": ("down_proj", None),
}


def _gpt_oss_layers(config: Mapping[str, Any]) -> None:
    """llama.cpp's gpt-oss graph slides every other layer, starting with layer 0."""
    n = config.get("num_hidden_layers") or 0
    kinds = config.get("layer_types")
    want = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if kinds is not None and list(kinds) != want:
        raise UnsupportedError(f"config.json: layer_types {list(kinds)} is not gpt-oss's alternation "
                               "(sliding on even layers, full on odd ones)")
    for key, want_v in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)):
        if abs(float(config.get(key, want_v)) - want_v) > 1e-6:
            raise UnsupportedError(f"config.json: {key} {config[key]} differs from the {want_v} that "
                                   "llama.cpp (and this runtime) hard-code for gpt-oss")
    if config.get("attention_bias") is False:
        raise UnsupportedError("config.json: gpt-oss without attention biases is not supported")


def _gpt_oss_tensors() -> tuple[TensorSpec, ...]:
    p = "model.layers.{bid}."
    a, m = p + "self_attn.", p + "mlp."
    return _GLOBAL_TENSORS + (
        TensorSpec("blk.{bid}.attn_norm.weight", p + "input_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.attn_q.weight", a + "q_proj.weight", ("n_embd", "n_q"), "attn"),
        TensorSpec("blk.{bid}.attn_k.weight", a + "k_proj.weight", ("n_embd", "n_kv"), "attn"),
        TensorSpec("blk.{bid}.attn_v.weight", a + "v_proj.weight", ("n_embd", "n_kv"), "attn"),
        TensorSpec("blk.{bid}.attn_q.bias", a + "q_proj.bias", ("n_q",), "bias"),
        TensorSpec("blk.{bid}.attn_k.bias", a + "k_proj.bias", ("n_kv",), "bias"),
        TensorSpec("blk.{bid}.attn_v.bias", a + "v_proj.bias", ("n_kv",), "bias"),
        TensorSpec("blk.{bid}.attn_output.weight", a + "o_proj.weight", ("n_q", "n_embd"), "attn"),
        TensorSpec("blk.{bid}.attn_output.bias", a + "o_proj.bias", ("n_embd",), "bias"),
        TensorSpec("blk.{bid}.attn_sinks.weight", a + "sinks", ("n_head",), "bias"),
        TensorSpec("blk.{bid}.post_attention_norm.weight", p + "post_attention_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.ffn_gate_inp.weight", m + "router.weight", ("n_embd", "n_expert"), "router"),
        TensorSpec("blk.{bid}.ffn_gate_inp.bias", m + "router.bias", ("n_expert",), "bias"),
        TensorSpec("blk.{bid}.ffn_gate_exps.weight", m + "experts.gate_up_proj",
                   ("n_embd", "n_ff_exp", "n_expert"), "expert", transform="fused_gate"),
        TensorSpec("blk.{bid}.ffn_up_exps.weight", m + "experts.gate_up_proj",
                   ("n_embd", "n_ff_exp", "n_expert"), "expert", transform="fused_up"),
        TensorSpec("blk.{bid}.ffn_down_exps.weight", m + "experts.down_proj",
                   ("n_ff_exp", "n_embd", "n_expert"), "expert", transform="fused_down"),
        TensorSpec("blk.{bid}.ffn_gate_exps.bias", m + "experts.gate_up_proj_bias",
                   ("n_ff_exp", "n_expert"), "f32", transform="even"),
        TensorSpec("blk.{bid}.ffn_up_exps.bias", m + "experts.gate_up_proj_bias",
                   ("n_ff_exp", "n_expert"), "f32", transform="odd"),
        TensorSpec("blk.{bid}.ffn_down_exps.bias", m + "experts.down_proj_bias", ("n_embd", "n_expert"), "f32"),
    )


def _rope(name: str) -> tuple[str, str]:
    return f"rope_parameters.{name}", f"rope_scaling.{name}"


GPT_OSS = ArchSpec(
    name="gpt-oss",
    hf_architectures=("GptOssForCausalLM",),
    hparams=_COMMON_HPARAMS + (
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff_exp"),
        _norm_topk((), True),
        HParam(Keys.Attention.SLIDING_WINDOW, ("sliding_window",), "u32", dim="n_swa"),
        HParam(Keys.Attention.SLIDING_WINDOW_PATTERN, (), "u32", default=2, dim="swa_pattern"),
        HParam(Keys.Rope.SCALING_FACTOR, _rope("factor"), "f32", default=1.0, dim="rope_yarn_factor"),
        HParam(Keys.Rope.SCALING_TYPE, (), "str",
               default=lambda d: "yarn" if d["rope_yarn_factor"] != 1.0 else "none", dim="rope_scaling"),
        HParam(Keys.Rope.SCALING_ORIG_CTX_LEN, _rope("original_max_position_embeddings"), "u32",
               default=lambda d: d["n_ctx_train"], dim="n_ctx_orig_yarn"),
        HParam(Keys.Rope.SCALING_YARN_BETA_FAST, _rope("beta_fast"), "f32", default=32.0, dim="yarn_beta_fast"),
        HParam(Keys.Rope.SCALING_YARN_BETA_SLOW, _rope("beta_slow"), "f32", default=1.0, dim="yarn_beta_slow"),
        # transformers' YaRN `truncate`: GGUF has no key for it and llama.cpp always rounds (true)
        HParam("rapidmoe.rope.yarn_truncate", _rope("truncate"), "bool", default=True, dim="yarn_truncate"),
    ),
    tensors=_gpt_oss_tensors(),
    check_config=_gpt_oss_layers,
    rope_scaling=("yarn",),
    sliding_window=True,
)


# The pre-tokenizer name llama.cpp gives a family whose split regex another name shares.
PREFERRED_PRE = {"Glm4MoeForCausalLM": ("glm4",), "Glm4MoeLiteForCausalLM": ("glm4",),
                 "GlmMoeDsaForCausalLM": ("glm4",)}
# ---- Qwen3.5-MoE and Qwen3-Next: Gated DeltaNet and gated attention ---------------------------

def _layer_types(config: Mapping[str, Any]) -> list[str]:
    """transformers' layer_types, or its default: every full_attention_interval-th layer full."""
    n, every = config["num_hidden_layers"], config.get("full_attention_interval") or 4
    default = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    return list(config.get("layer_types") or default)


def _check_hybrid(config: Mapping[str, Any]) -> None:
    _all_layers_moe(config)
    types, n = _layer_types(config), config.get("num_hidden_layers")
    every = config.get("full_attention_interval") or 4
    want = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(len(types))]
    if len(types) != n or types != want:
        raise UnsupportedError(
            f"config.json: layer_types {types} is not the pattern of full_attention_interval={every} "
            "(every n-th layer full attention), the only one the runtime runs")
    if config.get("attention_bias"):
        raise UnsupportedError("config.json: attention_bias is not supported for this architecture")
    nk, nv = config.get("linear_num_key_heads") or 0, config.get("linear_num_value_heads") or 0
    if nk <= 0 or nv % nk:
        raise FormatError(f"config.json: linear_num_value_heads ({nv}) must be a positive multiple of "
                          f"linear_num_key_heads ({nk})")


def _hybrid_layer_kind(config: Mapping[str, Any], bid: int) -> str:
    return "linear" if _layer_types(config)[bid] == "linear_attention" else "full"


_HYBRID_HPARAMS = tuple(h for h in _COMMON_HPARAMS if h.key != Keys.Rope.DIMENSION_COUNT) + (
    HParam(None, ("rope_parameters.partial_rotary_factor", "partial_rotary_factor"), "f32", default=0.25,
           dim="partial_rotary_factor"),
    HParam(Keys.Rope.DIMENSION_COUNT, (), "u32",
           default=lambda d: int(d["head_dim"] * d.get("partial_rotary_factor", 1.0)), dim="n_rot"),
    HParam(None, (), "u32", default=lambda d: 2 * d["n_head"] * d["head_dim"], dim="n_q_gate"),
    HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
    HParam(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, ("shared_expert_intermediate_size",), "u32",
           dim="n_ff_shexp"),
    _norm_topk(("norm_topk_prob",), True),
    HParam(Keys.SSM.CONV_KERNEL, ("linear_conv_kernel_dim",), "u32", dim="ssm_d_conv"),
    HParam(Keys.SSM.STATE_SIZE, ("linear_key_head_dim",), "u32", dim="ssm_d_state"),
    HParam(Keys.SSM.GROUP_COUNT, ("linear_num_key_heads",), "u32", dim="ssm_n_k"),
    HParam(Keys.SSM.TIME_STEP_RANK, ("linear_num_value_heads",), "u32", dim="ssm_n_v"),
    HParam(None, ("linear_value_head_dim",), "u32", dim="ssm_head_v"),
    HParam(Keys.SSM.INNER_SIZE, (), "u32", default=lambda d: d.get("ssm_head_v", 0) * d.get("ssm_n_v", 0),
           dim="ssm_d_inner"),
    HParam(None, (), "u32", default=lambda d: 2 * d["ssm_n_k"] * d["ssm_d_state"] + d["ssm_d_inner"],
           dim="ssm_conv_dim"),
    HParam(None, (), "u32", default=lambda d: 2 * d["ssm_n_v"], dim="ssm_n_ba"),
    HParam(Keys.LLM.FULL_ATTENTION_INTERVAL, ("full_attention_interval",), "u32", default=4,
           dim="full_attn_interval"),
    HParam(Keys.LLM.NEXTN_PREDICT_LAYERS, (), "u32", default=0, dim="n_layer_nextn"),   # the MTP block is not converted
)


def _hybrid_tensors(qwen35: bool) -> tuple[TensorSpec, ...]:
    """Both layer kinds. Norms whose HF weight w scales by (1 + w) are written as 1 + w, as
    llama.cpp's converter does (the gated norm of the linear layers scales by w). Qwen3.5's value
    heads are reordered from grouped to tiled over the key heads, as llama.cpp's converter does."""
    p = "model.layers.{bid}."
    a, lin = p + "self_attn.", p + "linear_attn."
    full = dict(layers="full")
    t = [
        TensorSpec("blk.{bid}.attn_norm.weight", p + "input_layernorm.weight", ("n_embd",), "norm",
                   transform="plus_one"),
        TensorSpec("blk.{bid}.attn_q.weight", a + "q_proj.weight", ("n_embd", "n_q_gate"), "attn", **full),
        TensorSpec("blk.{bid}.attn_k.weight", a + "k_proj.weight", ("n_embd", "n_kv"), "attn", **full),
        TensorSpec("blk.{bid}.attn_v.weight", a + "v_proj.weight", ("n_embd", "n_kv"), "attn", **full),
        TensorSpec("blk.{bid}.attn_output.weight", a + "o_proj.weight", ("n_q", "n_embd"), "attn", **full),
        TensorSpec("blk.{bid}.attn_q_norm.weight", a + "q_norm.weight", ("head_dim",), "norm",
                   transform="plus_one", **full),
        TensorSpec("blk.{bid}.attn_k_norm.weight", a + "k_norm.weight", ("head_dim",), "norm",
                   transform="plus_one", **full),
    ]
    ln = dict(layers="linear")
    if qwen35:
        t += [
            TensorSpec("blk.{bid}.attn_qkv.weight", lin + "in_proj_qkv.weight", ("n_embd", "ssm_conv_dim"), "attn",
                       transform="tiled_qkv", **ln),
            TensorSpec("blk.{bid}.attn_gate.weight", lin + "in_proj_z.weight", ("n_embd", "ssm_d_inner"), "attn",
                       transform="tiled_rows", **ln),
            TensorSpec("blk.{bid}.ssm_beta.weight", lin + "in_proj_b.weight", ("n_embd", "ssm_n_v"), "attn",
                       transform="tiled_heads", **ln),
            TensorSpec("blk.{bid}.ssm_alpha.weight", lin + "in_proj_a.weight", ("n_embd", "ssm_n_v"), "attn",
                       transform="tiled_heads", **ln),
        ]
    else:
        t += [
            TensorSpec("blk.{bid}.attn_qkv.weight", lin + "in_proj_qkvz.weight", ("n_embd", "ssm_conv_dim"),
                       "attn", transform="qkvz_qkv", **ln),
            TensorSpec("blk.{bid}.attn_gate.weight", lin + "in_proj_qkvz.weight", ("n_embd", "ssm_d_inner"),
                       "attn", transform="qkvz_z", **ln),
            TensorSpec("blk.{bid}.ssm_ba.weight", lin + "in_proj_ba.weight", ("n_embd", "ssm_n_ba"), "attn", **ln),
        ]
    tiled = "_tiled" if qwen35 else ""
    t += [
        TensorSpec("blk.{bid}.ssm_conv1d.weight", lin + "conv1d.weight", ("ssm_d_conv", "ssm_conv_dim"), "f32",
                   transform="conv" + tiled, **ln),
        TensorSpec("blk.{bid}.ssm_dt.bias", lin + "dt_bias", ("ssm_n_v",), "norm",
                   transform="tiled_heads" if qwen35 else None, **ln),
        TensorSpec("blk.{bid}.ssm_a", lin + "A_log", ("ssm_n_v",), "norm", transform="neg_exp" + tiled, **ln),
        TensorSpec("blk.{bid}.ssm_norm.weight", lin + "norm.weight", ("ssm_head_v",), "norm", **ln),
        TensorSpec("blk.{bid}.ssm_out.weight", lin + "out_proj.weight", ("ssm_d_inner", "n_embd"), "attn",
                   transform="tiled_cols" if qwen35 else None, **ln),
        TensorSpec("blk.{bid}.post_attention_norm.weight", p + "post_attention_layernorm.weight", ("n_embd",),
                   "norm", transform="plus_one"),
    ]
    moe = _moe("mlp", "gate_proj", "up_proj", "down_proj", shared_gated=True)[1:]   # its norm is above
    out_norm = dataclasses.replace(_GLOBAL_TENSORS[1], transform="plus_one")
    return (_GLOBAL_TENSORS[0], out_norm, _GLOBAL_TENSORS[2]) + tuple(t) + moe


_MTP = (("mtp.", "multi-token-prediction block"), ("model.mtp.", "multi-token-prediction block"))


def _qwen35_hparams() -> tuple[HParam, ...]:
    return _HYBRID_HPARAMS + (
        HParam(Keys.Rope.DIMENSION_SECTIONS, ("rope_parameters.mrope_section",), "sections", default=[11, 11, 10]),
    )


QWEN35MOE = ArchSpec(
    name="qwen35moe",
    hf_architectures=("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
    hparams=_qwen35_hparams(),
    tensors=_hybrid_tensors(qwen35=True),
    output_from_embd=True,
    check_config=_check_hybrid,
    layer_kind=_hybrid_layer_kind,
    skipped=_MTP + (("model.visual.", "vision tower"),),
    text_model=("model.language_model.", "model."),
)

QWEN3NEXT = ArchSpec(
    name="qwen3next",
    hf_architectures=("Qwen3NextForCausalLM",),
    hparams=_HYBRID_HPARAMS,
    tensors=_hybrid_tensors(qwen35=False),
    output_from_embd=True,
    check_config=_check_hybrid,
    layer_kind=_hybrid_layer_kind,
    skipped=_MTP,
)


# ---- qwen4exp (Qwen3.8-Flash-Next): Qwen3.5-MoE's layers with hyper-connections -------------

# The Gated DeltaNet's gated norm: rmsnorm(o) * w * act(z), act transformers' output_gate_type (or
# hidden_act). Written under a key of our own, rapidmoe.ssm.output_gate_func (GGUF has none).
_SSM_GATE = {"silu": 1, "sigmoid": 2}


def _qwen4exp_gate(config: Mapping[str, Any]) -> str:
    return config.get("output_gate_type") or config.get("hidden_act") or "silu"


def _check_qwen4exp(config: Mapping[str, Any]) -> None:
    _check_hybrid({**config, "layer_types": [t.replace("indexed_attention", "full_attention")
                                             for t in _layer_types(config)]})
    _check_ple(config)
    gate = _qwen4exp_gate(config)
    if gate not in _SSM_GATE:
        raise UnsupportedError(f"config.json: the linear layers' output gate {gate!r} is not supported "
                               f"({' or '.join(_SSM_GATE)})")
    if any(t != "linear_attention" for t in _layer_types(config)):
        keys = ("indexer_n_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")
        bad = [k for k in keys if not isinstance(config.get(k), int) or config[k] <= 0]
        if bad:
            raise FormatError(f"config.json: the QSA layers need {', '.join(bad)} (a positive integer each)")
        if config.get("indexer_kv_heads", 1) != 1:
            raise UnsupportedError(f"config.json: a QSA indexer of {config['indexer_kv_heads']} key heads is not "
                                   "supported (transformers' has one)")


# PLE's limits in the loader (weights.h: RM_PLE_MAX_NGRAM, _HEADS, _KERNEL)
_PLE_MAX_NGRAM, _PLE_MAX_HEADS, _PLE_MAX_KERNEL = 8, 256, 16


def ple_eos(config: Mapping[str, Any]) -> int | None:
    """The token that cuts PLE's n-grams: transformers' eos_token_id, the first of a list (llama.cpp's
    converter takes the last)."""
    eos = config.get("eos_token_id")
    return (eos[0] if eos else None) if isinstance(eos, list) else eos


def _check_ple(config: Mapping[str, Any]) -> None:
    """PLE layers (ple_layer_ids, 1-based) on linear layers, with an eos token and n-gram heads that
    divide ple_embed_dim, within the loader's limits."""
    ids = config.get("ple_layer_ids") or []
    if not ids:
        return
    types, n = _layer_types(config), config["num_hidden_layers"]
    bad = [i for i in ids if not isinstance(i, int) or not 1 <= i <= n or types[i - 1] != "linear_attention"]
    if bad:
        raise FormatError(f"config.json: ple_layer_ids {bad} name no linear-attention layer (1-based ids of "
                          "linear_attention layers)")
    if ple_eos(config) is None:
        raise FormatError("config.json: PLE layers (ple_layer_ids) need eos_token_id: their n-grams end at it")
    ngram, per = config.get("ngram_size", 3), config.get("heads_per_ngram", 8)
    kernel = config.get("ple_conv_kernel_size", 4)
    if not 2 <= ngram <= _PLE_MAX_NGRAM or not 1 <= (ngram - 1) * per <= _PLE_MAX_HEADS or \
            not 1 <= kernel <= _PLE_MAX_KERNEL:
        raise UnsupportedError(f"config.json: PLE with ngram_size {ngram}, heads_per_ngram {per} and "
                               f"ple_conv_kernel_size {kernel}: the runtime runs n-grams of 2 to {_PLE_MAX_NGRAM}, "
                               f"at most {_PLE_MAX_HEADS} heads and kernels of at most {_PLE_MAX_KERNEL}")
    dim = config.get("ple_embed_dim") or config["hidden_size"]
    if dim % ((ngram - 1) * per):
        raise FormatError(f"config.json: ple_embed_dim {dim} is not a multiple of the n-gram heads "
                          f"({(ngram - 1) * per})")


def _prepare_qwen4exp(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Each layer's QSA block length (0 in the linear layers), as llama.cpp writes them, and the
    linear layers' output gate as the loader reads it."""
    ratio = config.get("indexer_compress_ratio") or 0
    return dict(config, _compress_ratios=[0 if t == "linear_attention" else ratio for t in _layer_types(config)],
                _ssm_gate=_SSM_GATE[_qwen4exp_gate(config)])


def _hc(kind: str, hf: str, inject: bool = True) -> tuple[TensorSpec, ...]:
    """A hyper-connection: its grouped norm (1 + w per stream), the gate's low-rank pair and the
    streams' weights (absent in the output's mixer)."""
    t = (
        TensorSpec(f"{kind}_norm.weight", hf + "hc_norm.weight", ("n_hc_embd",), "norm", transform="plus_one"),
        TensorSpec(f"{kind}_down.weight", hf + "input_mix_weight_down.weight", ("n_hc_embd", "hc_low_rank"), "attn"),
        TensorSpec(f"{kind}_up.weight", hf + "input_mix_weight_up.weight", ("hc_low_rank", "n_hc_embd"), "attn"),
    )
    if inject:
        t += (TensorSpec(f"{kind}_inject.weight", hf + "block_inject_weight.weight", ("n_hc_embd", "hc_count"),
                         "attn"),)
    return t


def _qwen4exp_tensors() -> tuple[TensorSpec, ...]:
    p = "model.layers.{bid}."
    hybrid = [t for t in _hybrid_tensors(qwen35=True) if t.gguf not in (
        "output_norm.weight", "blk.{bid}.attn_norm.weight", "blk.{bid}.post_attention_norm.weight")]
    head = _hc("output_hc", "model.hyper_connection_mixer.", inject=False)
    attn, ffn = _hc("blk.{bid}.hc_attn", p + "attn_hyper_connection."), _hc("blk.{bid}.hc_ffn", p + "mlp_hyper_connection.")
    i, full = p + "self_attn.indexer.", dict(layers="full")
    qsa = (   # the indexer's one projection split into its queries and its key, as llama.cpp's converter does
        TensorSpec("blk.{bid}.indexer.q_proj.weight", i + "index_qk_proj.weight", ("n_embd", "n_index_q"), "attn",
                   transform="qsa_q", **full),
        TensorSpec("blk.{bid}.indexer.k_proj.weight", i + "index_qk_proj.weight", ("n_embd", "index_head_dim"),
                   "attn", transform="qsa_k", **full),
        TensorSpec("blk.{bid}.indexer.q_norm.weight", i + "q_layernorm.weight", ("index_head_dim",), "norm",
                   transform="plus_one", **full),
        TensorSpec("blk.{bid}.indexer.k_norm.weight", i + "k_layernorm.weight", ("index_head_dim",), "norm",
                   transform="plus_one", **full),
    )
    e, ple = p + "ple.", dict(layers="ple")
    ple_rows = (   # llama.cpp's names; the n-gram table and hash constants: sources.EXTRA_PLANS["ple"]
        TensorSpec("blk.{bid}.ple_key.weight", e + "key_proj.weight", ("n_ple_embd", "n_hc_embd"), "attn", **ple),
        TensorSpec("blk.{bid}.ple_value.weight", e + "value_proj.weight", ("n_ple_embd", "n_embd"), "attn", **ple),
        TensorSpec("blk.{bid}.ple_norm_key.weight", e + "norm_key.weight", ("n_hc_embd",), "norm",
                   transform="plus_one", **ple),
        TensorSpec("blk.{bid}.ple_norm_query.weight", e + "norm_query.weight", ("n_hc_embd",), "norm",
                   transform="plus_one", **ple),
        TensorSpec("blk.{bid}.ple_norm_conv.weight", e + "norm_conv.weight", ("n_hc_embd",), "norm",
                   transform="plus_one", **ple),
        TensorSpec("blk.{bid}.ple_conv1d.weight", e + "conv1d.weight", ("ple_conv_kernel", "n_hc_embd"), "f32",
                   transform="conv", **ple),
    )
    return tuple(hybrid[:2]) + head + attn + tuple(hybrid[2:8]) + qsa + tuple(hybrid[8:]) + ple_rows + ffn


QWEN4EXP = ArchSpec(
    name="qwen4exp",
    hf_architectures=("Qwen4ExpForCausalLM",),
    # transformers' Qwen4ExpTextConfig rotates the whole head when rope_parameters give no partial factor
    hparams=tuple(dataclasses.replace(h, default=1.0) if h.dim == "partial_rotary_factor" else h
                  for h in _qwen35_hparams()) + (
        HParam("{arch}.hyper_connection.count", ("hc_count",), "u32", default=4, dim="hc_count"),
        HParam("{arch}.hyper_connection.low_rank", ("hc_lowrank",), "u32", default=320, dim="hc_low_rank"),
        HParam(None, (), "u32", default=lambda d: d["hc_count"] * d["n_embd"], dim="n_hc_embd"),
        HParam("rapidmoe.ssm.output_gate_func", ("_ssm_gate",), "u32", default=_SSM_GATE["silu"], dim="ssm_gate"),
        # QSA's indexer (0 without indexed layers: an all-linear config may leave them out)
        HParam(Keys.Attention.Indexer.HEAD_COUNT, ("indexer_n_heads",), "u32", default=0, dim="index_n_head"),
        HParam(Keys.Attention.Indexer.KEY_LENGTH, ("indexer_head_dim",), "u32", default=0, dim="index_head_dim"),
        HParam(Keys.Attention.Indexer.TOP_K, ("indexer_budget",), "u32", default=0, dim="index_top_k"),
        HParam("{arch}.attention.compress_ratios", ("_compress_ratios",), "u32s", dim="compress_ratios"),
        HParam(None, (), "u32", default=lambda d: d["index_n_head"] * d["index_head_dim"], dim="n_index_q"),
        # PLE's sizes (its keys are written with its table: sources.EXTRA_PLANS["ple"])
        HParam(None, ("ple_embed_dim",), "u32", default=lambda d: d["n_embd"], dim="n_ple_embd"),
        HParam(None, ("ple_conv_kernel_size",), "u32", default=4, dim="ple_conv_kernel"),
    ),
    tensors=_qwen4exp_tensors(),
    extra_plan="ple",
    output_from_embd=True,
    check_config=_check_qwen4exp,
    prepare_config=_prepare_qwen4exp,
    layer_kind=_hybrid_layer_kind,
    skipped=_MTP,
)


# ---- MiniMax-M2: full-width q/k norms, partial RoPE, sigmoid routing with a selection bias ----

def _check_minimax_m2(config: Mapping[str, Any]) -> None:
    scoring = config.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise UnsupportedError(f"config.json: MiniMax-M2 with scoring_func '{scoring}' is not supported "
                               "(transformers routes it by sigmoid)")
    if config.get("use_routing_bias") is False:
        raise UnsupportedError("config.json: MiniMax-M2 without its routing bias is not supported")


MINIMAX_M2 = ArchSpec(
    name="minimax-m2",
    hf_architectures=("MiniMaxM2ForCausalLM",),
    hparams=tuple(h for h in _COMMON_HPARAMS if h.key != Keys.Rope.DIMENSION_COUNT) + (
        HParam(None, ("rope_parameters.partial_rotary_factor", "partial_rotary_factor"), "f32", default=1.0,
               dim="partial_rotary_factor"),
        # the released configs give rotary_dim, transformers' partial_rotary_factor of the head
        HParam(Keys.Rope.DIMENSION_COUNT, ("rotary_dim",), "u32",
               default=lambda d: int(d["head_dim"] * d.get("partial_rotary_factor", 1.0)), dim="n_rot"),
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff_exp"),
        _norm_topk((), True),
        # transformers routes by sigmoid whatever the config says; llama.cpp by this key (softmax without it)
        HParam(Keys.LLM.EXPERT_GATING_FUNC, (), "u32", default=_GATING["sigmoid"], dim="gating"),
        HParam(Keys.LLM.EXPERT_WEIGHTS_SCALE, (), "f32", default=1.0, dim="expert_weights_scale"),
    ),
    tensors=_GLOBAL_TENSORS + _attention("full") + _moe("block_sparse_moe", "w1", "w3", "w2") + (
        TensorSpec("blk.{bid}.exp_probs_b.bias", "model.layers.{bid}.block_sparse_moe.e_score_correction_bias",
                   ("n_expert",), "bias"),
    ),
    check_config=_check_minimax_m2,
)

# ---- MiMo-V2-Flash: sliding layers with sinks and more kv heads, values narrower than the keys ----

def _sliding_layers(swa: str, kv: str, kv_full: str) -> tuple[HParam, ...]:
    """Which layers slide and each layer's kv heads, per layer (from the prepared config's swa and
    kv lists), and the full layers' kv heads (kv_full)."""
    return (
        HParam("{arch}.attention.sliding_window_pattern", (swa,), "bools", dim="swa_layers"),
        HParam(Keys.Attention.HEAD_COUNT_KV, (kv,), "u32s", dim="n_head_kv_layers"),
        HParam(None, (kv_full,), "u32", dim="n_head_kv"),
    )


def _mimo2_layer_types(config: Mapping[str, Any]) -> list[str]:
    """transformers' layer_types, else the released config's hybrid_layer_pattern (1: sliding), else
    transformers' default: full attention on layer 0 and every 6th layer."""
    n = config["num_hidden_layers"]
    if config.get("layer_types") is not None:
        return list(config["layer_types"])
    if config.get("hybrid_layer_pattern") is not None:
        return ["sliding_attention" if v else "full_attention" for v in config["hybrid_layer_pattern"]]
    return ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]


def _mimo2_rope(config: Mapping[str, Any], kind: str) -> tuple[float, float]:
    """(theta, partial_rotary_factor) of a layer kind: transformers' rope_parameters per kind, else
    the released config's rope_theta / swa_rope_theta / partial_rotary_factor, else transformers'
    defaults."""
    per_kind = (config.get("rope_parameters") or {}).get(kind)
    if isinstance(per_kind, Mapping):
        if per_kind.get("rope_type", "default") != "default":
            raise UnsupportedError(f"config.json: MiMo's {kind} RoPE '{per_kind['rope_type']}' is not supported")
        return float(per_kind.get("rope_theta", 5e6 if kind == "full_attention" else 1e4)), \
            float(per_kind.get("partial_rotary_factor", 0.334))
    theta = config.get("rope_theta" if kind == "full_attention" else "swa_rope_theta")
    return float(theta if theta is not None else 5e6 if kind == "full_attention" else 1e4), \
        float(config.get("partial_rotary_factor", 0.334))


def _prepare_mimo2(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The values llama.cpp's mimo2 keys hold, from either form of the config (transformers' or the
    released one, whose extra keys transformers ignores), as transformers runs the model."""
    n = config["num_hidden_layers"]
    types = _mimo2_layer_types(config)
    if len(types) != n or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise FormatError(f"config.json: MiMo's layer kinds {types} are not {n} of full_attention/sliding_attention")
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or 192
    v_head_dim = config.get("v_head_dim") or 128
    checks = [   # transformers builds the sliding layers from the full ones' sizes
        (config.get("swa_num_key_value_heads") in (None, 2 * kv), "swa_num_key_value_heads other than twice "
         "num_key_value_heads (transformers gives the sliding layers twice the kv heads)"),
        (config.get("swa_head_dim") in (None, head_dim), "swa_head_dim other than head_dim"),
        (config.get("swa_v_head_dim") in (None, v_head_dim), "swa_v_head_dim other than v_head_dim"),
        (config.get("swa_num_attention_heads") in (None, config["num_attention_heads"]),
         "swa_num_attention_heads other than num_attention_heads"),
        (config.get("scoring_func", "sigmoid") == "sigmoid", f"scoring_func '{config.get('scoring_func')}'"),
        (config.get("topk_method", "noaux_tc") == "noaux_tc", f"topk_method '{config.get('topk_method')}'"),
        (not config.get("attention_bias"), "attention_bias"),
        (config.get("add_full_attention_sink_bias") in (None, False), "sinks on the full-attention layers"),
        (config.get("add_swa_attention_sink_bias") in (None, True), "sliding layers without sinks"),
        (not config.get("n_shared_experts"), "shared experts"),
    ]
    for ok, what in checks:
        if not ok:
            raise UnsupportedError(f"config.json: MiMo-V2-Flash with {what} is not supported")
    mlp = config.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    n_dense = next((i for i, t in enumerate(mlp) if t != "dense"), len(mlp))
    if len(mlp) != n or any(t != "sparse" for t in mlp[n_dense:]):
        raise UnsupportedError(f"config.json: mlp_layer_types {list(mlp)}: only leading dense layers are supported")
    (full_theta, full_part), (swa_theta, swa_part) = (_mimo2_rope(config, k) for k in ("full_attention",
                                                                                       "sliding_attention"))
    if full_part != swa_part:
        raise UnsupportedError(f"config.json: MiMo with partial_rotary_factor {full_part} on the full layers and "
                               f"{swa_part} on the sliding ones is not supported")
    # transformers: the released sliding_window_size previous tokens plus the query
    window = config["sliding_window_size"] + 1 if config.get("sliding_window_size") is not None \
        else config.get("sliding_window", 129)
    scale = config.get("routed_scaling_factor")
    return dict(config, _mimo_swa=[t == "sliding_attention" for t in types],
                _mimo_kv=[2 * kv if t == "sliding_attention" else kv for t in types], _mimo_kv_full=kv,
                _mimo_head_dim=head_dim, _mimo_v_head_dim=v_head_dim, _mimo_n_rot=int(head_dim * full_part),
                _mimo_full_theta=full_theta, _mimo_swa_theta=swa_theta, _mimo_window=window, _n_dense=n_dense,
                _mimo_eps=config.get("rms_norm_eps", config.get("layernorm_epsilon", 1e-5)),
                _mimo_v_scale=config.get("attention_value_scale", 0.707),
                _mimo_scale=1.0 if scale is None else scale, _norm_topk=bool(config.get("norm_topk_prob", True)),
                _n_group=int(config.get("n_group") or 1),
                _topk_group=int(config.get("topk_group") or config.get("n_group") or 1))


def _mimo2_layer_kind(config: Mapping[str, Any], bid: int) -> str:
    return "sliding" if _mimo2_layer_types(config)[bid] == "sliding_attention" else "full"


def _mimo2_tensors() -> tuple[TensorSpec, ...]:
    p = "model.layers.{bid}."
    a = p + "self_attn."
    t = [TensorSpec("blk.{bid}.attn_norm.weight", p + "input_layernorm.weight", ("n_embd",), "norm")]
    for kind, sfx in (("full", ""), ("sliding", "_swa")):
        t += [
            TensorSpec("blk.{bid}.attn_q.weight", a + "q_proj.weight", ("n_embd", "n_q"), "attn", layers=kind),
            TensorSpec("blk.{bid}.attn_k.weight", a + "k_proj.weight", ("n_embd", "n_kv" + sfx), "attn", layers=kind),
            TensorSpec("blk.{bid}.attn_v.weight", a + "v_proj.weight", ("n_embd", "n_kv_v" + sfx), "attn",
                       layers=kind),
            TensorSpec("blk.{bid}.attn_output.weight", a + "o_proj.weight", ("n_v", "n_embd"), "attn", layers=kind),
        ]
    # the sliding layers' sinks (the released name; transformers calls them sinks once loaded)
    t.append(TensorSpec("blk.{bid}.attn_sinks.weight", a + "attention_sink_bias", ("n_head",), "bias",
                        optional=True))
    # DeepSeek's FFN rows without the shared experts
    t += [f for f in _deepseek_ffn("blk.{bid}.ffn_norm.weight") if "_shexp." not in f.gguf]
    return _GLOBAL_TENSORS + tuple(t)


MIMO2 = ArchSpec(
    name="mimo2",
    hf_architectures=("MiMoV2FlashForCausalLM",),
    hparams=_COMMON_HPARAMS[:5] + _sliding_layers("_mimo_swa", "_mimo_kv", "_mimo_kv_full") + (
        HParam(None, (), "u32", default=lambda d: 2 * d["n_head_kv"], dim="n_head_kv_swa"),
        HParam(Keys.Attention.KEY_LENGTH, ("_mimo_head_dim",), "u32", dim="head_dim"),
        HParam(Keys.Attention.VALUE_LENGTH, ("_mimo_v_head_dim",), "u32", dim="head_dim_v"),
        HParam(Keys.Rope.DIMENSION_COUNT, ("_mimo_n_rot",), "u32", default=lambda d: d["head_dim"], dim="n_rot"),
        HParam(Keys.LLM.EXPERT_COUNT, ("n_routed_experts",), "u32", dim="n_expert"),
        HParam(Keys.LLM.EXPERT_USED_COUNT, ("num_experts_per_tok",), "u32", dim="n_expert_used"),
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
        _norm_topk(("_norm_topk",), True),
        HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff"),
        HParam(Keys.LLM.EXPERT_GATING_FUNC, (), "u32", default=_GATING["sigmoid"], dim="gating"),
        HParam(Keys.LLM.EXPERT_WEIGHTS_SCALE, ("_mimo_scale",), "f32", default=1.0, dim="expert_weights_scale"),
        HParam(Keys.LLM.EXPERT_GROUP_COUNT, ("_n_group",), "u32", default=1, dim="n_group"),
        HParam(Keys.LLM.EXPERT_GROUP_USED_COUNT, ("_topk_group",), "u32", default=lambda d: d["n_group"],
               dim="n_group_used"),
        HParam(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, ("_n_dense",), "u32", default=0, dim="n_layer_dense_lead"),
        # the checkpoint's multi-token-prediction layers are not converted
        HParam(Keys.LLM.NEXTN_PREDICT_LAYERS, (), "u32", default=0, dim="n_layer_nextn"),
        HParam(Keys.Attention.SLIDING_WINDOW, ("_mimo_window",), "u32", dim="n_swa"),
        HParam("{arch}.attention.value_scale", ("_mimo_v_scale",), "f32", default=1.0, dim="v_scale"),
        HParam(Keys.Attention.LAYERNORM_RMS_EPS, ("_mimo_eps",), "f32", default=1e-5, dim="rms_eps"),
        HParam(Keys.Rope.FREQ_BASE, ("_mimo_full_theta",), "f32", default=10000.0, dim="rope_base"),
        HParam("{arch}.rope.freq_base_swa", ("_mimo_swa_theta",), "f32", default=10000.0, dim="rope_base_swa"),
        HParam(None, (), "u32", default=lambda d: d["n_head_kv"] * d["head_dim_v"], dim="n_kv_v"),
        HParam(None, (), "u32", default=lambda d: d["n_head_kv_swa"] * d["head_dim"], dim="n_kv_swa"),
        HParam(None, (), "u32", default=lambda d: d["n_head_kv_swa"] * d["head_dim_v"], dim="n_kv_v_swa"),
        HParam(None, (), "u32", default=lambda d: d["n_head"] * d["head_dim_v"], dim="n_v"),
    ),
    tensors=_mimo2_tensors(),
    output_from_embd=True,
    prepare_config=_prepare_mimo2,
    layer_kind=_mimo2_layer_kind,
    sliding_window=True,
    skipped=_MTP,
)

# ---- Gemma 4 (26B-A4B): sliding and full layers of two shapes, a GELU FFN beside the experts ----

def _gemma4_layer_types(config: Mapping[str, Any]) -> list[str]:
    """transformers' layer_types, or its default (every 6th layer full); the last is always full."""
    n = config["num_hidden_layers"]
    types = list(config.get("layer_types") or
                 ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)])
    if types:
        types[-1] = "full_attention"
    return types


def _gemma4_full_layer(config: Mapping[str, Any], field: str) -> Any:
    """A full-attention layer's own value of field (per_layer_config, as transformers saves it)."""
    types = _gemma4_layer_types(config)
    for key, over in (config.get("per_layer_config") or {}).items():
        if int(key) < len(types) and types[int(key)] == "full_attention" and isinstance(over, Mapping):
            if over.get(field) is not None:
                return over[field]
    return None


def _check_gemma4(config: Mapping[str, Any]) -> None:
    act = config.get("hidden_activation") or "gelu_pytorch_tanh"
    checks = [
        (act == "gelu_pytorch_tanh", f"hidden_activation '{act}' (gelu_pytorch_tanh only)"),
        (bool(config.get("enable_moe_block")), "enable_moe_block false: a dense Gemma 4 is not an MoE model"),
        (not config.get("hidden_size_per_layer_input"), "per-layer input embeddings (hidden_size_per_layer_input)"),
        (not config.get("num_kv_shared_layers"), "layers sharing an earlier layer's KV (num_kv_shared_layers)"),
        (config.get("use_bidirectional_attention") != "all", "bidirectional attention"),
        (not config.get("attention_bias"), "attention_bias"),
    ]
    rope = config.get("rope_parameters") or {}
    for kind, want in (("sliding_attention", ("default",)), ("full_attention", ("default", "proportional"))):
        r = rope.get(kind) or {}
        checks.append((r.get("rope_type", "default") in want, f"{kind} RoPE '{r.get('rope_type')}'"))
        if kind == "sliding_attention":
            checks.append((r.get("partial_rotary_factor", 1.0) == 1.0, "partial RoPE on the sliding layers"))
    for ok, what in checks:
        if not ok:
            raise UnsupportedError(f"config.json: Gemma 4 with {what} is not supported")


def _prepare_gemma4(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The per-layer values llama.cpp's gemma4 keys hold, from transformers' config: which layers
    slide, each layer's kv heads, the full layers' head width (per_layer_config, else
    global_head_dim, else transformers' default 512) and their RoPE."""
    types = _gemma4_layer_types(config)
    swa_kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    full_kv = (config.get("num_global_key_value_heads") if config.get("attention_k_eq_v") else None) \
        or _gemma4_full_layer(config, "num_key_value_heads") or swa_kv
    full_hd = config.get("global_head_dim") or _gemma4_full_layer(config, "head_dim") or 512
    rope = config.get("rope_parameters") or {}
    full, swa = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    return dict(config, _g4_swa=[t == "sliding_attention" for t in types],
                _g4_kv=[swa_kv if t == "sliding_attention" else full_kv for t in types],
                _g4_full_kv=full_kv, _g4_full_head_dim=full_hd,
                _g4_full_theta=full.get("rope_theta", 1e6), _g4_swa_theta=swa.get("rope_theta", 1e4),
                _g4_full_partial=full.get("partial_rotary_factor", 1.0) if full.get("rope_type") == "proportional"
                else 1.0)


def _gemma4_layer_kind(config: Mapping[str, Any], bid: int) -> str:
    return "sliding" if _gemma4_layer_types(config)[bid] == "sliding_attention" else "full"


_GEMMA4_HPARAMS = _COMMON_HPARAMS[:5] + _sliding_layers("_g4_swa", "_g4_kv", "_g4_full_kv") + (
    HParam(None, ("num_key_value_heads",), "u32", default=lambda d: d["n_head"], dim="n_head_kv_swa"),
    HParam(Keys.Attention.KEY_LENGTH, ("_g4_full_head_dim",), "u32", dim="head_dim"),
    HParam(Keys.Attention.VALUE_LENGTH, ("_g4_full_head_dim",), "u32", dim="head_dim_v"),
    HParam(Keys.Rope.DIMENSION_COUNT, (), "u32", default=lambda d: d["head_dim"], dim="n_rot"),
    HParam("{arch}.attention.key_length_swa", ("head_dim",), "u32", default=lambda d: d["head_dim"],
           dim="head_dim_swa"),
    HParam("{arch}.attention.value_length_swa", ("head_dim",), "u32", default=lambda d: d["head_dim_swa"],
           dim="head_dim_swa"),
    HParam("{arch}.rope.dimension_count_swa", (), "u32", default=lambda d: d["head_dim_swa"], dim="n_rot_swa"),
    HParam(Keys.LLM.EXPERT_COUNT, ("num_experts",), "u32", dim="n_expert"),
    HParam(Keys.LLM.EXPERT_USED_COUNT, ("top_k_experts",), "u32", dim="n_expert_used"),
    HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
    _norm_topk((), True),
    HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff"),
    HParam(Keys.Attention.SLIDING_WINDOW, ("sliding_window",), "u32", dim="n_swa"),
    # llama.cpp writes no key without a cap; a cap of 1e30 leaves the logits as they are
    HParam("{arch}.final_logit_softcapping", ("final_logit_softcapping",), "f32", default=1e30, dim="final_softcap"),
    HParam("{arch}.embedding_length_per_layer_input", ("hidden_size_per_layer_input",), "u32", default=0,
           dim="n_embd_per_layer"),
    HParam("{arch}.attention.shared_kv_layers", ("num_kv_shared_layers",), "u32", default=0, dim="n_kv_shared"),
    HParam(Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",), "f32", dim="rms_eps"),
    HParam(Keys.Rope.FREQ_BASE, ("_g4_full_theta",), "f32", default=1e6, dim="rope_base"),
    HParam("{arch}.rope.freq_base_swa", ("_g4_swa_theta",), "f32", default=1e4, dim="rope_base_swa"),
    HParam(None, ("_g4_full_partial",), "f32", default=1.0, dim="rope_partial"),
    HParam(None, (), "u32", default=lambda d: d["n_head"] * d["head_dim_swa"], dim="n_q_swa"),
    HParam(None, (), "u32", default=lambda d: d["n_head_kv_swa"] * d["head_dim_swa"], dim="n_kv_swa"),
    HParam(None, (), "u32", default=lambda d: 2 * d["n_ff_exp"], dim="n_ff_exp2"),
    HParam(None, (), "u32", default=lambda d: d["n_rot"] // 2, dim="n_rot_half"),
    HParam(None, (), "u32", default=1, dim="1"),
)


def _gemma4_tensors() -> tuple[TensorSpec, ...]:
    """As llama.cpp's converter names them, norms as they are (Gemma 4 scales by w, not 1 + w); the
    experts' gate and up rows written apart (llama.cpp fuses them: the loader takes both forms);
    the full layers' proportional RoPE as rope_freqs, llama.cpp's frequency divisors."""
    p = "model.layers.{bid}."
    a, m = p + "self_attn.", p + "mlp."
    x = p + "experts.{xid}."
    t = [TensorSpec("rope_freqs.weight", "", ("n_rot_half",), "norm", transform="proportional_rope"),
         TensorSpec("blk.{bid}.attn_norm.weight", p + "input_layernorm.weight", ("n_embd",), "norm")]
    for kind, sfx in (("full", ""), ("sliding", "_swa")):
        t += [
            TensorSpec("blk.{bid}.attn_q.weight", a + "q_proj.weight", ("n_embd", "n_q" + sfx), "attn", layers=kind),
            TensorSpec("blk.{bid}.attn_k.weight", a + "k_proj.weight", ("n_embd", "n_kv" + sfx), "attn", layers=kind),
            # absent where the keys give the values too (attention_k_eq_v, the full layers)
            TensorSpec("blk.{bid}.attn_v.weight", a + "v_proj.weight", ("n_embd", "n_kv" + sfx), "attn",
                       optional=True, layers=kind),
            TensorSpec("blk.{bid}.attn_output.weight", a + "o_proj.weight", ("n_q" + sfx, "n_embd"), "attn",
                       layers=kind),
            TensorSpec("blk.{bid}.attn_q_norm.weight", a + "q_norm.weight", ("head_dim" + sfx,), "norm", layers=kind),
            TensorSpec("blk.{bid}.attn_k_norm.weight", a + "k_norm.weight", ("head_dim" + sfx,), "norm", layers=kind),
        ]
    t += [
        TensorSpec("blk.{bid}.post_attention_norm.weight", p + "post_attention_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.ffn_norm.weight", p + "pre_feedforward_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.ffn_gate.weight", m + "gate_proj.weight", ("n_embd", "n_ff"), "dense"),
        TensorSpec("blk.{bid}.ffn_up.weight", m + "up_proj.weight", ("n_embd", "n_ff"), "dense"),
        TensorSpec("blk.{bid}.ffn_down.weight", m + "down_proj.weight", ("n_ff", "n_embd"), "dense"),
        TensorSpec("blk.{bid}.post_ffw_norm_1.weight", p + "post_feedforward_layernorm_1.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.pre_ffw_norm_2.weight", p + "pre_feedforward_layernorm_2.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.post_ffw_norm_2.weight", p + "post_feedforward_layernorm_2.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.ffn_gate_inp.weight", p + "router.proj.weight", ("n_embd", "n_expert"), "router"),
        TensorSpec("blk.{bid}.ffn_gate_inp.scale", p + "router.scale", ("n_embd",), "norm"),
        # optional for the loader only, which also takes llama.cpp's fused ffn_gate_up_exps
        TensorSpec("blk.{bid}.ffn_gate_exps.weight", x + "gate_proj.weight", ("n_embd", "n_ff_exp", "n_expert"),
                   "expert", optional=True),
        TensorSpec("blk.{bid}.ffn_up_exps.weight", x + "up_proj.weight", ("n_embd", "n_ff_exp", "n_expert"),
                   "expert", optional=True),
        TensorSpec("blk.{bid}.ffn_down_exps.weight", x + "down_proj.weight", ("n_ff_exp", "n_embd", "n_expert"),
                   "expert"),
        TensorSpec("blk.{bid}.ffn_down_exps.scale", p + "router.per_expert_scale", ("n_expert",), "norm"),
        TensorSpec("blk.{bid}.post_ffw_norm.weight", p + "post_feedforward_layernorm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.layer_output_scale.weight", p + "layer_scalar", ("1",), "norm", optional=True),
    ]
    return _GLOBAL_TENSORS + tuple(t)


GEMMA4 = ArchSpec(
    name="gemma4",
    hf_architectures=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    hparams=_GEMMA4_HPARAMS,
    tensors=_gemma4_tensors(),
    output_from_embd=True,
    check_config=_check_gemma4,
    prepare_config=_prepare_gemma4,
    layer_kind=_gemma4_layer_kind,
    sliding_window=True,
    rope_scaling=("proportional",),
    skipped=(("model.vision_tower.", "vision tower"), ("model.audio_tower.", "audio tower"),
             ("model.embed_vision.", "vision embedder"), ("model.embed_audio.", "audio embedder")),
    text_model=("model.language_model.", "model."),
)

# ---- Step-3.5-Flash: sliding and full layers with their own query heads, a gate per head ----------

def _step35_layer_list(config: Mapping[str, Any], key: str, n: int, default: Any) -> list[Any]:
    """A per-layer list of the config, the released form's trailing next-token-prediction entries
    dropped; default for every layer when absent."""
    v = config.get(key)
    if v is None:
        return [default] * n
    if not isinstance(v, (list, tuple)) or len(v) < n:
        raise FormatError(f"config.json: {key} {v!r} is not a list of at least num_hidden_layers ({n}) entries")
    return list(v[:n])


def _step35_rope(config: Mapping[str, Any], types: list[str], kind: str) -> tuple[float, float, Any]:
    """(theta, partial_rotary_factor, scaling) of a layer kind, as transformers reads them: per kind in
    rope_parameters, else the released config's per-layer lists (the first layer of the kind)."""
    per_kind = (config.get("rope_parameters") or {}).get(kind)
    if isinstance(per_kind, Mapping):
        scaling = per_kind if per_kind.get("rope_type", "default") != "default" else None
        return float(per_kind.get("rope_theta", 10000.0)), float(per_kind.get("partial_rotary_factor", 1.0)), scaling
    i = types.index(kind)
    n = len(types)
    thetas = config.get("rope_theta", 10000.0)
    theta = _step35_layer_list(config, "rope_theta", n, None)[i] if isinstance(thetas, (list, tuple)) else thetas
    factors = config.get("partial_rotary_factors")
    factor = _step35_layer_list(config, "partial_rotary_factors", n, 1.0)[i] if factors is not None else 1.0
    scaling = config.get("rope_scaling") if kind == "full_attention" else None
    return float(theta), float(factor), scaling


def _prepare_step35(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The values llama.cpp's step35 keys hold, from the released config (the spelling llama.cpp's
    converter reads) or transformers' own, as transformers runs the model: the per-layer lists cut
    to the decoder's layers (the released ones also cover the next-token-prediction layers, which are
    not converted), the sliding layers' query heads from attention_other_setting."""
    n = config["num_hidden_layers"]
    types = _step35_layer_list(config, "layer_types", n, "full_attention")
    if any(t not in ("full_attention", "sliding_attention") for t in types):
        raise UnsupportedError(f"config.json: layer_types {types}: only full_attention and sliding_attention layers "
                               "are supported")
    heads = config["num_attention_heads"]
    other = config.get("attention_other_setting") or {}
    heads_swa = other.get("num_attention_heads") or config.get("num_sliding_attention_heads") or heads
    kv = config.get("num_attention_groups") or config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    checks = [   # transformers builds both layer kinds with these; the released config repeats them
        (other.get("num_attention_groups") in (None, kv), "attention_other_setting.num_attention_groups other than "
         "num_attention_groups (transformers gives the sliding layers the full layers' kv heads)"),
        (other.get("head_dim") in (None, head_dim), "attention_other_setting.head_dim other than head_dim"),
        (config.get("query_pre_attn_scalar") in (None, head_dim), "query_pre_attn_scalar other than head_dim "
         "(llama.cpp scales the logits by 1/sqrt(head_dim))"),
        (config.get("moe_router_activation", "sigmoid") == "sigmoid",
         f"moe_router_activation '{config.get('moe_router_activation')}'"),
        (not config.get("attention_bias"), "attention_bias"),
        (config.get("use_head_wise_attn_gate") in (None, True), "a gate per element instead of per head"),
    ]
    for ok, what in checks:
        if not ok:
            raise UnsupportedError(f"config.json: Step-3.5 with {what} is not supported")
    mlp = config.get("mlp_layer_types")
    if mlp is None:
        enum = config.get("moe_layers_enum")
        if enum is not None:   # the released form: the MoE layers' indices
            items = enum.split(",") if isinstance(enum, str) else enum
            moe = {int(i) for i in items if str(i).strip()}
        else:
            moe = set(range(3, n))   # transformers' default
        mlp = ["sparse" if i in moe else "dense" for i in range(n)]
    mlp = list(mlp[:n])
    n_dense = next((i for i, t in enumerate(mlp) if t != "dense"), len(mlp))
    if any(t != "sparse" for t in mlp[n_dense:]):
        raise UnsupportedError(f"config.json: MoE layers {mlp}: only leading dense layers are supported")
    kinds = {}
    for kind in ("full_attention", "sliding_attention"):
        if kind in types:
            kinds[kind] = _step35_rope(config, types, kind)
    want = {"full_attention": 0.5, "sliding_attention": 1.0}
    for kind, (_theta, factor, scaling) in kinds.items():
        if abs(factor - want[kind]) > 1e-6:
            raise UnsupportedError(f"config.json: Step-3.5's {kind} layers with partial_rotary_factor {factor}: "
                                   f"llama.cpp's step35 (and this runtime) rotate {want[kind]} of each head")
    full_scaling = kinds.get("full_attention", (None, None, None))[2]
    llama3 = None
    if full_scaling:   # transformers scales the full layers' RoPE only
        kind = full_scaling.get("rope_type", full_scaling.get("type"))
        if kind != "llama3":
            raise UnsupportedError(f"config.json: Step-3.5 with RoPE scaling '{kind}' is not supported (llama3 is)")
        llama3 = {k: float(full_scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                      "original_max_position_embeddings")}
    limits = [float(v or 0.0) for v in _step35_layer_list(config, "swiglu_limits", n, 0.0)]
    limits_sh = [float(v or 0.0) for v in _step35_layer_list(config, "swiglu_limits_shared", n, 0.0)]
    return dict(config, _st_swa=[t == "sliding_attention" for t in types],
                _st_heads=[heads_swa if t == "sliding_attention" else heads for t in types], _st_heads_full=heads,
                _st_heads_swa=heads_swa, _st_kv=[kv] * n, _st_kv_full=kv, _st_head_dim=head_dim,
                _st_experts=config.get("n_routed_experts") or config.get("moe_num_experts"),
                _st_used=config.get("num_experts_per_tok") or config.get("moe_top_k"),
                _st_shexp=config.get("share_expert_dim") or config.get("share_expert_dims"),
                _st_theta=kinds.get("full_attention", (10000.0,))[0],
                _st_theta_swa=kinds.get("sliding_attention", (10000.0,))[0],
                _n_dense=n_dense, _st_limits=limits, _st_limits_sh=limits_sh,
                _st_scale=float(config.get("moe_router_scaling_factor") or 1.0),
                _st_window=config.get("sliding_window") or config.get("max_position_embeddings"),
                _st_llama3=llama3)


def _step35_layer_kind(config: Mapping[str, Any], bid: int) -> str:
    types = _step35_layer_list(config, "layer_types", config["num_hidden_layers"], "full_attention")
    return "sliding" if types[bid] == "sliding_attention" else "full"


def _step35_tensors() -> tuple[TensorSpec, ...]:
    """As llama.cpp's converter names them: every norm written as 1 + w (the model scales by it), the
    stacked experts taken expert by expert, the shared expert beside them, the leading dense FFNs."""
    p = "model.layers.{bid}."
    a, m, s = p + "self_attn.", p + "moe.", p + "share_expert."
    norm = dict(transform="plus_one")
    t = [TensorSpec("blk.{bid}.attn_norm.weight", p + "input_layernorm.weight", ("n_embd",), "norm", **norm)]
    for kind, sfx in (("full", ""), ("sliding", "_swa")):
        t += [
            TensorSpec("blk.{bid}.attn_q.weight", a + "q_proj.weight", ("n_embd", "n_q" + sfx), "attn", layers=kind),
            TensorSpec("blk.{bid}.attn_k.weight", a + "k_proj.weight", ("n_embd", "n_kv" + sfx), "attn", layers=kind),
            TensorSpec("blk.{bid}.attn_v.weight", a + "v_proj.weight", ("n_embd", "n_kv" + sfx), "attn", layers=kind),
            TensorSpec("blk.{bid}.attn_output.weight", a + "o_proj.weight", ("n_q" + sfx, "n_embd"), "attn",
                       layers=kind),
            TensorSpec("blk.{bid}.attn_q_norm.weight", a + "q_norm.weight", ("head_dim" + sfx,), "norm", layers=kind,
                       **norm),
            TensorSpec("blk.{bid}.attn_k_norm.weight", a + "k_norm.weight", ("head_dim" + sfx,), "norm", layers=kind,
                       **norm),
            TensorSpec("blk.{bid}.attn_gate.weight", a + "g_proj.weight", ("n_embd", "n_head" + sfx), "attn",
                       layers=kind),
        ]
    t += [
        TensorSpec("blk.{bid}.ffn_norm.weight", p + "post_attention_layernorm.weight", ("n_embd",), "norm", **norm),
        TensorSpec("blk.{bid}.ffn_gate_inp.weight", m + "gate.weight", ("n_embd", "n_expert"), "router", layers="moe"),
        TensorSpec("blk.{bid}.exp_probs_b.bias", m + "router_bias", ("n_expert",), "bias", optional=True,
                   layers="moe"),
        TensorSpec("blk.{bid}.ffn_gate_exps.weight", m + "gate_proj.weight", ("n_embd", "n_ff_exp", "n_expert"),
                   "expert", transform="stacked", layers="moe"),
        TensorSpec("blk.{bid}.ffn_up_exps.weight", m + "up_proj.weight", ("n_embd", "n_ff_exp", "n_expert"),
                   "expert", transform="stacked", layers="moe"),
        TensorSpec("blk.{bid}.ffn_down_exps.weight", m + "down_proj.weight", ("n_ff_exp", "n_embd", "n_expert"),
                   "expert", transform="stacked", layers="moe"),
        TensorSpec("blk.{bid}.ffn_gate_shexp.weight", s + "gate_proj.weight", ("n_embd", "n_ff_shexp"), "shexp",
                   layers="moe"),
        TensorSpec("blk.{bid}.ffn_up_shexp.weight", s + "up_proj.weight", ("n_embd", "n_ff_shexp"), "shexp",
                   layers="moe"),
        TensorSpec("blk.{bid}.ffn_down_shexp.weight", s + "down_proj.weight", ("n_ff_shexp", "n_embd"), "shexp",
                   layers="moe"),
        TensorSpec("blk.{bid}.ffn_gate.weight", p + "mlp.gate_proj.weight", ("n_embd", "n_ff"), "dense",
                   layers="dense"),
        TensorSpec("blk.{bid}.ffn_up.weight", p + "mlp.up_proj.weight", ("n_embd", "n_ff"), "dense", layers="dense"),
        TensorSpec("blk.{bid}.ffn_down.weight", p + "mlp.down_proj.weight", ("n_ff", "n_embd"), "dense",
                   layers="dense"),
    ]
    out_norm = dataclasses.replace(_GLOBAL_TENSORS[1], transform="plus_one")
    # the full layers' llama3 RoPE scaling where the config has one, as llama.cpp writes it
    rope = TensorSpec("rope_freqs.weight", "", ("n_rot_half",), "norm", transform="llama3_rope")
    return (_GLOBAL_TENSORS[0], out_norm, _GLOBAL_TENSORS[2], rope) + tuple(t)


STEP35 = ArchSpec(
    name="step35",
    hf_architectures=("Step3p5ForCausalLM",),
    hparams=(
        HParam(Keys.LLM.VOCAB_SIZE, ("vocab_size",), "u32", dim="n_vocab"),
        HParam(Keys.LLM.CONTEXT_LENGTH, ("max_position_embeddings",), "u32", dim="n_ctx_train"),
        HParam(Keys.LLM.EMBEDDING_LENGTH, ("hidden_size",), "u32", dim="n_embd"),
        HParam(Keys.LLM.BLOCK_COUNT, ("num_hidden_layers",), "u32", dim="n_layer"),
        HParam("{arch}.attention.sliding_window_pattern", ("_st_swa",), "bools", dim="swa_layers"),
        HParam(Keys.Attention.HEAD_COUNT, ("_st_heads",), "u32s", dim="n_head_layers"),
        HParam(None, ("_st_heads_full",), "u32", dim="n_head"),
        HParam(None, ("_st_heads_swa",), "u32", dim="n_head_swa"),
        HParam(Keys.Attention.HEAD_COUNT_KV, ("_st_kv",), "u32s", dim="n_head_kv_layers"),
        HParam(None, ("_st_kv_full",), "u32", dim="n_head_kv"),
        HParam(None, ("_st_kv_full",), "u32", dim="n_head_kv_swa"),
        HParam(Keys.Attention.KEY_LENGTH, ("_st_head_dim",), "u32", dim="head_dim"),
        HParam(Keys.Attention.VALUE_LENGTH, ("_st_head_dim",), "u32", dim="head_dim_v"),
        HParam(None, (), "u32", default=lambda d: d["head_dim"], dim="head_dim_swa"),
        # the sliding layers turn all of it, the full ones half (llama.cpp hard-codes the half)
        HParam(Keys.Rope.DIMENSION_COUNT, (), "u32", default=lambda d: d["head_dim"], dim="n_rot"),
        HParam(Keys.LLM.EXPERT_COUNT, ("_st_experts",), "u32", dim="n_expert"),
        HParam(Keys.LLM.EXPERT_USED_COUNT, ("_st_used",), "u32", dim="n_expert_used"),
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
        # transformers renormalises the chosen experts' weights whatever the config says
        _norm_topk((), True),
        HParam(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, ("_st_shexp",), "u32", dim="n_ff_shexp"),
        HParam(Keys.LLM.FEED_FORWARD_LENGTH, ("intermediate_size",), "u32", dim="n_ff"),
        HParam(Keys.LLM.EXPERT_GATING_FUNC, (), "u32", default=_GATING["sigmoid"], dim="gating"),
        HParam(Keys.LLM.EXPERT_WEIGHTS_SCALE, ("_st_scale",), "f32", default=1.0, dim="expert_weights_scale"),
        HParam(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, ("_n_dense",), "u32", default=0, dim="n_layer_dense_lead"),
        # the checkpoint's next-token-prediction layers are not converted
        HParam(Keys.LLM.NEXTN_PREDICT_LAYERS, (), "u32", default=0, dim="n_layer_nextn"),
        HParam(Keys.Attention.SLIDING_WINDOW, ("_st_window",), "u32", dim="n_swa"),
        HParam(Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",), "f32", default=1e-5, dim="rms_eps"),
        HParam(Keys.Rope.FREQ_BASE, ("_st_theta",), "f32", default=10000.0, dim="rope_base"),
        HParam("{arch}.rope.freq_base_swa", ("_st_theta_swa",), "f32", default=10000.0, dim="rope_base_swa"),
        # the SwiGLU's limits per layer (0: none): the routed experts', the shared expert's and dense FFN's
        HParam("{arch}.swiglu_clamp_exp", ("_st_limits",), "f32s", dim="ffn_limit_layers"),
        HParam("{arch}.swiglu_clamp_shexp", ("_st_limits_sh",), "f32s", dim="ffn_limit_sh_layers"),
        HParam(None, (), "u32", default=lambda d: d["n_head_swa"] * d["head_dim"], dim="n_q_swa"),
        HParam(None, (), "u32", default=lambda d: d["n_head_kv_swa"] * d["head_dim"], dim="n_kv_swa"),
        HParam(None, (), "u32", default=lambda d: d["head_dim"] // 2, dim="n_rot_half"),
        HParam(None, (), "u32", default=lambda d: d["head_dim"] // 2, dim="rope_rot_full"),
        HParam(None, ("_st_llama3",), "dict", default=None, dim="rope_llama3"),
    ),
    tensors=_step35_tensors(),
    prepare_config=_prepare_step35,
    layer_kind=_step35_layer_kind,
    sliding_window=True,
    rope_scaling=("llama3",),
    drop_hf_layers_from="n_layer",
)

# ---- deepseek4 (DeepSeek-V4-Flash): mHC streams, compressed attention, hash routing ----------

# llama.cpp's DeepSeek-V4 layers compress by these ratios alone (its loader refuses others)
_DSV4_RATIOS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def _dsv4_layer_types(config: Mapping[str, Any]) -> list[str]:
    """Each layer's attention type: transformers' layer_types, or the released config's per-layer
    compress_ratios (0, 4, 128)."""
    n = int(config.get("num_hidden_layers") or 0)
    types = config.get("layer_types")
    if types is None and config.get("compress_ratios") is not None:
        by_ratio = {v: k for k, v in _DSV4_RATIOS.items()}
        bad = [r for r in config["compress_ratios"][:n] if r not in by_ratio]
        if bad:
            raise UnsupportedError(f"config.json: compress_ratios {bad} are not supported (llama.cpp's layers compress "
                                   "by 0, 4 or 128)")
        types = [by_ratio[r] for r in config["compress_ratios"]]
    if types is None:
        raise FormatError("config.json: DeepSeek-V4 needs layer_types (or compress_ratios), one per layer")
    types = list(types)[:n]
    if len(types) < n or any(t not in _DSV4_RATIOS for t in types):
        raise FormatError(f"config.json: layer_types {types!r} must name one of {', '.join(_DSV4_RATIOS)} for each "
                          f"of {n} layers")
    return types


def _dsv4_hash_layers(config: Mapping[str, Any]) -> int:
    """How many leading layers route by the token id table (mlp_layer_types' leading hash_moe, or
    num_hash_layers); llama.cpp's key counts leading layers, so a hash layer after a routed one is refused."""
    n = int(config.get("num_hidden_layers") or 0)
    types = config.get("mlp_layer_types")
    if types is None:
        return min(int(config.get("num_hash_layers", 3)), n)   # transformers' default: 3
    types = list(types)[:n]
    lead = next((i for i, t in enumerate(types) if t != "hash_moe"), len(types))
    if any(t == "hash_moe" for t in types[lead:]) or any(t not in ("hash_moe", "moe") for t in types):
        raise UnsupportedError(f"config.json: mlp_layer_types {types!r}: only leading hash_moe layers then moe "
                               "ones can be written (llama.cpp's hash_layer_count)")
    return lead


def _check_deepseek4(config: Mapping[str, Any]) -> None:
    if config.get("quantization_config"):
        q = config["quantization_config"]
        how = q.get("quant_method", "?") if isinstance(q, Mapping) else "?"
        raise UnsupportedError(f"config.json: DeepSeek-V4's quantized checkpoint (quantization_config, {how}: FP8 "
                               "attention, FP4 experts) is not converted yet; load it in transformers and save it in "
                               "bfloat16 first")
    if config.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise UnsupportedError(f"config.json: scoring_func {config['scoring_func']!r} is not supported (DeepSeek-V4's "
                               "llama.cpp files route by sqrtsoftplus)")
    rates = {**{"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
             **(config.get("compress_rates") or {})}
    used = set(_dsv4_layer_types(config)) - {"sliding_attention"}
    bad = {t: rates[t] for t in used if rates.get(t) != _DSV4_RATIOS[t]}
    if bad:
        raise UnsupportedError(f"config.json: compress_rates {bad} are not supported: llama.cpp's layers compress "
                               "by 4 (compressed_sparse_attention) and 128 (heavily_compressed_attention) alone")
    main = (config.get("rope_parameters") or {}).get("main") or {}
    if main.get("rope_type", "default") != "default":
        raise UnsupportedError(f"config.json: DeepSeek-V4's main RoPE {main['rope_type']!r} is not supported (its "
                               "sliding layers turn plain RoPE; YaRN is the compressed layers')")
    comp = _dsv4_compress_rope(config)
    kind = comp.get("rope_type", "default")
    if kind not in ("default", "yarn"):
        raise UnsupportedError(f"config.json: DeepSeek-V4's compress RoPE {kind!r} is not supported (default or yarn)")
    if kind == "yarn" and comp.get("attention_factor") != 1.0:
        raise UnsupportedError(f"config.json: DeepSeek-V4's compress YaRN with attention_factor "
                               f"{comp.get('attention_factor')!r}: transformers then scales the turned dims by it, "
                               "llama.cpp's graph by 1 only")
    n_head, groups = config.get("num_attention_heads"), config.get("o_groups")
    if isinstance(n_head, int) and isinstance(groups, int) and (groups <= 0 or n_head % groups):
        raise FormatError(f"config.json: num_attention_heads {n_head} is not a multiple of o_groups {groups}")


def _dsv4_compress_rope(config: Mapping[str, Any]) -> dict:
    """The compressed layers' RoPE parameters, as DeepseekV4Config reads them: rope_parameters'
    "compress" entry, or the flat rope_parameters / a released config's rope_scaling (YaRN there
    scales the compressed layers alone)."""
    rope = config.get("rope_parameters") or {}
    if isinstance(rope.get("compress"), Mapping):
        return dict(rope["compress"])
    flat = {k: v for k, v in {**(config.get("rope_scaling") or {}), **rope}.items() if k not in ("main", "compress")}
    if "type" in flat and "rope_type" not in flat:
        flat["rope_type"] = flat["type"]
    if flat.get("rope_type") == "yarn":
        flat.setdefault("attention_factor", 1.0)   # DeepseekV4Config sets it so for a flat YaRN
    return flat


def _prepare_deepseek4(config: Mapping[str, Any]) -> Mapping[str, Any]:
    n = int(config.get("num_hidden_layers") or 0)
    head_dim = config.get("head_dim")
    n_rot = config.get("qk_rope_head_dim")
    if n_rot is None and head_dim is not None:
        n_rot = int(head_dim * (config.get("partial_rotary_factor") or 64 / 512))
    rope = config.get("rope_parameters") or {}
    limit = float(config.get("swiglu_limit", 10.0))
    comp = _dsv4_compress_rope(config)
    yarn = comp.get("rope_type", "default") == "yarn"
    # YaRN as transformers computes it for the compressed layers (its `truncate` is read from the
    # top-level rope_parameters, where DeepSeek-V4 has none: always true, as llama.cpp)
    scaling = dict(_yarn_factor=float(comp.get("factor") or 1.0) if yarn else 1.0,
                   _yarn_orig=int(comp.get("original_max_position_embeddings") or config.get("max_position_embeddings")),
                   _yarn_beta_fast=float(comp.get("beta_fast") or 32.0),
                   _yarn_beta_slow=float(comp.get("beta_slow") or 1.0))
    return dict(config, **scaling, _n_rot=n_rot, _gating=4, _n_hash=_dsv4_hash_layers(config),
                _compress_ratios=[_DSV4_RATIOS[t] for t in _dsv4_layer_types(config)],
                _limits=[limit] * n,
                _rope_main=(rope.get("main") or {}).get("rope_theta", config.get("rope_theta", 10000.0)),
                _rope_compress=(rope.get("compress") or {}).get("rope_theta", config.get("compress_rope_theta",
                                                                                          160000.0)))


def _deepseek4_tensors() -> tuple[TensorSpec, ...]:
    """The tensors as transformers saves a DeepseekV4ForCausalLM (its names turned back towards the
    released ones: layers under model.layers.N.attn/ffn, the head as head.weight)."""
    p = "model.layers.{bid}."
    a, c, i, f = p + "attn.", p + "attn.compressor.", p + "attn.indexer.", p + "ffn."
    x, s = f + "experts.{xid}.", f + "shared_experts."
    csa, hca = dict(layers="csa"), dict(layers="hca")

    def mhc(kind: str) -> tuple[TensorSpec, ...]:
        return (
            TensorSpec(f"blk.{{bid}}.hc_{kind}_fn.weight", p + f"hc_{kind}_fn", ("n_hc_embd", "hc_mix"), "f32"),
            TensorSpec(f"blk.{{bid}}.hc_{kind}_base.weight", p + f"hc_{kind}_base", ("hc_mix",), "norm"),
            TensorSpec(f"blk.{{bid}}.hc_{kind}_scale.weight", p + f"hc_{kind}_scale", ("hc_scales",), "norm"),
        )

    def compressor(kind: dict, width: str, ratio: str) -> tuple[TensorSpec, ...]:
        return (
            TensorSpec("blk.{bid}.attn_compressor_kv.weight", c + "wkv.weight", ("n_embd", width), "attn", **kind),
            TensorSpec("blk.{bid}.attn_compressor_gate.weight", c + "wgate.weight", ("n_embd", width), "attn", **kind),
            TensorSpec("blk.{bid}.attn_compressor_ape.weight", c + "ape", (width, ratio), "f32", **kind),
            TensorSpec("blk.{bid}.attn_compressor_norm.weight", c + "norm.weight", ("head_dim",), "norm", **kind),
        )

    glob = (
        TensorSpec("token_embd.weight", "model.embed_tokens.weight", ("n_embd", "n_vocab"), "embd"),
        TensorSpec("output_norm.weight", "model.norm.weight", ("n_embd",), "norm"),
        TensorSpec("output.weight", "head.weight", ("n_embd", "n_vocab"), "output"),
        TensorSpec("output_hc_fn.weight", "model.hc_head.hc_fn", ("n_hc_embd", "hc_count"), "f32"),
        TensorSpec("output_hc_base.weight", "model.hc_head.hc_base", ("hc_count",), "norm"),
        TensorSpec("output_hc_scale.weight", "model.hc_head.hc_scale", ("hc_head_scales",), "norm"),
    )
    attn = (
        TensorSpec("blk.{bid}.attn_norm.weight", p + "attn_norm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.attn_sinks.weight", a + "attn_sink", ("n_head",), "norm"),
        TensorSpec("blk.{bid}.attn_q_a.weight", a + "wq_a.weight", ("n_embd", "q_lora_rank"), "attn"),
        TensorSpec("blk.{bid}.attn_q_a_norm.weight", a + "q_norm.weight", ("q_lora_rank",), "norm"),
        TensorSpec("blk.{bid}.attn_q_b.weight", a + "wq_b.weight", ("q_lora_rank", "n_q"), "attn"),
        TensorSpec("blk.{bid}.attn_kv.weight", a + "wkv.weight", ("n_embd", "head_dim"), "attn"),
        TensorSpec("blk.{bid}.attn_kv_a_norm.weight", a + "norm.weight", ("head_dim",), "norm"),
        TensorSpec("blk.{bid}.attn_output_a.weight", a + "wo_a.weight", ("n_o_in", "n_o_mid"), "attn"),
        TensorSpec("blk.{bid}.attn_output_b.weight", a + "wo_b.weight", ("n_o_mid", "n_embd"), "attn"),
    )
    indexer = (
        TensorSpec("blk.{bid}.indexer.proj.weight", i + "weights_proj.weight", ("n_embd", "index_n_head"), "attn", **csa),
        TensorSpec("blk.{bid}.indexer.attn_q_b.weight", i + "wq_b.weight", ("q_lora_rank", "n_index_q"), "attn", **csa),
        TensorSpec("blk.{bid}.indexer_compressor_kv.weight", i + "compressor.wkv.weight", ("n_embd", "index_head_dim2"),
                   "attn", **csa),
        TensorSpec("blk.{bid}.indexer_compressor_gate.weight", i + "compressor.wgate.weight",
                   ("n_embd", "index_head_dim2"), "attn", **csa),
        TensorSpec("blk.{bid}.indexer_compressor_ape.weight", i + "compressor.ape", ("index_head_dim2", "ratio_csa"),
                   "f32", **csa),
        TensorSpec("blk.{bid}.indexer_compressor_norm.weight", i + "compressor.norm.weight", ("index_head_dim",),
                   "norm", **csa),
    )
    ffn = (
        TensorSpec("blk.{bid}.ffn_norm.weight", p + "ffn_norm.weight", ("n_embd",), "norm"),
        TensorSpec("blk.{bid}.ffn_gate_inp.weight", f + "gate.weight", ("n_embd", "n_expert"), "router"),
        TensorSpec("blk.{bid}.exp_probs_b.bias", f + "gate.bias", ("n_expert",), "bias", optional=True,
                   layers="routed"),
        TensorSpec("blk.{bid}.ffn_gate_tid2eid.weight", f + "gate.tid2eid", ("n_expert_used", "n_vocab"), "index",
                   layers="hash"),
        TensorSpec("blk.{bid}.ffn_gate_exps.weight", x + "w1.weight", ("n_embd", "n_ff_exp", "n_expert"), "expert"),
        TensorSpec("blk.{bid}.ffn_up_exps.weight", x + "w3.weight", ("n_embd", "n_ff_exp", "n_expert"), "expert"),
        TensorSpec("blk.{bid}.ffn_down_exps.weight", x + "w2.weight", ("n_ff_exp", "n_embd", "n_expert"), "expert"),
        TensorSpec("blk.{bid}.ffn_gate_shexp.weight", s + "w1.weight", ("n_embd", "n_ff_shexp"), "shexp"),
        TensorSpec("blk.{bid}.ffn_up_shexp.weight", s + "w3.weight", ("n_embd", "n_ff_shexp"), "shexp"),
        TensorSpec("blk.{bid}.ffn_down_shexp.weight", s + "w2.weight", ("n_ff_shexp", "n_embd"), "shexp"),
    )
    return (glob + attn + mhc("attn") + mhc("ffn") + compressor(csa, "head_dim2", "ratio_csa")
            + compressor(hca, "head_dim", "ratio_hca") + indexer + ffn)


DEEPSEEK4 = ArchSpec(
    name="deepseek4",
    hf_architectures=("DeepseekV4ForCausalLM",),
    hparams=(
        HParam(Keys.LLM.VOCAB_SIZE, ("vocab_size",), "u32", dim="n_vocab"),
        HParam(Keys.LLM.CONTEXT_LENGTH, ("max_position_embeddings",), "u32", dim="n_ctx_train"),
        HParam(Keys.LLM.EMBEDDING_LENGTH, ("hidden_size",), "u32", dim="n_embd"),
        HParam(Keys.LLM.BLOCK_COUNT, ("num_hidden_layers",), "u32", dim="n_layer"),
        HParam(Keys.Attention.HEAD_COUNT, ("num_attention_heads",), "u32", dim="n_head"),
        HParam(Keys.Attention.HEAD_COUNT_KV, ("num_key_value_heads",), "u32", default=1, dim="n_head_kv"),
        HParam(Keys.Attention.KEY_LENGTH, ("head_dim",), "u32", dim="head_dim"),
        HParam(Keys.Attention.VALUE_LENGTH, ("head_dim",), "u32", default=lambda d: d["head_dim"], dim="head_dim_v"),
        HParam(Keys.Rope.DIMENSION_COUNT, ("_n_rot",), "u32", dim="n_rot"),
        HParam(Keys.Attention.LAYERNORM_RMS_EPS, ("rms_norm_eps",), "f32", dim="rms_eps"),
        HParam(Keys.Rope.FREQ_BASE, ("_rope_main",), "f32", default=10000.0, dim="rope_base"),
        HParam("{arch}.attention.compress_rope_freq_base", ("_rope_compress",), "f32", dim="compress_rope_base"),
        # YaRN on the compressed layers (llama.cpp's deepseek4 reads the common rope.scaling keys for them)
        HParam(Keys.Rope.SCALING_FACTOR, ("_yarn_factor",), "f32", default=1.0, dim="rope_yarn_factor"),
        HParam(Keys.Rope.SCALING_TYPE, (), "str",
               default=lambda d: "yarn" if d["rope_yarn_factor"] != 1.0 else "none", dim="rope_scaling"),
        HParam(Keys.Rope.SCALING_ORIG_CTX_LEN, ("_yarn_orig",), "u32", dim="n_ctx_orig_yarn"),
        HParam(Keys.Rope.SCALING_YARN_BETA_FAST, ("_yarn_beta_fast",), "f32", dim="yarn_beta_fast"),
        HParam(Keys.Rope.SCALING_YARN_BETA_SLOW, ("_yarn_beta_slow",), "f32", dim="yarn_beta_slow"),
        HParam(Keys.LLM.EXPERT_COUNT, ("n_routed_experts",), "u32", dim="n_expert"),
        HParam(Keys.LLM.EXPERT_USED_COUNT, ("num_experts_per_tok",), "u32", dim="n_expert_used"),
        HParam(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, ("moe_intermediate_size",), "u32", dim="n_ff_exp"),
        HParam(Keys.LLM.EXPERT_SHARED_COUNT, ("n_shared_experts",), "u32", default=0, dim="n_expert_shared"),
        _norm_topk(("norm_topk_prob",), True),
        HParam(Keys.LLM.EXPERT_GATING_FUNC, ("_gating",), "u32", dim="gating"),
        HParam(Keys.LLM.EXPERT_WEIGHTS_SCALE, ("routed_scaling_factor",), "f32", default=1.0,
               dim="expert_weights_scale"),
        # the checkpoint's next-token-prediction layers are not converted
        HParam(Keys.LLM.NEXTN_PREDICT_LAYERS, (), "u32", default=0, dim="n_layer_nextn"),
        HParam("{arch}.hash_layer_count", ("_n_hash",), "u32", default=0, dim="n_layer_hash"),
        HParam(Keys.Attention.Q_LORA_RANK, ("q_lora_rank",), "u32", dim="q_lora_rank"),
        HParam(Keys.Attention.SLIDING_WINDOW, ("sliding_window",), "u32", dim="n_swa"),
        HParam("{arch}.attention.output_group_count", ("o_groups",), "u32", dim="o_groups"),
        HParam("{arch}.attention.output_lora_rank", ("o_lora_rank",), "u32", dim="o_lora_rank"),
        HParam(Keys.Attention.Indexer.HEAD_COUNT, ("index_n_heads",), "u32", dim="index_n_head"),
        HParam(Keys.Attention.Indexer.KEY_LENGTH, ("index_head_dim",), "u32", dim="index_head_dim"),
        HParam(Keys.Attention.Indexer.TOP_K, ("index_topk",), "u32", dim="index_top_k"),
        HParam("{arch}.hyper_connection.count", ("hc_mult",), "u32", dim="hc_count"),
        HParam("{arch}.hyper_connection.sinkhorn_iterations", ("hc_sinkhorn_iters",), "u32", dim="hc_sinkhorn_iters"),
        HParam("{arch}.hyper_connection.epsilon", ("hc_eps",), "f32", dim="hc_eps"),
        HParam("{arch}.attention.compress_ratios", ("_compress_ratios",), "u32s", dim="compress_ratios"),
        # the SwiGLU's limit per layer: the routed experts' and the shared expert's (transformers' one swiglu_limit)
        HParam("{arch}.swiglu_clamp_exp", ("_limits",), "f32s", dim="ffn_limit_layers"),
        HParam("{arch}.swiglu_clamp_shexp", ("_limits",), "f32s", dim="ffn_limit_sh_layers"),
        # llama.cpp writes the streams' width as the output's
        HParam("{arch}.embedding_length_out", (), "u32", default=lambda d: d["hc_count"] * d["n_embd"],
               dim="n_embd_out"),
        HParam(None, (), "u32", default=lambda d: d["n_head"] * d["head_dim"], dim="n_q"),
        HParam(None, (), "u32", default=lambda d: d["n_ff_exp"] * max(d["n_expert_shared"], 1), dim="n_ff_shexp"),
        HParam(None, (), "u32", default=lambda d: d["index_n_head"] * d["index_head_dim"], dim="n_index_q"),
        HParam(None, (), "u32", default=lambda d: d["hc_count"] * d["n_embd"], dim="n_hc_embd"),
        HParam(None, (), "u32", default=lambda d: (2 + d["hc_count"]) * d["hc_count"], dim="hc_mix"),
        HParam(None, (), "u32", default=3, dim="hc_scales"),
        HParam(None, (), "u32", default=1, dim="hc_head_scales"),
        HParam(None, (), "u32", default=lambda d: d["n_head"] * d["head_dim"] // d["o_groups"], dim="n_o_in"),
        HParam(None, (), "u32", default=lambda d: d["o_groups"] * d["o_lora_rank"], dim="n_o_mid"),
        HParam(None, (), "u32", default=lambda d: 2 * d["head_dim"], dim="head_dim2"),
        HParam(None, (), "u32", default=lambda d: 2 * d["index_head_dim"], dim="index_head_dim2"),
        HParam(None, (), "u32", default=4, dim="ratio_csa"),
        HParam(None, (), "u32", default=128, dim="ratio_hca"),
    ),
    tensors=_deepseek4_tensors(),
    check_config=_check_deepseek4,
    prepare_config=_prepare_deepseek4,
    rope_scaling=("yarn",),   # the compressed layers' (_check_deepseek4 reads which)
    sliding_window=True,
    hf_rope_interleaved=True,
    skipped=(("mtp.", "multi-token-prediction block"),),
)

ARCHS: dict[str, ArchSpec] = {a.name: a for a in (LLAMA, QWEN2MOE, QWEN3MOE, OLMOE, QWEN35MOE, QWEN3NEXT, QWEN4EXP, GLM4MOE,
                                                  DEEPSEEK2, GLM_DSA, DEEPSEEK32, GPT_OSS, MINIMAX_M2, MIMO2,
                                                  GEMMA4, STEP35, DEEPSEEK4)}
# Special tokens llama.cpp's converter names by text for a family: GLM ends a turn at the next
# user turn (eot) or a tool call's observation (eom).
SPECIAL_TOKEN_TEXTS = {a: {"eot": "<|user|>", "eom": "<|observation|>"}
                       for a in ("Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM")}


# ---------------------------------------------------------------------------------------------
# Lookups
# ---------------------------------------------------------------------------------------------

def arch_for_hf(config: Mapping[str, Any], where: str = "config.json") -> ArchSpec:
    names = config.get("architectures") or []
    for spec in ARCHS.values():
        if any(n in spec.hf_architectures for n in names):
            return spec
    known = sorted(n for s in ARCHS.values() for n in s.hf_architectures)
    shown = ", ".join(names) if names else "(none: no 'architectures' entry)"
    raise UnsupportedError(f"{where}: unknown architecture {shown}; supported: {', '.join(known)}")


def arch_for_gguf(name: str, where: str) -> ArchSpec:
    spec = ARCHS.get(name)
    if spec is None:
        raise UnsupportedError(
            f"{where}: architecture '{name}' is not supported; supported: {', '.join(sorted(ARCHS))}")
    return spec


def _config_get(config: Mapping[str, Any], path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return None
        node = node[part]
    return node


def _coerce(value: Any, kind: str, where: str) -> Any:
    if kind == "dict":   # a dimension only (never written): a mapping of the config's, or None
        if value is not None and not isinstance(value, Mapping):
            raise FormatError(f"{where}: {value!r} is not a mapping")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise FormatError(f"{where}: {value!r} is not a string")
        return value
    if kind in ("u32s", "bools", "f32s"):   # one value per layer
        if not isinstance(value, (list, tuple)) or not value:
            raise FormatError(f"{where}: {value!r} is not a list of per-layer values")
        return [_coerce(v, kind[:-1], where) for v in value]
    if kind == "sections":   # rope.dimension_sections: four section widths, unused ones 0
        if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 4:
            raise FormatError(f"{where}: {value!r} is not a list of at most 4 section widths")
        return [int(v) for v in value] + [0] * (4 - len(value))
    try:
        if kind == "bool":
            if not isinstance(value, (bool, int)):
                raise TypeError
            return bool(value)
        if kind == "u32":
            if isinstance(value, bool) or int(value) != value or not 0 <= int(value) < 2**32:
                raise ValueError
            return int(value)
        if isinstance(value, bool):
            raise TypeError
        f = float(value)
    except (TypeError, ValueError):
        raise FormatError(f"{where}: {value!r} is not a valid {kind}") from None
    if not math.isfinite(f) or abs(f) > FLOAT32_MAX:  # f32 in the file: 1e300 would become inf
        raise FormatError(f"{where}: {value!r} is not a finite number (as float32)")
    return f


@dataclasses.dataclass
class ResolvedHParams:
    """The hyperparameters of one checkpoint: ``kv`` (full GGUF key -> (value, kind)) to write,
    and ``dims`` (dimension name -> value) for tensor shapes."""

    kv: dict[str, tuple[Any, str]]
    dims: dict[str, Any]

    def shape(self, ne: Sequence[str]) -> tuple[int, ...]:
        return tuple(int(self.dims[n]) for n in ne)


def resolve_hparams(spec: ArchSpec, config: Mapping[str, Any], where: str = "config.json") -> ResolvedHParams:
    if spec.check_config is not None:
        spec.check_config(config)
    if spec.prepare_config is not None:
        config = spec.prepare_config(config)
    kv: dict[str, tuple[Any, str]] = {}
    dims: dict[str, Any] = {}
    if spec.name in ("deepseek2", "glm-dsa", "deepseek32"):   # key_length_mla comes from the two parts of a head
        dims["n_nope"] = _coerce(config.get("qk_nope_head_dim"), "u32", f"{where}: qk_nope_head_dim")
    for h in spec.hparams:
        key = h.key.format(arch=spec.name) if h.key else None
        value = None
        for name in h.hf:
            value = _config_get(config, name)
            if value is not None:
                break
        if value is None:
            if h.default is REQUIRED:
                names = " or ".join(repr(n) for n in h.hf)
                raise FormatError(f"{where}: missing {names}, needed for {key or h.dim} ({spec.name})")
            value = h.default(dims) if callable(h.default) else h.default
        value = _coerce(value, h.kind, f"{where}: {h.hf[0] if h.hf else key}")
        if key:
            kv[key] = (value, h.kind)
        if h.dim:
            dims[h.dim] = value
    for n in ("n_embd", "n_head", "n_head_kv", "n_layer", "n_expert", "n_expert_used", "head_dim"):
        if n in dims and dims[n] <= 0:
            raise FormatError(f"{where}: {n} must be positive, got {dims[n]}")
    if dims["n_expert_used"] > dims["n_expert"]:
        raise FormatError(f"{where}: num_experts_per_tok ({dims['n_expert_used']}) exceeds the "
                          f"number of experts ({dims['n_expert']})")
    if dims["n_head"] % dims["n_head_kv"]:
        raise FormatError(f"{where}: num_attention_heads ({dims['n_head']}) is not a multiple of "
                          f"num_key_value_heads ({dims['n_head_kv']})")
    dims["n_q"] = dims["n_head"] * dims["head_dim"]
    dims["n_kv"] = dims["n_head_kv"] * dims["head_dim"]
    if "n_expert_shared" in dims:   # DeepSeek/GLM: the shared experts' total width
        dims["n_ff_shexp"] = dims["n_ff_exp"] * dims["n_expert_shared"]
    if "kv_lora_rank" in dims:
        dims["n_nope"] = dims["head_dim"] - dims["n_rot"]
        dims["n_v"] = dims["n_head"] * dims["head_dim_v"]
    if spec.extra_kv is not None:
        kv.update({k.format(arch=spec.name): v for k, v in spec.extra_kv(config).items()})
    if dims.get("n_group", 1) > 1 and dims["n_expert"] % dims["n_group"]:
        raise FormatError(f"{where}: n_routed_experts ({dims['n_expert']}) is not a multiple of n_group "
                          f"({dims['n_group']})")
    return ResolvedHParams(kv, dims)


# ---------------------------------------------------------------------------------------------
# What the runtime reads: the C rows (native/src/model/arch.c), through rm_arch_describe
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class NativeHParam:
    """One key the loader reads. Values are rm_arch_hparam_info's text: a number, a field read
    before it ("n_head") or a quotient of two ("n_embd/n_head"); None when not given."""

    key: str                 # after "{arch}."
    field: str               # the value it fills ("n_head_kv"), as rm_model_info names it
    kind: str                # "int" | "bool" | "float"
    default: str | None      # None: required
    min: str | None          # accepted range (ints); None: unbounded
    max: str | None
    run_min: str | None      # what the forward pass runs; None: everything accepted
    run_max: str | None
    field_swa: str | None = None   # the key may hold a value per layer: the sliding layers' field


@dataclasses.dataclass(frozen=True)
class NativeTensor:
    """One tensor of a layer as the loader binds it."""

    name: str                # "blk.{bid}.attn_q.weight"
    field: str               # the rm_layer field
    residual: bool           # in the sidecar
    required: bool
    f32: bool                # read as floats: must be F32
    expert: bool             # one matrix per routed expert along ne[2]
    ne: tuple[str, ...]      # dimension names, trailing 1s dropped
    when: int = 0            # the RM_LAYER_* bits a layer needs to hold it


@dataclasses.dataclass(frozen=True)
class NativeArch:
    name: str
    family: str              # "Mixtral" for llama; "" when the name says it
    qk_norm: str             # "none" | "per_head" | "full"
    rope: str                # "norm" | "neox"
    shared_expert: str       # "none" | "gated"
    layer_kind: int          # RM_LAYER_* bits
    hparams: tuple[NativeHParam, ...]
    tensors: tuple[NativeTensor, ...]

    def hparam(self, field: str) -> NativeHParam:
        return next(h for h in self.hparams if h.field == field)


@functools.lru_cache(maxsize=1)
def native_archs() -> dict[str, NativeArch]:
    """The C table, one ``NativeArch`` per architecture the library runs."""
    from ._native import check, ffi, lib

    text = lambda p: ffi.string(p).decode() or None  # noqa: E731
    qk = {lib.RM_QK_NORM_NONE: "none", lib.RM_QK_NORM_PER_HEAD: "per_head", lib.RM_QK_NORM_FULL: "full"}
    rope = {lib.RM_ROPE_NORM: "norm", lib.RM_ROPE_NEOX: "neox"}
    shexp = {lib.RM_SHEXP_NONE: "none", lib.RM_SHEXP_GATED: "gated", lib.RM_SHEXP_PLAIN: "plain"}
    kinds = {lib.RM_HPARAM_INT: "int", lib.RM_HPARAM_BOOL: "bool", lib.RM_HPARAM_FLOAT: "float"}
    out = {}
    for a in range(lib.rm_arch_count()):
        ai = ffi.new("rm_arch_info *")
        check(lib.rm_arch_describe(a, ai))
        hps, tensors = [], []
        for i in range(ai.n_hparams):
            h = ffi.new("rm_arch_hparam_info *")
            check(lib.rm_arch_hparam_describe(a, i, h))
            hps.append(NativeHParam(text(h.key), text(h.field), kinds[h.kind], text(h.dflt), text(h.min),
                                    text(h.max), text(h.run_min), text(h.run_max),
                                    text(h.field_swa) if h.field_swa != ffi.NULL else None))
        for i in range(ai.n_tensors):
            t = ffi.new("rm_arch_tensor_info *")
            check(lib.rm_arch_tensor_describe(a, i, t))
            ne = [ffi.string(t.ne[d]).decode() for d in range(3)]
            while len(ne) > 1 and ne[-1] == "1":
                ne.pop()
            tensors.append(NativeTensor(text(t.name).replace("%d", "{bid}"), text(t.field), bool(t.residual),
                                        bool(t.required), bool(t.f32), bool(t.expert), tuple(ne), int(t.when)))
        name = text(ai.name)
        out[name] = NativeArch(name, ffi.string(ai.family).decode(), qk[ai.qk_norm], rope[ai.rope],
                               shexp[ai.shared_expert], int(ai.layer_kind), tuple(hps), tuple(tensors))
    return out
