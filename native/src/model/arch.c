/* arch.c - the architecture table: per general.architecture, the keys the loader reads, the
 * tensors each layer holds, and the behaviour that llama.cpp hard-codes per architecture (and
 * that therefore is not in the file). model.c binds a model by walking a row; rm_arch_describe
 * gives the same rows to the converter and the planner. */
#include "arch.h"

#include <stdio.h>
#include <string.h>

#include "status.h"

#define COUNT(a) ((int32_t) (sizeof(a) / sizeof((a)[0])))

/* ---- hyperparameters ------------------------------------------------------------------------ */

#define HPOFF(f)   ((uint16_t) offsetof(rm_hparams, f))
#define K(v)       {RM_EXPR_CONST, (double) (v), 0, 0, NULL}
#define V(f)       {RM_EXPR_FIELD, 0, HPOFF(f), 0, #f}
#define DIV(f, g)  {RM_EXPR_RATIO, 0, HPOFF(f), HPOFF(g), #f "/" #g}
#define REQUIRED   {RM_EXPR_NONE, 0, 0, 0, NULL}
#define ANY        {RM_EXPR_NONE, 0, 0, 0, NULL}

/* key, field, default, accepted range; rows read in order, so a value may use the rows above it */
#define INT(key, f, dflt, lo, hi)  {key, #f, HPOFF(f), RM_HPARAM_INT, dflt, lo, hi, ANY, ANY, NULL, 0, NULL}
#define BOOL(key, f, dflt)         {key, #f, HPOFF(f), RM_HPARAM_BOOL, dflt, K(0), K(1), ANY, ANY, NULL, 0, NULL}
#define FLOAT(key, f, dflt)        {key, #f, HPOFF(f), RM_HPARAM_FLOAT, dflt, ANY, ANY, ANY, ANY, NULL, 0, NULL}
/* an integer that may also be a per-layer array: the sliding layers' value into f_swa */
#define INT_SWA(key, f, f_swa, dflt, lo, hi) {key, #f, HPOFF(f), RM_HPARAM_INT, dflt, lo, hi, ANY, ANY, NULL, HPOFF(f_swa), #f_swa}

#define HP_ATTENTION                                                                                  \
    INT("embedding_length",        n_embd,        REQUIRED,          K(1), K(1 << 20)),               \
    INT("block_count",             n_layer,       REQUIRED,          K(1), K(4096)),                  \
    INT("attention.head_count",    n_head,        REQUIRED,          K(1), K(4096)),                  \
    INT("attention.head_count_kv", n_head_kv,     V(n_head),         K(1), V(n_head)),                \
    INT("attention.key_length",    head_dim,      DIV(n_embd, n_head), K(1), K(1 << 16)),             \
    INT("rope.dimension_count",    n_rot,         V(head_dim),       K(2), V(head_dim))

#define HP_EXPERTS                                                                                    \
    INT("expert_count",            n_expert,      REQUIRED,          K(1), K(512)),                   \
    INT("expert_used_count",       n_expert_used, REQUIRED,          K(1), V(n_expert))

/* llama.cpp writes the experts' FFN width under one key or the other, per architecture */
#define HP_FF_EXP(key) INT(key, n_ff_exp, REQUIRED, K(1), K(1 << 20))
#define HP_CONTEXT     INT("context_length", n_ctx_train, K(4096), K(1), K(1 << 24))
/* renormalise the top-k weights unless the key says otherwise; the default is the row's behaviour */
#define HP_NORM_TOPK(dflt) BOOL("expert_weights_norm", norm_topk, K(dflt))

/* value_length is read so that a file with value heads of another width (MLA) is refused by
 * name rather than misread */
#define HP_TAIL                                                                                       \
    {"attention.value_length", "head_dim_v", HPOFF(head_dim_v), RM_HPARAM_INT, V(head_dim), ANY, ANY, \
     V(head_dim), V(head_dim), "value_length == key_length", 0, NULL},                                         \
    FLOAT("attention.layer_norm_rms_epsilon", rms_eps,   K(1e-5f)),                                   \
    FLOAT("rope.freq_base",                   rope_base, K(10000.0f))

static const rm_hparam_row HP_LLAMA[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(1), HP_TAIL,
};
static const rm_hparam_row HP_QWEN2MOE[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(0),
    INT("expert_shared_feed_forward_length", n_ff_shexp, REQUIRED, K(1), K(1 << 20)),
    HP_TAIL,
};
static const rm_hparam_row HP_QWEN3MOE[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(1), HP_TAIL,
};
static const rm_hparam_row HP_OLMOE[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(0), HP_TAIL,
};
/* gpt-oss: the chosen experts are weighted by a softmax over their logits, which is the
 * renormalised top-k of a softmax over all; llama.cpp does so whatever expert_weights_norm says.
 * YaRN from the rope.scaling keys; llama.cpp's gpt-oss loader takes beta 32/1 (the released
 * models' values) where the file is silent. */
static const rm_hparam_row HP_GPT_OSS[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT,
    {"expert_weights_norm", "norm_topk", HPOFF(norm_topk), RM_HPARAM_BOOL, K(1), K(0), K(1), K(1), K(1),
     "gpt-oss weights the chosen experts by a softmax over their logits", 0, NULL},
    INT("attention.sliding_window",         n_swa,           REQUIRED,       K(1), K(1 << 24)),
    INT("attention.sliding_window_pattern", swa_pattern,     K(2),           K(1), K(4096)),
    FLOAT("rope.scaling.factor",            rope_yarn_factor, K(1.0f)),
    INT("rope.scaling.original_context_length", n_ctx_orig_yarn, V(n_ctx_train), K(1), K(1 << 24)),
    FLOAT("rope.scaling.yarn_beta_fast",    yarn_beta_fast,  K(32.0f)),
    FLOAT("rope.scaling.yarn_beta_slow",    yarn_beta_slow,  K(1.0f)),
    HP_TAIL,
};

/* DeepSeek-V2/V3 and GLM: leading dense layers, shared experts of n_ff_exp each, sigmoid or
 * softmax scores with a selection bias, group-limited top-k and a scale on the routed weights. */
#define HP_DEEPSEEK_MOE(gating_dflt)                                                                  \
    HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(0),                 \
    INT("feed_forward_length",       n_ff,               REQUIRED, K(1), K(1 << 20)),                \
    INT("expert_shared_count",       n_expert_shared,    K(0),     K(0), K(64)),                     \
    INT("leading_dense_block_count", n_layer_dense_lead, K(0),     K(0), V(n_layer)),                \
    {"expert_gating_func", "gating", HPOFF(gating), RM_HPARAM_INT, K(gating_dflt), K(0), K(16), K(1), K(2), \
     "softmax (1) or sigmoid (2)", 0, NULL},                                                                   \
    FLOAT("expert_weights_scale",    expert_weights_scale, K(1.0f)),                                 \
    INT("expert_group_count",        n_group,            K(1),     K(1), V(n_expert)),               \
    INT("expert_group_used_count",   n_group_used,       V(n_group), K(1), V(n_group)),              \
    INT("nextn_predict_layers",      n_layer_nextn,      K(0),     K(0), V(n_layer))

static const rm_hparam_row HP_GLM4MOE[] = {
    HP_ATTENTION, HP_DEEPSEEK_MOE(RM_GATING_SIGMOID), HP_TAIL,
};

/* MLA's leading rows: the model's width and depth, its query heads, and one kv head (the latent) */
#define HP_MLA_HEADS                                                                                  \
    INT("embedding_length",         n_embd,       REQUIRED, K(1), K(1 << 20)),                       \
    INT("block_count",              n_layer,      REQUIRED, K(1), K(4096)),                          \
    INT("attention.head_count",     n_head,       REQUIRED, K(1), K(4096)),                          \
    {"attention.head_count_kv", "n_head_kv", HPOFF(n_head_kv), RM_HPARAM_INT, K(1), K(1), V(n_head), K(1), K(1), \
     "MLA shares one latent between all heads", 0, NULL}

/* MLA: one latent of kv_lora_rank (+ the shared rotary key) per position; llama.cpp writes the
 * latent's sizes under key_length/value_length and the per-head sizes under the _mla keys. */
static const rm_hparam_row HP_DEEPSEEK2[] = {
    HP_MLA_HEADS,
    {"attention.key_length_mla", "head_dim", HPOFF(head_dim), RM_HPARAM_INT, REQUIRED, K(2), K(1 << 16), ANY, ANY,
     "files made before llama.cpp split attn_kv_b into attn_k_b and attn_v_b lack it: convert the model again", 0, NULL},
    INT("attention.value_length_mla", head_dim_v, REQUIRED, K(1), K(1 << 16)),
    INT("rope.dimension_count",     n_rot,        REQUIRED, K(2), V(head_dim)),
    INT("attention.q_lora_rank",    q_lora_rank,  K(0),     K(0), K(1 << 16)),
    INT("attention.kv_lora_rank",   kv_lora_rank, REQUIRED, K(1), K(1 << 16)),
    HP_DEEPSEEK_MOE(RM_GATING_SOFTMAX),
    FLOAT("attention.layer_norm_rms_epsilon", rms_eps,   K(1e-6f)),
    FLOAT("rope.freq_base",                   rope_base, K(10000.0f)),
};

/* GLM-5 and DeepSeek-V3.2: DeepSeek-V3's MLA (with the q low rank) and routing, sigmoid by default,
 * and DeepSeek sparse attention: a lightning indexer of head_count heads of key_length picks top_k
 * positions. */
static const rm_hparam_row HP_DSA[] = {
    HP_MLA_HEADS,
    INT("attention.key_length_mla", head_dim,     REQUIRED, K(2), K(1 << 16)),
    INT("attention.value_length_mla", head_dim_v, REQUIRED, K(1), K(1 << 16)),
    INT("rope.dimension_count",     n_rot,        REQUIRED, K(2), V(head_dim)),
    {"attention.q_lora_rank", "q_lora_rank", HPOFF(q_lora_rank), RM_HPARAM_INT, REQUIRED, K(1), K(1 << 16), ANY, ANY,
     "the indexer's queries come from the q low rank", 0, NULL},
    INT("attention.kv_lora_rank",   kv_lora_rank, REQUIRED, K(1), K(1 << 16)),
    INT("attention.indexer.head_count", index_n_head,   REQUIRED, K(1), K(4096)),
    INT("attention.indexer.key_length", index_head_dim, REQUIRED, V(n_rot), K(1 << 16)),
    INT("attention.indexer.top_k",      index_top_k,    REQUIRED, K(1), K(1 << 24)),
    HP_DEEPSEEK_MOE(RM_GATING_SIGMOID),
    FLOAT("attention.layer_norm_rms_epsilon", rms_eps,   K(1e-6f)),
    FLOAT("rope.freq_base",                   rope_base, K(10000.0f)),
};

/* Qwen3.5-MoE and Qwen3-Next: the experts and gated shared expert of qwen2moe, always renormalised
 * (llama.cpp hard-codes it), and llama.cpp's ssm.* keys for the Gated DeltaNet layers. */
#define HP_SSM                                                                                        \
    INT("ssm.conv_kernel",         ssm_d_conv,    REQUIRED,          K(2), K(64)),                    \
    INT("ssm.state_size",          ssm_d_state,   REQUIRED,          K(1), K(1 << 12)),               \
    INT("ssm.group_count",         ssm_n_k,       REQUIRED,          K(1), K(1 << 12)),               \
    INT("ssm.time_step_rank",      ssm_n_v,       REQUIRED,          V(ssm_n_k), K(1 << 12)),         \
    INT("ssm.inner_size",          ssm_d_inner,   REQUIRED,          V(ssm_n_v), K(1 << 20)),         \
    INT("full_attention_interval", full_attn_interval, K(4),         K(1), K(4096))

static const rm_hparam_row HP_QWEN_HYBRID[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(1),
    INT("expert_shared_feed_forward_length", n_ff_shexp, REQUIRED, K(1), K(1 << 20)),
    HP_TAIL, HP_SSM,
    /* llama.cpp's files of checkpoints with an MTP block count it in block_count, last */
    INT("nextn_predict_layers", n_layer_nextn, K(0), K(0), V(n_layer)),
};

/* qwen4exp (Qwen3.8-Flash-Next): the Qwen3.5 hybrid's keys and its hyper-connections' streams and rank. */
static const rm_hparam_row HP_QWEN4EXP[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(1),
    INT("expert_shared_feed_forward_length", n_ff_shexp, REQUIRED, K(1), K(1 << 20)),
    HP_TAIL, HP_SSM,
    INT("hyper_connection.count",    hc_count,    REQUIRED, K(2), K(64)),
    INT("hyper_connection.low_rank", hc_low_rank, REQUIRED, K(1), K(1 << 16)),
    /* QSA's indexer: its query heads and their width, and the positions a token keeps (its budget);
     * 0 where the file has no indexed layers (model.c checks them where it has) */
    INT("attention.indexer.head_count", index_n_head,   K(0), K(0), K(4096)),
    INT("attention.indexer.key_length", index_head_dim, K(0), K(0), K(1 << 16)),
    INT("attention.indexer.top_k",      index_top_k,    K(0), K(0), K(1 << 24)),
};

/* Gemma 4: sliding layers (attention.sliding_window_pattern, a per-layer list) with their own head
 * width, kv heads, rotary dims and base; the others' kv heads may be fewer (head_count_kv per layer);
 * logit soft-capping. Per-layer input embeddings and shared KV layers (the small dense models) are
 * refused by their keys. */
static const rm_hparam_row HP_GEMMA4[] = {
    INT("embedding_length",        n_embd,        REQUIRED,          K(1), K(1 << 20)),
    INT("block_count",             n_layer,       REQUIRED,          K(1), K(4096)),
    INT("attention.head_count",    n_head,        REQUIRED,          K(1), K(4096)),
    INT_SWA("attention.head_count_kv", n_head_kv, n_head_kv_swa, V(n_head), K(1), V(n_head)),
    INT("attention.key_length",    head_dim,      DIV(n_embd, n_head), K(1), K(1 << 16)),
    INT("rope.dimension_count",    n_rot,         V(head_dim),       K(2), V(head_dim)),
    INT("attention.key_length_swa", head_dim_swa, V(head_dim),       K(1), K(1 << 16)),
    {"attention.value_length_swa", "head_dim_swa", HPOFF(head_dim_swa), RM_HPARAM_INT, V(head_dim_swa), ANY, ANY,
     V(head_dim_swa), V(head_dim_swa), "value_length_swa == key_length_swa", 0, NULL},
    INT("rope.dimension_count_swa", n_rot_swa,    V(head_dim_swa),   K(2), V(head_dim_swa)),
    HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT,
    {"expert_weights_norm", "norm_topk", HPOFF(norm_topk), RM_HPARAM_BOOL, K(1), K(0), K(1), K(1), K(1),
     "Gemma 4 renormalises the chosen experts' weights", 0, NULL},
    INT("feed_forward_length",     n_ff,          REQUIRED,          K(1), K(1 << 20)),
    INT("attention.sliding_window", n_swa,        REQUIRED,          K(1), K(1 << 24)),
    FLOAT("final_logit_softcapping", final_softcap, K(1e30f)),
    {"embedding_length_per_layer_input", "n_embd_per_layer", HPOFF(n_embd_per_layer), RM_HPARAM_INT, K(0), K(0),
     K(1 << 20), K(0), K(0), "per-layer input embeddings (Gemma 4's E2B/E4B) are not run", 0, NULL},
    {"attention.shared_kv_layers", "n_kv_shared", HPOFF(n_kv_shared), RM_HPARAM_INT, K(0), K(0), V(n_layer), K(0),
     K(0), "layers that reuse earlier layers' KV (Gemma 4's E2B/E4B) are not run", 0, NULL},
    {"attention.value_length", "head_dim_v", HPOFF(head_dim_v), RM_HPARAM_INT, V(head_dim), ANY, ANY,
     V(head_dim), V(head_dim), "value_length == key_length", 0, NULL},
    FLOAT("attention.layer_norm_rms_epsilon", rms_eps, K(1e-6f)),
    /* transformers' defaults for Gemma 4's full and sliding layers */
    FLOAT("rope.freq_base",        rope_base,     K(1000000.0f)),
    FLOAT("rope.freq_base_swa",    rope_base_swa, K(10000.0f)),
};

/* MiniMax-M2: sigmoid scores with a selection bias, the chosen weights renormalised (llama.cpp
 * hard-codes it); transformers routes by sigmoid whatever the config says, llama.cpp by the file's
 * expert_gating_func (softmax without one): the default follows transformers. */
static const rm_hparam_row HP_MINIMAX_M2[] = {
    HP_ATTENTION, HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT,
    {"expert_weights_norm", "norm_topk", HPOFF(norm_topk), RM_HPARAM_BOOL, K(1), K(0), K(1), K(1), K(1),
     "MiniMax-M2 renormalises the chosen experts' weights", 0, NULL},
    {"expert_gating_func", "gating", HPOFF(gating), RM_HPARAM_INT, K(RM_GATING_SIGMOID), K(0), K(16), K(1), K(2),
     "softmax (1) or sigmoid (2)", 0, NULL},
    FLOAT("expert_weights_scale", expert_weights_scale, K(1.0f)),
    HP_TAIL,
};

/* MiMo-V2-Flash: sliding layers (a per-layer list, of 32-bit integers in llama.cpp's files) with
 * their own kv heads (head_count_kv per layer) and RoPE base; value heads narrower than the keys,
 * the values scaled; sigmoid routing with a selection bias, renormalised (llama.cpp hard-codes
 * both), optional expert groups and a scale (llama.cpp ignores them: its files of the released
 * models have one group and no scale). llama.cpp writes no count of the leading dense layers:
 * they are the ones without a router (RM_ARCH_DENSE_BY_ROUTER). */
static const rm_hparam_row HP_MIMO2[] = {
    INT("embedding_length",        n_embd,        REQUIRED,          K(1), K(1 << 20)),
    INT("block_count",             n_layer,       REQUIRED,          K(1), K(4096)),
    INT("attention.head_count",    n_head,        REQUIRED,          K(1), K(4096)),
    INT_SWA("attention.head_count_kv", n_head_kv, n_head_kv_swa, V(n_head), K(1), V(n_head)),
    INT("attention.key_length",    head_dim,      DIV(n_embd, n_head), K(1), K(1 << 16)),
    INT("attention.value_length",  head_dim_v,    V(head_dim),       K(1), K(1 << 16)),
    INT("rope.dimension_count",    n_rot,         V(head_dim),       K(2), V(head_dim)),
    HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(1),
    INT("feed_forward_length",     n_ff,          REQUIRED,          K(1), K(1 << 20)),
    {"expert_gating_func", "gating", HPOFF(gating), RM_HPARAM_INT, K(RM_GATING_SIGMOID), K(0), K(16),
     K(RM_GATING_SIGMOID), K(RM_GATING_SIGMOID), "MiMo routes by sigmoid", 0, NULL},
    FLOAT("expert_weights_scale",  expert_weights_scale, K(1.0f)),
    INT("expert_group_count",      n_group,       K(1),              K(1), V(n_expert)),
    INT("expert_group_used_count", n_group_used,  V(n_group),        K(1), V(n_group)),
    INT("leading_dense_block_count", n_layer_dense_lead, K(0),       K(0), V(n_layer)),
    INT("nextn_predict_layers",    n_layer_nextn, K(0),              K(0), V(n_layer)),
    INT("attention.sliding_window", n_swa,        REQUIRED,          K(1), K(1 << 24)),
    FLOAT("attention.value_scale", v_scale,       K(1.0f)),
    FLOAT("attention.layer_norm_rms_epsilon", rms_eps, K(1e-5f)),
    FLOAT("rope.freq_base",        rope_base,     K(10000.0f)),
    /* transformers' default for the sliding layers; llama.cpp's converter writes it from the config */
    FLOAT("rope.freq_base_swa",    rope_base_swa, K(10000.0f)),
};

/* Step-3.5: sliding layers (a per-layer list) with their own query heads (head_count per layer);
 * the full layers rotate half of each head, the sliding ones all of it (RM_ARCH_FULL_ROT_HALF),
 * each kind with its own base; sigmoid routing with a selection bias and a scale, an ungated shared
 * expert, leading dense layers. transformers always renormalises the chosen experts' weights,
 * llama.cpp only where expert_weights_norm says so: the default follows transformers. */
static const rm_hparam_row HP_STEP35[] = {
    INT("embedding_length",        n_embd,        REQUIRED,          K(1), K(1 << 20)),
    INT("block_count",             n_layer,       REQUIRED,          K(1), K(4096)),
    INT_SWA("attention.head_count", n_head,       n_head_swa, REQUIRED, K(1), K(4096)),
    INT_SWA("attention.head_count_kv", n_head_kv, n_head_kv_swa, V(n_head), K(1), K(4096)),
    INT("attention.key_length",    head_dim,      DIV(n_embd, n_head), K(1), K(1 << 16)),
    INT("rope.dimension_count",    n_rot,         V(head_dim),       K(2), V(head_dim)),
    HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(1),
    INT("expert_shared_feed_forward_length", n_ff_shexp, REQUIRED,   K(1), K(1 << 20)),
    INT("feed_forward_length",     n_ff,          REQUIRED,          K(1), K(1 << 20)),
    {"expert_gating_func", "gating", HPOFF(gating), RM_HPARAM_INT, K(RM_GATING_SIGMOID), K(0), K(16), K(1), K(2),
     "softmax (1) or sigmoid (2)", 0, NULL},
    FLOAT("expert_weights_scale",  expert_weights_scale, K(1.0f)),
    INT("leading_dense_block_count", n_layer_dense_lead, K(0),       K(0), V(n_layer)),
    INT("nextn_predict_layers",    n_layer_nextn, K(0),              K(0), V(n_layer)),
    INT("attention.sliding_window", n_swa,        REQUIRED,          K(1), K(1 << 24)),
    FLOAT("attention.layer_norm_rms_epsilon", rms_eps, K(1e-5f)),
    FLOAT("rope.freq_base",        rope_base,     K(10000.0f)),
    /* llama.cpp's default where the converter writes none (a config with one rope_theta) */
    FLOAT("rope.freq_base_swa",    rope_base_swa, K(10000.0f)),
    {"attention.value_length", "head_dim_v", HPOFF(head_dim_v), RM_HPARAM_INT, V(head_dim), ANY, ANY,
     V(head_dim), V(head_dim), "value_length == key_length", 0, NULL},
};

/* DeepSeek-V4: one key head of head_dim that is also the value, partial RoPE (the last n_rot of each
 * head), a sliding window, the q low rank, a grouped output projection; manifold-constrained
 * hyper-connections; compressed layers (attention.compress_ratios) with their own RoPE base and a
 * lightning indexer in the CSA ones; sqrt(softplus) routing with a selection bias (the first
 * hash_layer_count layers by a table per token id), ungated shared experts, clamped SwiGLUs. */
static const rm_hparam_row HP_DEEPSEEK4[] = {
    INT("embedding_length",        n_embd,        REQUIRED,          K(1), K(1 << 20)),
    INT("block_count",             n_layer,       REQUIRED,          K(1), K(4096)),
    INT("attention.head_count",    n_head,        REQUIRED,          K(1), K(4096)),
    {"attention.head_count_kv", "n_head_kv", HPOFF(n_head_kv), RM_HPARAM_INT, K(1), K(1), K(1), K(1), K(1),
     "DeepSeek-V4's one key head is also its value", 0, NULL},
    INT("attention.key_length",    head_dim,      REQUIRED,          K(2), K(1 << 16)),
    INT("rope.dimension_count",    n_rot,         REQUIRED,          K(2), V(head_dim)),
    HP_EXPERTS, HP_FF_EXP("expert_feed_forward_length"), HP_CONTEXT, HP_NORM_TOPK(1),
    INT("expert_shared_count",     n_expert_shared, K(0),            K(0), K(64)),
    {"expert_gating_func", "gating", HPOFF(gating), RM_HPARAM_INT, REQUIRED, K(0), K(16),
     K(RM_GATING_SQRT_SOFTPLUS), K(RM_GATING_SQRT_SOFTPLUS), "DeepSeek-V4 routes by sqrt(softplus) (4)", 0, NULL},
    FLOAT("expert_weights_scale",  expert_weights_scale, K(1.0f)),
    INT("nextn_predict_layers",    n_layer_nextn, K(0),              K(0), V(n_layer)),
    INT("hash_layer_count",        n_layer_hash,  K(0),              K(0), V(n_layer)),
    INT("attention.q_lora_rank",   q_lora_rank,   REQUIRED,          K(1), K(1 << 16)),
    INT("attention.sliding_window", n_swa,        REQUIRED,          K(1), K(1 << 24)),
    INT("attention.output_group_count", o_groups, REQUIRED,          K(1), V(n_head)),
    INT("attention.output_lora_rank", o_lora_rank, REQUIRED,         K(1), K(1 << 16)),
    INT("attention.indexer.head_count", index_n_head,   REQUIRED,    K(1), K(4096)),
    INT("attention.indexer.key_length", index_head_dim, REQUIRED,    V(n_rot), K(1 << 16)),
    INT("attention.indexer.top_k",      index_top_k,    REQUIRED,    K(1), K(1 << 24)),
    INT("hyper_connection.count",  hc_count,      REQUIRED,          K(1), K(64)),
    INT("hyper_connection.sinkhorn_iterations", hc_sinkhorn_iters, REQUIRED, K(1), K(1 << 10)),
    FLOAT("hyper_connection.epsilon", hc_eps,     REQUIRED),
    HP_TAIL,
    FLOAT("attention.compress_rope_freq_base", compress_rope_base, REQUIRED),
    /* YaRN on the compressed layers' RoPE alone (llama.cpp's deepseek4: the sliding layers plain) */
    FLOAT("rope.scaling.factor",            rope_yarn_factor, K(1.0f)),
    INT("rope.scaling.original_context_length", n_ctx_orig_yarn, V(n_ctx_train), K(1), K(1 << 24)),
    FLOAT("rope.scaling.yarn_beta_fast",    yarn_beta_fast,  K(32.0f)),
    FLOAT("rope.scaling.yarn_beta_slow",    yarn_beta_slow,  K(1.0f)),
};

/* ---- per-layer tensors ---------------------------------------------------------------------- */

#define LOFF(f) ((uint16_t) offsetof(rm_layer, f))
#define NE(a, b, c) {RM_DIM_##a, RM_DIM_##b, RM_DIM_##c}

/* name, field, presence, the kind bits a layer needs, read as floats, shape */
#define T(name, f, presence, when, f32, ne) {name, #f, LOFF(f), 0, presence, 0, when, f32, 0, ne, RM_GROUP_NONE}
#define T_BIAS(name, f, ne, group) {name, #f, LOFF(f), 0, RM_TENSOR_REQUIRED_WHEN, RM_LAYER_BIAS, 0, 1, 0, ne, group}
#define T_PAIRED(name, f, group, when, ne) {name, #f, LOFF(f), 0, RM_TENSOR_OPTIONAL, 0, when, 1, 0, ne, group}
#define T_EXP(name, f, residual, ne) {name, #f, LOFF(f), residual, RM_TENSOR_REQUIRED, 0, RM_LAYER_FFN_MOE, 0, 1, ne, RM_GROUP_NONE}

#define ATTN_QKV (RM_LAYER_ATTN_FULL | RM_LAYER_ATTN_SLIDING)   /* plain multi-head attention */
#define REQ RM_TENSOR_REQUIRED

/* The attention rows of plain multi-head attention, with the q/k/v biases a row may require. */
#define PLAIN_ATTENTION                                                                             \
    T("blk.%d.attn_norm.weight",   attn_norm, REQ, 0,        1, NE(EMBD, ONE, ONE)),                \
    T("blk.%d.attn_q.weight",      wq,        REQ, ATTN_QKV, 0, NE(EMBD, Q, ONE)),                  \
    T("blk.%d.attn_k.weight",      wk,        REQ, ATTN_QKV, 0, NE(EMBD, KV, ONE)),                 \
    T("blk.%d.attn_v.weight",      wv,        REQ, ATTN_QKV, 0, NE(EMBD, KV, ONE)),                 \
    T_BIAS("blk.%d.attn_q.bias",   bq,                           NE(Q, ONE, ONE), RM_GROUP_QKV_BIAS),  \
    T_BIAS("blk.%d.attn_k.bias",   bk,                           NE(KV, ONE, ONE), RM_GROUP_QKV_BIAS), \
    T_BIAS("blk.%d.attn_v.bias",   bv,                           NE(KV, ONE, ONE), RM_GROUP_QKV_BIAS), \
    T("blk.%d.attn_output.weight", wo,        REQ, ATTN_QKV, 0, NE(Q, EMBD, ONE))

/* Rows every MoE layer shares: the routed experts, their residuals (bound only with a sidecar) and
 * an ungated shared expert's three products (a gated one adds ffn_gate_inp_shexp). */
#define ROUTED_EXPERTS                                                                              \
    T_EXP("blk.%d.ffn_gate_exps.weight", gate_exps, 0, NE(EMBD, FF_EXP, EXPERT)),                    \
    T_EXP("blk.%d.ffn_up_exps.weight",   up_exps,   0, NE(EMBD, FF_EXP, EXPERT)),                    \
    T_EXP("blk.%d.ffn_down_exps.weight", down_exps, 0, NE(FF_EXP, EMBD, EXPERT))
#define EXPERT_RESIDUALS                                                                            \
    T_EXP("blk.%d.ffn_gate_exps.residual", gate_res, 1, NE(EMBD, FF_EXP, EXPERT)),                   \
    T_EXP("blk.%d.ffn_up_exps.residual",   up_res,   1, NE(EMBD, FF_EXP, EXPERT)),                   \
    T_EXP("blk.%d.ffn_down_exps.residual", down_res, 1, NE(FF_EXP, EMBD, EXPERT))
#define SHARED_EXPERT                                                                               \
    T("blk.%d.ffn_gate_shexp.weight", gate_shexp, REQ, RM_LAYER_SHEXP, 0, NE(EMBD, FF_SHEXP, ONE)),  \
    T("blk.%d.ffn_up_shexp.weight",   up_shexp,   REQ, RM_LAYER_SHEXP, 0, NE(EMBD, FF_SHEXP, ONE)),  \
    T("blk.%d.ffn_down_shexp.weight", down_shexp, REQ, RM_LAYER_SHEXP, 0, NE(FF_SHEXP, EMBD, ONE))

/* The layers of today's rows: attention with optional biases and q/k norms, routed experts with
 * their residuals, an optional gated shared expert. In the order the loader binds them. */
static const rm_tensor_row MOE_LAYER[] = {
    PLAIN_ATTENTION,
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, RM_LAYER_QK_NORM_HEAD, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, RM_LAYER_QK_NORM_HEAD, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, RM_LAYER_QK_NORM_FULL, 1, NE(Q, ONE, ONE)),
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, RM_LAYER_QK_NORM_FULL, 1, NE(KV, ONE, ONE)),
    T("blk.%d.ffn_norm.weight",    ffn_norm,  REQ, 0,        1, NE(EMBD, ONE, ONE)),
    T("blk.%d.ffn_gate_inp.weight", router,   REQ, RM_LAYER_FFN_MOE, 0, NE(EMBD, EXPERT, ONE)),
    ROUTED_EXPERTS,
    SHARED_EXPERT,
    T("blk.%d.ffn_gate_inp_shexp.weight", gate_inp_shexp, REQ, RM_LAYER_SHEXP, 1, NE(EMBD, ONE, ONE)),
    EXPERT_RESIDUALS,
};

/* The FFN side of DeepSeek and GLM layers: routed experts with a selection bias and ungated
 * shared experts, or (leading layers) one dense FFN. */
#define DEEPSEEK_FFN(ffn_norm_name)                                                                    \
    T(ffn_norm_name,                  ffn_norm,  REQ, 0, 1, NE(EMBD, ONE, ONE)),                        \
    T("blk.%d.ffn_gate_inp.weight",   router,    REQ, RM_LAYER_FFN_MOE, 0, NE(EMBD, EXPERT, ONE)),      \
    T("blk.%d.exp_probs_b.bias",      exp_probs_b, RM_TENSOR_OPTIONAL, RM_LAYER_FFN_MOE, 1, NE(EXPERT, ONE, ONE)), \
    ROUTED_EXPERTS,                                                                                   \
    SHARED_EXPERT,                                                                                    \
    T("blk.%d.ffn_gate.weight",       ffn_gate,  REQ, RM_LAYER_FFN_DENSE, 0, NE(EMBD, FF, ONE)),          \
    T("blk.%d.ffn_up.weight",         ffn_up,    REQ, RM_LAYER_FFN_DENSE, 0, NE(EMBD, FF, ONE)),          \
    T("blk.%d.ffn_down.weight",       ffn_down,  REQ, RM_LAYER_FFN_DENSE, 0, NE(FF, EMBD, ONE)),          \
    EXPERT_RESIDUALS

/* GLM-4.5: plain attention with q/k/v biases and optional per-head q/k norms; llama.cpp names the
 * FFN's input norm post_attention_norm. */
static const rm_tensor_row GLM4MOE_LAYER[] = {
    PLAIN_ATTENTION,
    T_PAIRED("blk.%d.attn_q_norm.weight", q_norm, RM_GROUP_QK_NORM, RM_LAYER_QK_NORM_HEAD, NE(HEAD, ONE, ONE)),
    T_PAIRED("blk.%d.attn_k_norm.weight", k_norm, RM_GROUP_QK_NORM, RM_LAYER_QK_NORM_HEAD, NE(HEAD, ONE, ONE)),
    DEEPSEEK_FFN("blk.%d.post_attention_norm.weight"),
};

#define MLA RM_LAYER_ATTN_MLA

/* Multi-head latent attention (mla.c): the q low rank's rows, then the latent's and the output's. */
#define MLA_Q_LORA_ROWS                                                                                  \
    T("blk.%d.attn_norm.weight",      attn_norm, REQ, 0, 1, NE(EMBD, ONE, ONE)),                           \
    T("blk.%d.attn_q_a.weight",       wq_a,      REQ, MLA | RM_LAYER_MLA_Q_LORA, 0, NE(EMBD, Q_LORA, ONE)), \
    T("blk.%d.attn_q_a_norm.weight",  q_a_norm,  REQ, MLA | RM_LAYER_MLA_Q_LORA, 1, NE(Q_LORA, ONE, ONE)), \
    T("blk.%d.attn_q_b.weight",       wq_b,      REQ, MLA | RM_LAYER_MLA_Q_LORA, 0, NE(Q_LORA, Q, ONE))
#define MLA_KV_ROWS                                                                                      \
    T("blk.%d.attn_kv_a_mqa.weight",  wkv_a,     REQ, MLA, 0, NE(EMBD, KV_A, ONE)),                        \
    T("blk.%d.attn_kv_a_norm.weight", kv_a_norm, REQ, MLA, 1, NE(KV_LORA, ONE, ONE)),                      \
    T("blk.%d.attn_k_b.weight",       wk_b,      REQ, MLA, 0, NE(NOPE, KV_LORA, HEADS)),                   \
    T("blk.%d.attn_v_b.weight",       wv_b,      REQ, MLA, 0, NE(KV_LORA, HEAD_V, HEADS)),                 \
    T("blk.%d.attn_output.weight",    wo,        REQ, MLA, 0, NE(V, EMBD, ONE))

/* DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash: the query through the low rank or one projection. */
static const rm_tensor_row DEEPSEEK2_LAYER[] = {
    MLA_Q_LORA_ROWS,
    T("blk.%d.attn_q.weight",         wq,        REQ, MLA | RM_LAYER_MLA_Q_DIRECT, 0, NE(EMBD, Q, ONE)),
    MLA_KV_ROWS,
    DEEPSEEK_FFN("blk.%d.ffn_norm.weight"),
};

/* GLM-5, DeepSeek-V3.2: DeepSeek's MLA layers (the q low rank always), and in the layers that run
 * their own indexer its four products and its key's LayerNorm (llama.cpp's names). */
#define IDX RM_LAYER_DSA_INDEX
static const rm_tensor_row DSA_LAYER[] = {
    MLA_Q_LORA_ROWS,
    MLA_KV_ROWS,
    T("blk.%d.indexer.attn_q_b.weight", idx_wq_b,     REQ, MLA | IDX, 0, NE(Q_LORA, IDX_Q, ONE)),
    T("blk.%d.indexer.attn_k.weight",   idx_wk,       REQ, MLA | IDX, 0, NE(EMBD, IDX_HEAD, ONE)),
    T("blk.%d.indexer.k_norm.weight",   idx_k_norm,   REQ, MLA | IDX, 1, NE(IDX_HEAD, ONE, ONE)),
    T("blk.%d.indexer.k_norm.bias",     idx_k_norm_b, REQ, MLA | IDX, 1, NE(IDX_HEAD, ONE, ONE)),
    T("blk.%d.indexer.proj.weight",     idx_proj,     REQ, MLA | IDX, 0, NE(EMBD, IDX_HEADS, ONE)),
    DEEPSEEK_FFN("blk.%d.ffn_norm.weight"),
};
#undef IDX

/* DeepSeek-V4: two mHCs per layer, the q low rank, one key-value head, sinks, the grouped output;
 * the compressor in the CSA and HCA layers (of their shapes), the indexer in the CSA ones; the
 * router with a selection bias, or in the hash layers a table of experts per token id. */
#define MHC RM_LAYER_MHC
#define MHC_ROWS(kind)                                                                                  \
    T("blk.%d.hc_" #kind "_fn.weight",    mhc_##kind.fn,    REQ, MHC, 0, NE(HC_EMBD, HC_MIX, ONE)),    \
    T("blk.%d.hc_" #kind "_base.weight",  mhc_##kind.base,  REQ, MHC, 1, NE(HC_MIX, ONE, ONE)),        \
    T("blk.%d.hc_" #kind "_scale.weight", mhc_##kind.scale, REQ, MHC, 1, NE(HC_SCALES, ONE, ONE))
#define CSA (MHC | RM_LAYER_CSA)
#define HCA (MHC | RM_LAYER_HCA)
static const rm_tensor_row DEEPSEEK4_LAYER[] = {
    T("blk.%d.attn_norm.weight",      attn_norm, REQ, MHC, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.attn_sinks.weight",     sinks,     REQ, MHC, 1, NE(HEADS, ONE, ONE)),
    T("blk.%d.attn_q_a.weight",       wq_a,      REQ, MHC, 0, NE(EMBD, Q_LORA, ONE)),
    T("blk.%d.attn_q_a_norm.weight",  q_a_norm,  REQ, MHC, 1, NE(Q_LORA, ONE, ONE)),
    T("blk.%d.attn_q_b.weight",       wq_b,      REQ, MHC, 0, NE(Q_LORA, Q, ONE)),
    T("blk.%d.attn_kv.weight",        wkv,       REQ, MHC, 0, NE(EMBD, HEAD, ONE)),
    T("blk.%d.attn_kv_a_norm.weight", kv_norm,   REQ, MHC, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_output_a.weight",  wo_a,      REQ, MHC, 0, NE(O_IN, O_MID, ONE)),
    T("blk.%d.attn_output_b.weight",  wo_b,      REQ, MHC, 0, NE(O_MID, EMBD, ONE)),
    MHC_ROWS(attn),
    MHC_ROWS(ffn),
    T("blk.%d.attn_compressor_kv.weight",   comp_wkv,   REQ, CSA, 0, NE(EMBD, HEAD2, ONE)),
    T("blk.%d.attn_compressor_gate.weight", comp_wgate, REQ, CSA, 0, NE(EMBD, HEAD2, ONE)),
    T("blk.%d.attn_compressor_ape.weight",  comp_ape,   REQ, CSA, 1, NE(HEAD2, RATIO_CSA, ONE)),
    T("blk.%d.attn_compressor_norm.weight", comp_norm,  REQ, CSA, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_compressor_kv.weight",   comp_wkv,   REQ, HCA, 0, NE(EMBD, HEAD, ONE)),
    T("blk.%d.attn_compressor_gate.weight", comp_wgate, REQ, HCA, 0, NE(EMBD, HEAD, ONE)),
    T("blk.%d.attn_compressor_ape.weight",  comp_ape,   REQ, HCA, 1, NE(HEAD, RATIO_HCA, ONE)),
    T("blk.%d.attn_compressor_norm.weight", comp_norm,  REQ, HCA, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.indexer.proj.weight",         idx_proj,   REQ, CSA, 0, NE(EMBD, IDX_HEADS, ONE)),
    T("blk.%d.indexer.attn_q_b.weight",     idx_wq_b,   REQ, CSA, 0, NE(Q_LORA, IDX_Q, ONE)),
    T("blk.%d.indexer_compressor_kv.weight",   idx_comp_wkv,   REQ, CSA, 0, NE(EMBD, IDX_HEAD2, ONE)),
    T("blk.%d.indexer_compressor_gate.weight", idx_comp_wgate, REQ, CSA, 0, NE(EMBD, IDX_HEAD2, ONE)),
    T("blk.%d.indexer_compressor_ape.weight",  idx_comp_ape,   REQ, CSA, 1, NE(IDX_HEAD2, RATIO_CSA, ONE)),
    T("blk.%d.indexer_compressor_norm.weight", idx_comp_norm,  REQ, CSA, 1, NE(IDX_HEAD, ONE, ONE)),
    T("blk.%d.ffn_norm.weight",       ffn_norm,  REQ, 0, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.ffn_gate_inp.weight",   router,    REQ, RM_LAYER_FFN_MOE, 0, NE(EMBD, EXPERT, ONE)),
    T("blk.%d.exp_probs_b.bias",      exp_probs_b, RM_TENSOR_OPTIONAL, RM_LAYER_FFN_MOE, 1, NE(EXPERT, ONE, ONE)),
    T("blk.%d.ffn_gate_tid2eid.weight", hash_experts, REQ, RM_LAYER_HASH_ROUTE, 0, NE(EXPERT_USED, VOCAB, ONE)),
    ROUTED_EXPERTS,
    SHARED_EXPERT,
    EXPERT_RESIDUALS,
};
#undef CSA
#undef HCA

#define HPOFF_RULE(f) ((uint16_t) offsetof(rm_hparams, f))

/* The first leading_dense_block_count layers have a dense FFN and no experts. */
static const rm_kind_rule GLM4MOE_RULES[] = {
    {RM_RULE_FIRST_N, HPOFF_RULE(n_layer_dense_lead), RM_LAYER_FFN_MOE | RM_LAYER_SHEXP, RM_LAYER_FFN_DENSE},
};
static const rm_kind_rule DEEPSEEK2_RULES[] = {
    {RM_RULE_FIRST_N, HPOFF_RULE(n_layer_dense_lead), RM_LAYER_FFN_MOE | RM_LAYER_SHEXP, RM_LAYER_FFN_DENSE},
    {RM_RULE_ALL_IF_SET, HPOFF_RULE(q_lora_rank), RM_LAYER_MLA_Q_DIRECT, RM_LAYER_MLA_Q_LORA},
};

/* GLM-5, DeepSeek-V3.2: the leading dense layers, and the layers an indexer list marks 0 (GLM-5.2's)
 * take the previous indexed layer's positions */
static const rm_kind_rule DSA_RULES[] = {
    {RM_RULE_FIRST_N, HPOFF_RULE(n_layer_dense_lead), RM_LAYER_FFN_MOE | RM_LAYER_SHEXP, RM_LAYER_FFN_DENSE},
    {RM_RULE_NOT_INDEXED, 0, RM_LAYER_DSA_INDEX, RM_LAYER_DSA_SHARED},
};

/* MiniMax-M2: q/k RMSNorm over the whole projection, routed experts with a selection bias. */
static const rm_tensor_row MINIMAX_M2_LAYER[] = {
    PLAIN_ATTENTION,
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, RM_LAYER_QK_NORM_FULL, 1, NE(Q, ONE, ONE)),
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, RM_LAYER_QK_NORM_FULL, 1, NE(KV, ONE, ONE)),
    T("blk.%d.ffn_norm.weight",    ffn_norm,  REQ, 0,        1, NE(EMBD, ONE, ONE)),
    T("blk.%d.ffn_gate_inp.weight", router,   REQ, RM_LAYER_FFN_MOE, 0, NE(EMBD, EXPERT, ONE)),
    T("blk.%d.exp_probs_b.bias",   exp_probs_b, REQ, RM_LAYER_FFN_MOE, 1, NE(EXPERT, ONE, ONE)),
    ROUTED_EXPERTS,
    EXPERT_RESIDUALS,
};

/* gpt-oss: biased q/k/v/o projections, per-head sinks, the norm before the experts named
 * post_attention_norm, a biased router and experts with a bias on each of their three products. */
#define T_F32(name, f, when, ne) {name, #f, LOFF(f), 0, REQ, 0, when, 1, 0, ne, RM_GROUP_NONE}
static const rm_tensor_row GPT_OSS_LAYER[] = {
    PLAIN_ATTENTION,
    T_BIAS("blk.%d.attn_output.bias", bo,                        NE(EMBD, ONE, ONE), RM_GROUP_NONE),
    T_F32("blk.%d.attn_sinks.weight", sinks, RM_LAYER_SINKS,     NE(HEADS, ONE, ONE)),
    T("blk.%d.post_attention_norm.weight", ffn_norm, REQ, 0, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.ffn_gate_inp.weight", router,   REQ, RM_LAYER_FFN_MOE, 0, NE(EMBD, EXPERT, ONE)),
    T_F32("blk.%d.ffn_gate_inp.bias", router_b, RM_LAYER_EXP_BIAS, NE(EXPERT, ONE, ONE)),
    ROUTED_EXPERTS,
    T_F32("blk.%d.ffn_gate_exps.bias", gate_exps_b, RM_LAYER_EXP_BIAS, NE(FF_EXP, EXPERT, ONE)),
    T_F32("blk.%d.ffn_up_exps.bias",   up_exps_b,   RM_LAYER_EXP_BIAS, NE(FF_EXP, EXPERT, ONE)),
    T_F32("blk.%d.ffn_down_exps.bias", down_exps_b, RM_LAYER_EXP_BIAS, NE(EMBD, EXPERT, ONE)),
    EXPERT_RESIDUALS,
};

#define LIN RM_LAYER_ATTN_LINEAR

/* The hybrid's rows that qwen4exp shares: gated full attention and the Gated DeltaNet's input
 * projections; the DeltaNet's convolution, decay, norm and output; the routed and gated shared
 * experts. */
#define HYBRID_ATTN_ROWS                                                                            \
    T("blk.%d.attn_q.weight",      wq,        REQ, RM_LAYER_ATTN_FULL, 0, NE(EMBD, Q_GATE, ONE)),   \
    T("blk.%d.attn_k.weight",      wk,        REQ, RM_LAYER_ATTN_FULL, 0, NE(EMBD, KV, ONE)),       \
    T("blk.%d.attn_v.weight",      wv,        REQ, RM_LAYER_ATTN_FULL, 0, NE(EMBD, KV, ONE)),       \
    T("blk.%d.attn_output.weight", wo,        REQ, RM_LAYER_ATTN_FULL, 0, NE(Q, EMBD, ONE)),        \
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, RM_LAYER_ATTN_FULL | RM_LAYER_QK_NORM_HEAD, 1, NE(HEAD, ONE, ONE)),\
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, RM_LAYER_ATTN_FULL | RM_LAYER_QK_NORM_HEAD, 1, NE(HEAD, ONE, ONE)),\
    T("blk.%d.attn_qkv.weight",    wqkv,      REQ, LIN, 0, NE(EMBD, SSM_CONV, ONE)),                \
    T("blk.%d.attn_gate.weight",   wz,        REQ, LIN, 0, NE(EMBD, SSM_INNER, ONE))
#define HYBRID_SSM_ROWS                                                                             \
    T("blk.%d.ssm_conv1d.weight",  ssm_conv1d, REQ, LIN, 0, NE(SSM_KERNEL, SSM_CONV, ONE)),         \
    T("blk.%d.ssm_dt.bias",        ssm_dt,    REQ, LIN, 1, NE(SSM_NV, ONE, ONE)),                   \
    T("blk.%d.ssm_a",              ssm_a,     REQ, LIN, 1, NE(SSM_NV, ONE, ONE)),                   \
    T("blk.%d.ssm_norm.weight",    ssm_norm,  REQ, LIN, 1, NE(SSM_HEAD_V, ONE, ONE)),               \
    T("blk.%d.ssm_out.weight",     ssm_out,   REQ, LIN, 0, NE(SSM_INNER, EMBD, ONE))
#define HYBRID_MOE_ROWS                                                                             \
    T("blk.%d.ffn_gate_inp.weight", router,   REQ, RM_LAYER_FFN_MOE, 0, NE(EMBD, EXPERT, ONE)),     \
    ROUTED_EXPERTS,                                                                                 \
    SHARED_EXPERT,                                                                                  \
    T("blk.%d.ffn_gate_inp_shexp.weight", gate_inp_shexp, REQ, RM_LAYER_SHEXP, 1, NE(EMBD, ONE, ONE)),\
    EXPERT_RESIDUALS

/* The Qwen3.5/Qwen3-Next hybrid: gated full attention (q and its gate in one projection, per-head
 * q/k norm) on every n-th layer, Gated DeltaNet on the others; the FFN norm is llama.cpp's
 * post_attention_norm; routed experts and a gated shared expert in every layer. */
static const rm_tensor_row HYBRID_LAYER[] = {
    T("blk.%d.attn_norm.weight",   attn_norm, REQ, 0,        1, NE(EMBD, ONE, ONE)),
    HYBRID_ATTN_ROWS,
    T("blk.%d.ssm_ba.weight",      ssm_ba,    REQ, LIN | RM_LAYER_SSM_BA, 0, NE(EMBD, SSM_BA, ONE)),
    T("blk.%d.ssm_beta.weight",    ssm_beta,  REQ, LIN | RM_LAYER_SSM_V_TILED, 0, NE(EMBD, SSM_NV, ONE)),
    T("blk.%d.ssm_alpha.weight",   ssm_alpha, REQ, LIN | RM_LAYER_SSM_V_TILED, 0, NE(EMBD, SSM_NV, ONE)),
    HYBRID_SSM_ROWS,
    T("blk.%d.post_attention_norm.weight", ffn_norm, REQ, 0, 1, NE(EMBD, ONE, ONE)),
    HYBRID_MOE_ROWS,
};

/* qwen4exp: the Qwen3.5 hybrid's layers (beta and alpha apart, value heads tiled) without norms: two
 * hyper-connections per layer take their place, before the token mixer and before the FFN. */
#define HC_ROWS(kind)                                                                                 \
    T("blk.%d.hc_" #kind "_norm.weight",   hc_##kind.norm,   REQ, 0, 1, NE(HC_EMBD, ONE, ONE)),      \
    T("blk.%d.hc_" #kind "_down.weight",   hc_##kind.down,   REQ, 0, 0, NE(HC_EMBD, HC_RANK, ONE)),  \
    T("blk.%d.hc_" #kind "_up.weight",     hc_##kind.up,     REQ, 0, 0, NE(HC_RANK, HC_EMBD, ONE)),  \
    T("blk.%d.hc_" #kind "_inject.weight", hc_##kind.inject, REQ, 0, 0, NE(HC_EMBD, HC, ONE))
#define QSA (RM_LAYER_ATTN_FULL | RM_LAYER_QSA_INDEX)
static const rm_tensor_row QWEN4EXP_LAYER[] = {
    HC_ROWS(attn),
    HYBRID_ATTN_ROWS,
    T("blk.%d.indexer.q_proj.weight", qsa_wq,     REQ, QSA, 0, NE(EMBD, IDX_Q, ONE)),
    T("blk.%d.indexer.k_proj.weight", qsa_wk,     REQ, QSA, 0, NE(EMBD, IDX_HEAD, ONE)),
    T("blk.%d.indexer.q_norm.weight", qsa_q_norm, REQ, QSA, 1, NE(IDX_HEAD, ONE, ONE)),
    T("blk.%d.indexer.k_norm.weight", qsa_k_norm, REQ, QSA, 1, NE(IDX_HEAD, ONE, ONE)),
    T("blk.%d.ssm_beta.weight",    ssm_beta,  REQ, LIN, 0, NE(EMBD, SSM_NV, ONE)),
    T("blk.%d.ssm_alpha.weight",   ssm_alpha, REQ, LIN, 0, NE(EMBD, SSM_NV, ONE)),
    HYBRID_SSM_ROWS,
    /* PLE (llama.cpp's names); the n-gram table itself, per_layer_token_embd, is the model's (model.c) */
    T("blk.%d.ple_key.weight",        ple_key,        REQ, RM_LAYER_PLE, 0, NE(PLE_EMBD, HC_EMBD, ONE)),
    T("blk.%d.ple_value.weight",      ple_value,      REQ, RM_LAYER_PLE, 0, NE(PLE_EMBD, EMBD, ONE)),
    T("blk.%d.ple_norm_key.weight",   ple_norm_key,   REQ, RM_LAYER_PLE, 1, NE(HC_EMBD, ONE, ONE)),
    T("blk.%d.ple_norm_query.weight", ple_norm_query, REQ, RM_LAYER_PLE, 1, NE(HC_EMBD, ONE, ONE)),
    T("blk.%d.ple_norm_conv.weight",  ple_norm_conv,  REQ, RM_LAYER_PLE, 1, NE(HC_EMBD, ONE, ONE)),
    T("blk.%d.ple_conv1d.weight",     ple_conv1d,     REQ, RM_LAYER_PLE, 1, NE(PLE_KERNEL, HC_EMBD, ONE)),
    HC_ROWS(ffn),
    HYBRID_MOE_ROWS,
};
#undef QSA

/* Gemma 4: per-head q/k norms (q's and k's of each layer's head width), values normed without a
 * weight and, where attn_v is absent, taken from the key projection; sandwich norms around attention
 * and FFN; a GELU FFN beside the routed experts, each with its own norms; the router's input norm;
 * a scale per expert and per layer; the experts' gate and up rows fused (llama.cpp) or apart (ours). */
#define SWA RM_LAYER_ATTN_SLIDING
#define FULL RM_LAYER_ATTN_FULL
#define OPT RM_TENSOR_OPTIONAL
static const rm_tensor_row GEMMA4_LAYER[] = {
    T("blk.%d.attn_norm.weight",   attn_norm, REQ, 0,    1, NE(EMBD, ONE, ONE)),
    T("blk.%d.attn_q.weight",      wq,        REQ, FULL, 0, NE(EMBD, Q, ONE)),
    T("blk.%d.attn_k.weight",      wk,        REQ, FULL, 0, NE(EMBD, KV, ONE)),
    T("blk.%d.attn_v.weight",      wv,        OPT, FULL, 0, NE(EMBD, KV, ONE)),
    T("blk.%d.attn_output.weight", wo,        REQ, FULL, 0, NE(Q, EMBD, ONE)),
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, FULL, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, FULL, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_q.weight",      wq,        REQ, SWA,  0, NE(EMBD, Q_SWA, ONE)),
    T("blk.%d.attn_k.weight",      wk,        REQ, SWA,  0, NE(EMBD, KV_SWA, ONE)),
    T("blk.%d.attn_v.weight",      wv,        OPT, SWA,  0, NE(EMBD, KV_SWA, ONE)),
    T("blk.%d.attn_output.weight", wo,        REQ, SWA,  0, NE(Q_SWA, EMBD, ONE)),
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, SWA,  1, NE(HEAD_SWA, ONE, ONE)),
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, SWA,  1, NE(HEAD_SWA, ONE, ONE)),
    T("blk.%d.post_attention_norm.weight", attn_post_norm, REQ, 0, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.ffn_norm.weight",    ffn_norm,  REQ, 0,    1, NE(EMBD, ONE, ONE)),
    T("blk.%d.ffn_gate.weight",    ffn_gate,  REQ, RM_LAYER_FFN_DENSE, 0, NE(EMBD, FF, ONE)),
    T("blk.%d.ffn_up.weight",      ffn_up,    REQ, RM_LAYER_FFN_DENSE, 0, NE(EMBD, FF, ONE)),
    T("blk.%d.ffn_down.weight",    ffn_down,  REQ, RM_LAYER_FFN_DENSE, 0, NE(FF, EMBD, ONE)),
    T("blk.%d.post_ffw_norm_1.weight", ffn_post_norm_1, REQ, RM_LAYER_FFN_MOE, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.pre_ffw_norm_2.weight",  ffn_pre_norm_2,  REQ, RM_LAYER_FFN_MOE, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.post_ffw_norm_2.weight", ffn_post_norm_2, REQ, RM_LAYER_FFN_MOE, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.ffn_gate_inp.weight", router,   REQ, RM_LAYER_FFN_MOE, 0, NE(EMBD, EXPERT, ONE)),
    T("blk.%d.ffn_gate_inp.scale",  router_norm, REQ, RM_LAYER_FFN_MOE, 1, NE(EMBD, ONE, ONE)),
    {"blk.%d.ffn_gate_up_exps.weight", "gate_up_exps", LOFF(gate_up_exps), 0, OPT, 0, RM_LAYER_FFN_MOE, 0, 1,
     NE(EMBD, FF_EXP2, EXPERT), RM_GROUP_NONE},
    {"blk.%d.ffn_gate_exps.weight", "gate_exps", LOFF(gate_exps), 0, OPT, 0, RM_LAYER_FFN_MOE, 0, 1,
     NE(EMBD, FF_EXP, EXPERT), RM_GROUP_NONE},
    {"blk.%d.ffn_up_exps.weight", "up_exps", LOFF(up_exps), 0, OPT, 0, RM_LAYER_FFN_MOE, 0, 1,
     NE(EMBD, FF_EXP, EXPERT), RM_GROUP_NONE},
    T_EXP("blk.%d.ffn_down_exps.weight", down_exps, 0, NE(FF_EXP, EMBD, EXPERT)),
    T("blk.%d.ffn_down_exps.scale", down_exps_scale, REQ, RM_LAYER_FFN_MOE, 1, NE(EXPERT, ONE, ONE)),
    T("blk.%d.post_ffw_norm.weight", ffn_post_norm, REQ, 0, 1, NE(EMBD, ONE, ONE)),
    T("blk.%d.layer_output_scale.weight", out_scale, OPT, 0, 1, NE(ONE, ONE, ONE)),
    EXPERT_RESIDUALS,
};
#undef OPT

/* MiMo-V2-Flash: plain attention whose values are narrower than the keys (and sliding layers with
 * more kv heads), sinks where the file has them (the sliding layers'), the FFN of DeepSeek's layers
 * without shared experts. */
#define OPT RM_TENSOR_OPTIONAL
static const rm_tensor_row MIMO2_LAYER[] = {
    T("blk.%d.attn_norm.weight",   attn_norm, REQ, 0,    1, NE(EMBD, ONE, ONE)),
    T("blk.%d.attn_q.weight",      wq,        REQ, FULL, 0, NE(EMBD, Q, ONE)),
    T("blk.%d.attn_k.weight",      wk,        REQ, FULL, 0, NE(EMBD, KV, ONE)),
    T("blk.%d.attn_v.weight",      wv,        REQ, FULL, 0, NE(EMBD, KV_V, ONE)),
    T("blk.%d.attn_output.weight", wo,        REQ, FULL, 0, NE(V, EMBD, ONE)),
    T("blk.%d.attn_q.weight",      wq,        REQ, SWA,  0, NE(EMBD, Q, ONE)),
    T("blk.%d.attn_k.weight",      wk,        REQ, SWA,  0, NE(EMBD, KV_SWA, ONE)),
    T("blk.%d.attn_v.weight",      wv,        REQ, SWA,  0, NE(EMBD, KV_V_SWA, ONE)),
    T("blk.%d.attn_output.weight", wo,        REQ, SWA,  0, NE(V, EMBD, ONE)),
    T("blk.%d.attn_sinks.weight",  sinks,     OPT, 0,    1, NE(HEADS, ONE, ONE)),
    DEEPSEEK_FFN("blk.%d.ffn_norm.weight"),   /* no layer of MiMo's has RM_LAYER_SHEXP: no shared expert */
};
#undef OPT

/* Step-3.5: per-head q/k norms and a sigmoid gate per query head, each layer kind with its own
 * query heads; DeepSeek's FFN rows (routed experts with a selection bias, an ungated shared expert,
 * the leading dense layers' FFN). */
#define HGATE RM_LAYER_HEAD_GATE
static const rm_tensor_row STEP35_LAYER[] = {
    T("blk.%d.attn_norm.weight",   attn_norm, REQ, 0,    1, NE(EMBD, ONE, ONE)),
    T("blk.%d.attn_q.weight",      wq,        REQ, FULL, 0, NE(EMBD, Q, ONE)),
    T("blk.%d.attn_k.weight",      wk,        REQ, FULL, 0, NE(EMBD, KV, ONE)),
    T("blk.%d.attn_v.weight",      wv,        REQ, FULL, 0, NE(EMBD, KV, ONE)),
    T("blk.%d.attn_output.weight", wo,        REQ, FULL, 0, NE(Q, EMBD, ONE)),
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, FULL, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, FULL, 1, NE(HEAD, ONE, ONE)),
    T("blk.%d.attn_gate.weight",   attn_gate, REQ, FULL | HGATE, 0, NE(EMBD, HEADS, ONE)),
    T("blk.%d.attn_q.weight",      wq,        REQ, SWA,  0, NE(EMBD, Q_SWA, ONE)),
    T("blk.%d.attn_k.weight",      wk,        REQ, SWA,  0, NE(EMBD, KV_SWA, ONE)),
    T("blk.%d.attn_v.weight",      wv,        REQ, SWA,  0, NE(EMBD, KV_SWA, ONE)),
    T("blk.%d.attn_output.weight", wo,        REQ, SWA,  0, NE(Q_SWA, EMBD, ONE)),
    T("blk.%d.attn_q_norm.weight", q_norm,    REQ, SWA,  1, NE(HEAD_SWA, ONE, ONE)),
    T("blk.%d.attn_k_norm.weight", k_norm,    REQ, SWA,  1, NE(HEAD_SWA, ONE, ONE)),
    T("blk.%d.attn_gate.weight",   attn_gate, REQ, SWA | HGATE, 0, NE(EMBD, HEADS_SWA, ONE)),
    DEEPSEEK_FFN("blk.%d.ffn_norm.weight"),
};
#undef HGATE
/* Step-3.5: the leading dense layers, and the layers its list marks slide */
static const rm_kind_rule STEP35_RULES[] = {
    {RM_RULE_FIRST_N, HPOFF_RULE(n_layer_dense_lead), RM_LAYER_FFN_MOE | RM_LAYER_SHEXP, RM_LAYER_FFN_DENSE},
    {RM_RULE_LISTED, 0, RM_LAYER_ATTN_FULL, RM_LAYER_ATTN_SLIDING},
};
/* The SwiGLU's limits per layer: the routed experts' and the shared expert's and dense FFN's */
static const rm_layer_float_row STEP35_FLOATS[] = {
    {"swiglu_clamp_exp", "ffn_limit", LOFF(ffn_limit)},
    {"swiglu_clamp_shexp", "ffn_limit_sh", LOFF(ffn_limit_sh)},
};
/* qwen4exp: the positions of each indexed layer's key blocks (0 in the linear layers) */
static const rm_layer_float_row QWEN4EXP_FLOATS[] = {
    {"attention.compress_ratios", "qsa_ratio", LOFF(qsa_ratio)},
};
/* MiMo: the leading dense layers, and the layers its list marks slide */
static const rm_kind_rule MIMO2_RULES[] = {
    {RM_RULE_FIRST_N, HPOFF_RULE(n_layer_dense_lead), RM_LAYER_FFN_MOE, RM_LAYER_FFN_DENSE},
    {RM_RULE_LISTED, 0, RM_LAYER_ATTN_FULL, RM_LAYER_ATTN_SLIDING},
};

/* Gemma 4: the layers its list marks slide, with the sliding shape */
static const rm_kind_rule GEMMA4_RULES[] = {
    {RM_RULE_LISTED, 0, RM_LAYER_ATTN_FULL, RM_LAYER_ATTN_SLIDING},
};

/* gpt-oss: all but every swa_pattern-th layer slide (layers 0, 2, 4, ... with the pattern 2) */
static const rm_kind_rule GPT_OSS_RULES[] = {
    {RM_RULE_NOT_EVERY_N, HPOFF_RULE(swa_pattern), RM_LAYER_ATTN_FULL, RM_LAYER_ATTN_SLIDING},
};

/* all but every full_attention_interval-th layer: Gated DeltaNet instead of gated attention */
static const rm_kind_rule HYBRID_RULES[] = {
    {RM_RULE_NOT_EVERY_N, HPOFF(full_attn_interval), RM_LAYER_ATTN_FULL | RM_LAYER_ATTN_GATE, RM_LAYER_ATTN_LINEAR},
};

/* qwen4exp: Gated DeltaNet layers, every full_attention_interval-th one gated attention over the key
 * blocks its QSA indexer picks */
static const rm_kind_rule QWEN4EXP_RULES[] = {
    {RM_RULE_EVERY_N, HPOFF(full_attn_interval), RM_LAYER_ATTN_LINEAR,
     RM_LAYER_ATTN_FULL | RM_LAYER_ATTN_GATE | RM_LAYER_QSA_INDEX},
    {RM_RULE_PLE, 0, 0, RM_LAYER_PLE},   /* and PLE before the token mixer of the layers ple.layers lists */
};

/* DeepSeek-V4: every layer with mHCs, the compressed layers by their ratio, the hash-routed first layers */
static const rm_kind_rule DEEPSEEK4_RULES[] = {
    {RM_RULE_ALL_IF_SET, HPOFF(hc_count), 0, RM_LAYER_MHC},
    {RM_RULE_RATIO, 4, 0, RM_LAYER_CSA},
    {RM_RULE_RATIO, 128, 0, RM_LAYER_HCA},
    {RM_RULE_FIRST_N, HPOFF(n_layer_hash), 0, RM_LAYER_HASH_ROUTE},
};

/* ---- the table ------------------------------------------------------------------------------ */

#define ROWS(x) x, COUNT(x)
#define FULL_MOE (RM_LAYER_ATTN_FULL | RM_LAYER_FFN_MOE)

static const rm_arch ARCHS[] = {
    /* Mixtral: softmax top-k, renormalised; interleaved RoPE (q/k permuted by the converter). */
    {"llama", "Mixtral", RM_QK_NORM_NONE, RM_ROPE_NORM, RM_SHEXP_NONE, FULL_MOE,
     ROWS(HP_LLAMA), ROWS(MOE_LAYER), NULL, 0, NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* Qwen1.5/Qwen2-MoE: no renormalisation; a shared expert behind a sigmoid gate. */
    {"qwen2moe", "", RM_QK_NORM_NONE, RM_ROPE_NEOX, RM_SHEXP_GATED, FULL_MOE,
     ROWS(HP_QWEN2MOE), ROWS(MOE_LAYER), NULL, 0, NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* Qwen3-MoE: per-head q/k RMSNorm; llama.cpp always renormalises. */
    {"qwen3moe", "", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_NONE, FULL_MOE,
     ROWS(HP_QWEN3MOE), ROWS(MOE_LAYER), NULL, 0, NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* OLMoE: q/k RMSNorm over the full projection width. */
    {"olmoe", "", RM_QK_NORM_FULL, RM_ROPE_NEOX, RM_SHEXP_NONE, FULL_MOE,
     ROWS(HP_OLMOE), ROWS(MOE_LAYER), NULL, 0, NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* Qwen3.5-MoE: Gated DeltaNet and gated attention; partial RoPE (llama.cpp's multi-section
     * RoPE, which for text positions is NEOX over rope.dimension_count); value heads tiled over
     * the key heads by llama.cpp's converter. */
    {"qwen35moe", "", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_GATED,
     FULL_MOE | RM_LAYER_ATTN_GATE | RM_LAYER_SSM_V_TILED,
     ROWS(HP_QWEN_HYBRID), ROWS(HYBRID_LAYER), ROWS(HYBRID_RULES), "attention.recurrent_layers", NULL, 0, NULL, 0, NULL, NULL},
    /* Qwen3-Next: as Qwen3.5-MoE, with beta and alpha fused per key head and value heads grouped. */
    {"qwen3next", "", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_GATED,
     FULL_MOE | RM_LAYER_ATTN_GATE | RM_LAYER_SSM_BA,
     ROWS(HP_QWEN_HYBRID), ROWS(HYBRID_LAYER), ROWS(HYBRID_RULES), "attention.recurrent_layers", NULL, 0, NULL, 0, NULL, NULL},
    /* qwen4exp (Qwen3.8-Flash-Next): Qwen3.5-MoE's layers with hyper-connections in place of every norm,
     * QSA sparse attention on the full layers. */
    {"qwen4exp", "Qwen3.8-Flash-Next", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_GATED,
     RM_LAYER_ATTN_LINEAR | RM_LAYER_FFN_MOE | RM_LAYER_SSM_V_TILED,
     ROWS(HP_QWEN4EXP), ROWS(QWEN4EXP_LAYER), ROWS(QWEN4EXP_RULES), "attention.recurrent_layers", NULL, RM_ARCH_HYPER,
     ROWS(QWEN4EXP_FLOATS), NULL, NULL},
    /* GLM-4.5/4.6 (and Air): partial rotary, q/k/v biases, optional q/k norms, sigmoid routing with
     * a selection bias, an ungated shared expert, leading dense layers. */
    {"glm4moe", "GLM-4.5", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_PLAIN, FULL_MOE,
     ROWS(HP_GLM4MOE), ROWS(GLM4MOE_LAYER), ROWS(GLM4MOE_RULES), NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* DeepSeek-V2/V3/R1, Kimi-K2, GLM-4.7-Flash: MLA with interleaved RoPE on the rotary part,
     * softmax (V2) or sigmoid (V3) routing, ungated shared experts, leading dense layers. */
    {"deepseek2", "DeepSeek-V2/V3", RM_QK_NORM_NONE, RM_ROPE_NORM, RM_SHEXP_PLAIN,
     RM_LAYER_ATTN_MLA | RM_LAYER_MLA_Q_DIRECT | RM_LAYER_FFN_MOE,
     ROWS(HP_DEEPSEEK2), ROWS(DEEPSEEK2_LAYER), ROWS(DEEPSEEK2_RULES), NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* GLM-5: DeepSeek-V3's MLA and routing (sigmoid), each token attending to the top_k positions a
     * lightning indexer picks (every layer its own, or GLM-5.2's layers sharing the last one's). */
    {"glm-dsa", "GLM-5", RM_QK_NORM_NONE, RM_ROPE_NORM, RM_SHEXP_PLAIN,
     RM_LAYER_ATTN_MLA | RM_LAYER_MLA_Q_LORA | RM_LAYER_FFN_MOE | RM_LAYER_DSA_INDEX,
     ROWS(HP_DSA), ROWS(DSA_LAYER), ROWS(DSA_RULES), NULL, NULL, 0, NULL, 0, "attention.indexer.types", NULL},
    /* DeepSeek-V3.2: GLM-5's sparse attention, every layer its own indexer, whose RoPE turns NEOX halves. */
    {"deepseek32", "DeepSeek-V3.2", RM_QK_NORM_NONE, RM_ROPE_NORM, RM_SHEXP_PLAIN,
     RM_LAYER_ATTN_MLA | RM_LAYER_MLA_Q_LORA | RM_LAYER_FFN_MOE | RM_LAYER_DSA_INDEX,
     ROWS(HP_DSA), ROWS(DSA_LAYER), ROWS(DSA_RULES), NULL, NULL, RM_ARCH_DSA_ROPE_NEOX, NULL, 0, NULL, NULL},
    /* gpt-oss: sinks, alternating sliding windows, YaRN, biased experts with a clamped SwiGLU. */
    {"gpt-oss", "", RM_QK_NORM_NONE, RM_ROPE_NEOX, RM_SHEXP_NONE,
     FULL_MOE | RM_LAYER_BIAS | RM_LAYER_SINKS | RM_LAYER_EXP_BIAS | RM_LAYER_SWIGLU_CLAMP,
     ROWS(HP_GPT_OSS), ROWS(GPT_OSS_LAYER), ROWS(GPT_OSS_RULES), NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* MiniMax-M2: partial NEOX RoPE, q/k norms over the whole projection, sigmoid routing with a
     * selection bias, no shared expert. */
    {"minimax-m2", "MiniMax-M2", RM_QK_NORM_FULL, RM_ROPE_NEOX, RM_SHEXP_NONE, FULL_MOE,
     ROWS(HP_MINIMAX_M2), ROWS(MINIMAX_M2_LAYER), NULL, 0, NULL, NULL, 0, NULL, 0, NULL, NULL},
    /* MiMo-V2-Flash: sliding layers with sinks and twice the kv heads, values narrower than the keys
     * and scaled, partial NEOX RoPE with a base per layer kind, sigmoid routing with a selection bias,
     * a leading dense layer. */
    {"mimo2", "MiMo-V2-Flash", RM_QK_NORM_NONE, RM_ROPE_NEOX, RM_SHEXP_NONE, FULL_MOE,
     ROWS(HP_MIMO2), ROWS(MIMO2_LAYER), ROWS(MIMO2_RULES), NULL, "attention.sliding_window_pattern",
     RM_ARCH_DENSE_BY_ROUTER, NULL, 0, NULL, NULL},
    /* Gemma 4 (26B-A4B): sliding and full layers of two shapes, sandwich norms, a GELU FFN beside
     * the experts, proportional RoPE on the full layers (rope_freqs), unscaled attention logits,
     * scaled embeddings, soft-capped logits. */
    {"gemma4", "Gemma 4", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_NONE,
     FULL_MOE | RM_LAYER_FFN_DENSE | RM_LAYER_GELU | RM_LAYER_POST_NORM | RM_LAYER_V_NORM,
     ROWS(HP_GEMMA4), ROWS(GEMMA4_LAYER), ROWS(GEMMA4_RULES), NULL, "attention.sliding_window_pattern",
     RM_ARCH_EMBD_SCALE | RM_ARCH_KQ_UNSCALED, NULL, 0, NULL, NULL},
    /* Step-3.5-Flash: sliding and full layers with their own query heads, a sigmoid gate per head,
     * per-head q/k norms, partial NEOX RoPE on the full layers, sigmoid routing with a selection
     * bias and a scale, an ungated shared expert, SwiGLU limits per layer, leading dense layers. */
    {"step35", "Step-3.5-Flash", RM_QK_NORM_PER_HEAD, RM_ROPE_NEOX, RM_SHEXP_PLAIN, FULL_MOE | RM_LAYER_HEAD_GATE,
     ROWS(HP_STEP35), ROWS(STEP35_LAYER), ROWS(STEP35_RULES), NULL, "attention.sliding_window_pattern",
     RM_ARCH_DENSE_BY_ROUTER | RM_ARCH_FULL_ROT_HALF, ROWS(STEP35_FLOATS), NULL, NULL},
    /* DeepSeek-V4-Flash: mHC streams, one key-value head with sinks over a sliding window, compressed
     * layers (CSA with an indexer, HCA), a grouped output projection, sqrt(softplus) and hash
     * routing, clamped SwiGLUs. */
    {"deepseek4", "DeepSeek-V4", RM_QK_NORM_NONE, RM_ROPE_NORM, RM_SHEXP_PLAIN,
     RM_LAYER_ATTN_SLIDING | RM_LAYER_FFN_MOE | RM_LAYER_SINKS,
     ROWS(HP_DEEPSEEK4), ROWS(DEEPSEEK4_LAYER), ROWS(DEEPSEEK4_RULES), NULL, NULL, RM_ARCH_MHC, ROWS(STEP35_FLOATS), NULL,
     "attention.compress_ratios"},
};

const rm_arch * rm_arch_find(const char * name, size_t len) {
    for (int32_t i = 0; i < COUNT(ARCHS); i++) {
        if (strlen(ARCHS[i].name) == len && memcmp(ARCHS[i].name, name, len) == 0) {
            return &ARCHS[i];
        }
    }
    return NULL;
}

void rm_arch_supported_list(char * buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < COUNT(ARCHS) && at < cap; i++) {
        const rm_arch * a = &ARCHS[i];
        at += (size_t) snprintf(buf + at, cap - at, "%s%s%s%s%s", i ? ", " : "", a->name,
                                a->family[0] ? " (" : "", a->family, a->family[0] ? ")" : "");
    }
}

/* ---- layer kinds ---------------------------------------------------------------------------- */

#define ATTN_BITS (RM_LAYER_ATTN_FULL | RM_LAYER_ATTN_SLIDING | RM_LAYER_ATTN_LINEAR | RM_LAYER_ATTN_MLA)
#define FFN_BITS  (RM_LAYER_FFN_MOE | RM_LAYER_FFN_DENSE)

static int32_t hp_int(const rm_hparams * hp, uint16_t off) {
    int32_t v;
    memcpy(&v, (const char *) hp + off, sizeof(v));
    return v;
}

/* The kind of a layer no rule picks: the row's bits, and those its flags imply. */
static uint32_t plain_kind(const rm_arch * a) {
    uint32_t k = a->layer_kind;
    k |= a->qk_norm == RM_QK_NORM_PER_HEAD ? RM_LAYER_QK_NORM_HEAD : a->qk_norm == RM_QK_NORM_FULL ? RM_LAYER_QK_NORM_FULL : 0;
    k |= a->shared_expert != RM_SHEXP_NONE ? RM_LAYER_SHEXP : 0;
    return k;
}

int32_t rm_hp_ple_index(const rm_hparams * hp, int32_t il) {
    for (int32_t i = 0; hp->ple_layers && i < hp->n_ple; i++) {
        int32_t v;
        memcpy(&v, (const char *) hp->ple_layers + 4 * (size_t) i, sizeof(v));
        if (v == il) {
            return i;
        }
    }
    return -1;
}

uint32_t rm_arch_layer_kind(const rm_arch * a, const rm_hparams * hp, int32_t il) {
    uint32_t k = plain_kind(a);
    for (int32_t r = 0; r < a->n_rules; r++) {
        const rm_kind_rule * rule = &a->rules[r];
        const int32_t n = rule->form == RM_RULE_RATIO ? (int32_t) rule->n_off : hp_int(hp, rule->n_off);
        const int picked = rule->form == RM_RULE_FIRST_N      ? il < n
                           : rule->form == RM_RULE_ALL_IF_SET ? n > 0
                           : rule->form == RM_RULE_LISTED     ? rm_hp_slides(hp, il)
                           : rule->form == RM_RULE_NOT_INDEXED ? hp->layer_indexer && !hp->layer_indexer[il]
                           : rule->form == RM_RULE_EVERY_N    ? n > 0 && il % n == n - 1
                           : rule->form == RM_RULE_PLE        ? rm_hp_ple_index(hp, il) >= 0
                           : rule->form == RM_RULE_RATIO      ? rm_hp_ratio(hp, il) == n
                                                              : n > 1 && il % n != n - 1;
        if (picked) {
            k = (k & ~rule->clear) | rule->set;
        }
    }
    return k;
}

int rm_layer_kind_has(uint32_t k, uint32_t when) {
    const uint32_t features = when & ~(ATTN_BITS | FFN_BITS);
    return (k & features) == features && (!(when & ATTN_BITS) || (k & when & ATTN_BITS)) &&
           (!(when & FFN_BITS) || (k & when & FFN_BITS));
}

void rm_layer_kind_unsupported(uint32_t k, char * buf, size_t cap) {
    static const struct { uint32_t bit; const char * words; } NAMES[] = {
        {RM_LAYER_ATTN_SLIDING, "sliding-window attention"}, {RM_LAYER_ATTN_LINEAR, "linear attention"},
        {RM_LAYER_ATTN_MLA, "multi-head latent attention"}, {RM_LAYER_FFN_DENSE, "dense FFN"},
        {RM_LAYER_SINKS, "attention sinks"}, {RM_LAYER_HEAD_GATE, "a gate per attention head"},
        {RM_LAYER_DSA_INDEX, "sparse attention"}, {RM_LAYER_DSA_SHARED, "shared sparse attention"},
        {RM_LAYER_QSA_INDEX, "QSA sparse attention"}, {RM_LAYER_PLE, "PLE n-gram embeddings"},
        {RM_LAYER_MHC, "manifold-constrained hyper-connections and attention with one key-value head (DeepSeek-V4)"},
        {RM_LAYER_CSA, "compressed sparse attention (ratio 4)"},
        {RM_LAYER_HCA, "heavily compressed attention (ratio 128)"},
        {RM_LAYER_HASH_ROUTE, "experts by a table per token id"},
    };
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(NAMES) / sizeof(NAMES[0]) && at < cap; i++) {
        if (k & NAMES[i].bit & ~(uint32_t) RM_LAYER_RUNS) {
            at += (size_t) snprintf(buf + at, cap - at, "%s%s", at ? ", " : "", NAMES[i].words);
        }
    }
    if (at == 0) {
        snprintf(buf, cap, "kind 0x%x", (unsigned) (k & ~(uint32_t) RM_LAYER_RUNS));
    }
}

/* ---- values --------------------------------------------------------------------------------- */

double rm_expr_eval(const rm_expr * e, const rm_hparams * hp) {
    switch (e->op) {
    case RM_EXPR_FIELD: return hp_int(hp, e->a);
    case RM_EXPR_RATIO: return hp_int(hp, e->a) / hp_int(hp, e->b);
    default: return e->k;
    }
}

int64_t rm_dim_value(rm_dim d, const rm_hparams * hp) {
    switch (d) {
    case RM_DIM_ONE: return 1;
    case RM_DIM_EMBD: return hp->n_embd;
    case RM_DIM_Q: return (int64_t) hp->n_head * hp->head_dim;
    case RM_DIM_KV: return (int64_t) hp->n_head_kv * hp->head_dim;
    case RM_DIM_HEAD: return hp->head_dim;
    case RM_DIM_FF_EXP: return hp->n_ff_exp;
    case RM_DIM_FF_SHEXP: return hp->n_ff_shexp;
    case RM_DIM_EXPERT: return hp->n_expert;
    case RM_DIM_FF: return hp->n_ff;
    case RM_DIM_Q_LORA: return hp->q_lora_rank;
    case RM_DIM_KV_LORA: return hp->kv_lora_rank;
    case RM_DIM_KV_A: return (int64_t) hp->kv_lora_rank + hp->n_rot;
    case RM_DIM_NOPE: return hp->head_dim - hp->n_rot;
    case RM_DIM_HEAD_V: return hp->head_dim_v;
    case RM_DIM_V: return (int64_t) hp->n_head * hp->head_dim_v;
    case RM_DIM_HEADS: return hp->n_head;
    case RM_DIM_Q_GATE: return 2 * (int64_t) hp->n_head * hp->head_dim;
    case RM_DIM_SSM_CONV: return 2 * (int64_t) hp->ssm_n_k * hp->ssm_d_state + hp->ssm_d_inner;
    case RM_DIM_SSM_INNER: return hp->ssm_d_inner;
    case RM_DIM_SSM_NV: return hp->ssm_n_v;
    case RM_DIM_SSM_BA: return 2 * (int64_t) hp->ssm_n_v;
    case RM_DIM_SSM_KERNEL: return hp->ssm_d_conv;
    case RM_DIM_SSM_HEAD_V: return hp->ssm_n_v > 0 ? hp->ssm_d_inner / hp->ssm_n_v : 0;
    case RM_DIM_Q_SWA: return (int64_t) hp->n_head_swa * hp->head_dim_swa;
    case RM_DIM_KV_SWA: return (int64_t) hp->n_head_kv_swa * hp->head_dim_swa;
    case RM_DIM_HEAD_SWA: return hp->head_dim_swa;
    case RM_DIM_FF_EXP2: return 2 * (int64_t) hp->n_ff_exp;
    case RM_DIM_ROT_HALF: return hp->n_rot / 2;
    case RM_DIM_KV_V: return (int64_t) hp->n_head_kv * hp->head_dim_v;
    case RM_DIM_KV_V_SWA: return (int64_t) hp->n_head_kv_swa * rm_head_dim_v_swa(hp->head_dim, hp->head_dim_v, hp->head_dim_swa);
    case RM_DIM_HEADS_SWA: return hp->n_head_swa;
    case RM_DIM_IDX_HEAD: return hp->index_head_dim;
    case RM_DIM_IDX_HEADS: return hp->index_n_head;
    case RM_DIM_IDX_Q: return (int64_t) hp->index_n_head * hp->index_head_dim;
    case RM_DIM_HC: return hp->hc_count;
    case RM_DIM_HC_EMBD: return (int64_t) hp->hc_count * hp->n_embd;
    case RM_DIM_HC_RANK: return hp->hc_low_rank;
    case RM_DIM_PLE_EMBD: return (int64_t) hp->n_ple_head * hp->n_embd_per_layer;
    case RM_DIM_PLE_KERNEL: return hp->ple_conv_kernel;
    case RM_DIM_HC_MIX: return (2 + (int64_t) hp->hc_count) * hp->hc_count;
    case RM_DIM_HC_SCALES: return 3;
    case RM_DIM_O_IN: return hp->o_groups > 0 ? (int64_t) hp->n_head * hp->head_dim / hp->o_groups : 0;
    case RM_DIM_O_MID: return (int64_t) hp->o_groups * hp->o_lora_rank;
    case RM_DIM_HEAD2: return 2 * (int64_t) hp->head_dim;
    case RM_DIM_IDX_HEAD2: return 2 * (int64_t) hp->index_head_dim;
    case RM_DIM_RATIO_CSA: return 4;
    case RM_DIM_RATIO_HCA: return 128;
    case RM_DIM_EXPERT_USED: return hp->n_expert_used;
    case RM_DIM_VOCAB: return hp->n_vocab;
    default: return 0;   /* RM_DIM_ANY */
    }
}

/* ---- the public description ----------------------------------------------------------------- */

static const char * const DIM_NAMES[RM_DIM_COUNT] = {
    "1", "any", "n_embd", "n_q", "n_kv", "head_dim", "n_ff_exp", "n_ff_shexp", "n_expert",
    "n_ff", "q_lora_rank", "kv_lora_rank", "n_kv_a", "n_nope", "head_dim_v", "n_v", "n_head",
    "n_q_gate", "ssm_conv_dim", "ssm_d_inner", "ssm_n_v", "ssm_n_ba", "ssm_d_conv", "ssm_head_v",
    "n_q_swa", "n_kv_swa", "head_dim_swa", "n_ff_exp2", "n_rot_half", "n_kv_v", "n_kv_v_swa", "n_head_swa",
    "index_head_dim", "index_n_head", "n_index_q", "hc_count", "n_hc_embd", "hc_low_rank",
    "n_ple_embd", "ple_conv_kernel",
    "hc_mix", "hc_scales", "n_o_in", "n_o_mid", "head_dim2", "index_head_dim2", "ratio_csa", "ratio_hca",
    "n_expert_used", "n_vocab",
};

int32_t rm_arch_count(void) { return COUNT(ARCHS); }

static const rm_arch * arch_at(const char * fn, int32_t i, const void * out) {
    if (!out) {
        rm_fail(RM_E_INVALID_ARG, "%s: out is NULL", fn);
        return NULL;
    }
    if (i < 0 || i >= COUNT(ARCHS)) {
        rm_fail(RM_E_INVALID_ARG, "%s: arch %d is outside [0, %d)", fn, i, COUNT(ARCHS));
        return NULL;
    }
    return &ARCHS[i];
}

/* The kinds a layer of the arch can have: the plain kind with any subset of the rules applied
 * (at most 2^RULES_MAX); the first is the plain kind. */
#define RULES_MAX 4

static int32_t arch_kinds(const rm_arch * a, uint32_t kinds[1 << RULES_MAX]) {
    const int32_t nr = a->n_rules < RULES_MAX ? a->n_rules : RULES_MAX;
    for (int32_t m = 0; m < (1 << nr); m++) {
        uint32_t k = plain_kind(a);
        for (int32_t r = 0; r < nr; r++) {
            if (m & (1 << r)) {
                k = (k & ~a->rules[r].clear) | a->rules[r].set;
            }
        }
        kinds[m] = k;
    }
    return 1 << nr;
}

/* The first kind that holds row t; 0 when none does. */
static uint32_t kind_holding(const uint32_t * kinds, int32_t n_kinds, const rm_tensor_row * t) {
    for (int32_t j = 0; j < n_kinds; j++) {
        if (rm_layer_kind_has(kinds[j], t->when)) {
            return kinds[j];
        }
    }
    return 0;
}

/* The tensor rows some layer of the arch can hold: the i-th of them. */
static const rm_tensor_row * tensor_of_kind(const rm_arch * a, int32_t i, uint32_t * k) {
    uint32_t kinds[1 << RULES_MAX];
    const int32_t nk = arch_kinds(a, kinds);
    for (int32_t t = 0; t < a->n_tensors; t++) {
        const uint32_t kt = kind_holding(kinds, nk, &a->tensors[t]);
        if (kt && i-- == 0) {
            *k = kt;
            return &a->tensors[t];
        }
    }
    return NULL;
}

rm_status rm_arch_describe(int32_t arch, rm_arch_info * out) {
    rm_clear_error();
    const rm_arch * a = arch_at("rm_arch_describe", arch, out);
    if (!a) {
        return RM_E_INVALID_ARG;
    }
    uint32_t kt;
    int32_t n = 0;
    while (tensor_of_kind(a, n, &kt)) {
        n++;
    }
    *out = (rm_arch_info) {a->name, a->family, a->qk_norm, a->rope, a->shared_expert, plain_kind(a), a->n_hparams, n,
                           a->n_rules};
    return RM_OK;
}

static void expr_text(const rm_expr * e, char * buf, size_t cap) {
    if (e->op == RM_EXPR_NONE) {
        buf[0] = '\0';
    } else if (e->op == RM_EXPR_CONST) {
        snprintf(buf, cap, "%.9g", e->k);
    } else {
        snprintf(buf, cap, "%s", e->text);
    }
}

rm_status rm_arch_hparam_describe(int32_t arch, int32_t i, rm_arch_hparam_info * out) {
    rm_clear_error();
    const rm_arch * a = arch_at("rm_arch_hparam_describe", arch, out);
    if (!a) {
        return RM_E_INVALID_ARG;
    }
    if (i < 0 || i >= a->n_hparams) {
        return rm_fail(RM_E_INVALID_ARG, "rm_arch_hparam_describe: %s has %d hparams, not %d", a->name, a->n_hparams, i + 1);
    }
    const rm_hparam_row * h = &a->hparams[i];
    memset(out, 0, sizeof(*out));
    out->key = h->key;
    out->field = h->field;
    out->kind = h->kind;
    out->required = h->dflt.op == RM_EXPR_NONE;
    expr_text(&h->dflt, out->dflt, sizeof(out->dflt));
    expr_text(&h->min, out->min, sizeof(out->min));
    expr_text(&h->max, out->max, sizeof(out->max));
    expr_text(&h->run_min, out->run_min, sizeof(out->run_min));
    expr_text(&h->run_max, out->run_max, sizeof(out->run_max));
    out->field_swa = h->off_swa ? h->field_swa : NULL;
    return RM_OK;
}

rm_status rm_arch_tensor_describe(int32_t arch, int32_t i, rm_arch_tensor_info * out) {
    rm_clear_error();
    const rm_arch * a = arch_at("rm_arch_tensor_describe", arch, out);
    if (!a) {
        return RM_E_INVALID_ARG;
    }
    uint32_t k = 0;
    const rm_tensor_row * t = i >= 0 ? tensor_of_kind(a, i, &k) : NULL;
    if (!t) {
        return rm_fail(RM_E_INVALID_ARG, "rm_arch_tensor_describe: %s has no tensor template %d", a->name, i);
    }
    *out = (rm_arch_tensor_info) {t->name, t->field, t->residual,
                                  t->presence == RM_TENSOR_REQUIRED ||
                                      (t->presence == RM_TENSOR_REQUIRED_WHEN && rm_layer_kind_has(k, t->required_when)),
                                  t->f32, t->expert, t->when, {DIM_NAMES[t->ne[0]], DIM_NAMES[t->ne[1]], DIM_NAMES[t->ne[2]]}};
    return RM_OK;
}
