/* arch.h - the architectures the runtime runs, as rows of a table (arch.c).
 *
 * A row holds what the loader reads (hyperparameter keys with defaults and ranges), what each
 * layer holds (tensor templates with symbolic shapes), and the few behaviour flags the one
 * generic forward pass (session.c, moe.c) reads at marked points. The loader (model.c) has no
 * per-architecture code: it walks the row. An architecture whose math differs more than a flag
 * can say gets a new layer kind and its own function, not more flags. */
#ifndef RM_ARCH_H
#define RM_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include "rapidmoe.h"
#include "weights.h"

/* A value computed from the hyperparameters read so far. */
typedef enum rm_expr_op {
    RM_EXPR_NONE  = 0,            /* not given: a required key, an unbounded range */
    RM_EXPR_CONST = 1,            /* k */
    RM_EXPR_FIELD = 2,            /* the int32 field at a */
    RM_EXPR_RATIO = 3             /* field a / field b, integer division */
} rm_expr_op;

typedef struct rm_expr {
    uint8_t      op;              /* rm_expr_op */
    double       k;
    uint16_t     a, b;            /* offsetof(rm_hparams, ...) */
    const char * text;            /* the fields as written: "n_embd/n_head" */
} rm_expr;

typedef struct rm_hparam_row {
    const char * key;             /* after "{arch}." */
    const char * field;           /* the rm_hparams field's name */
    uint16_t     off;             /* offsetof(rm_hparams, field): int32_t, or float for RM_HPARAM_FLOAT */
    uint8_t      kind;            /* rm_hparam_kind */
    rm_expr      dflt;            /* NONE: required */
    rm_expr      min, max;        /* ints: accepted, else RM_E_FORMAT; NONE: unbounded */
    rm_expr      run_min, run_max;/* ints: what the forward pass runs, else RM_E_UNSUPPORTED_ARCH */
    const char * run_why;         /* said with that error, and with a missing required key's */
    uint16_t     off_swa;         /* ints: where the key may also be a per-layer array (Gemma 4's
                                   * head_count_kv), the field of the sliding layers' value (the field at
                                   * off takes the others'); 0: a single value */
    const char * field_swa;       /* that field's name; NULL with off_swa 0 */
} rm_hparam_row;

/* Symbolic tensor dimensions, from the hyperparameters. */
typedef enum rm_dim {
    RM_DIM_ONE = 0,               /* the dimension is 1 (absent) */
    RM_DIM_ANY,                   /* any size */
    RM_DIM_EMBD,                  /* n_embd */
    RM_DIM_Q,                     /* n_head * head_dim */
    RM_DIM_KV,                    /* n_head_kv * head_dim */
    RM_DIM_HEAD,                  /* head_dim */
    RM_DIM_FF_EXP,                /* n_ff_exp */
    RM_DIM_FF_SHEXP,              /* n_ff_shexp */
    RM_DIM_EXPERT,                /* n_expert */
    RM_DIM_FF,                    /* n_ff: the dense FFN */
    RM_DIM_Q_LORA,                /* q_lora_rank */
    RM_DIM_KV_LORA,               /* kv_lora_rank */
    RM_DIM_KV_A,                  /* kv_lora_rank + n_rot: the latent and the shared rotary key */
    RM_DIM_NOPE,                  /* head_dim - n_rot: a head's part without RoPE */
    RM_DIM_HEAD_V,                /* head_dim_v */
    RM_DIM_V,                     /* n_head * head_dim_v */
    RM_DIM_HEADS,                 /* n_head */
    RM_DIM_Q_GATE,                /* 2 * n_head * head_dim: q and its output gate, per head */
    RM_DIM_SSM_CONV,              /* 2 * ssm_n_k * ssm_d_state + ssm_d_inner: the conv's channels */
    RM_DIM_SSM_INNER,             /* ssm_d_inner */
    RM_DIM_SSM_NV,                /* ssm_n_v */
    RM_DIM_SSM_BA,                /* 2 * ssm_n_v */
    RM_DIM_SSM_KERNEL,            /* ssm_d_conv */
    RM_DIM_SSM_HEAD_V,            /* ssm_d_inner / ssm_n_v */
    RM_DIM_Q_SWA,                 /* n_head * head_dim_swa: a sliding layer's */
    RM_DIM_KV_SWA,                /* n_head_kv_swa * head_dim_swa */
    RM_DIM_HEAD_SWA,              /* head_dim_swa */
    RM_DIM_FF_EXP2,               /* 2 * n_ff_exp: an expert's gate and up rows together */
    RM_DIM_ROT_HALF,              /* n_rot / 2: a RoPE frequency per pair of dims */
    RM_DIM_KV_V,                  /* n_head_kv * head_dim_v: the value projection's rows */
    RM_DIM_KV_V_SWA,              /* n_head_kv_swa * a sliding layer's value head width (rm_head_dim_v_swa) */
    RM_DIM_HEADS_SWA,             /* n_head_swa */
    RM_DIM_IDX_HEAD,              /* index_head_dim: the sparse attention indexer's head width */
    RM_DIM_IDX_HEADS,             /* index_n_head */
    RM_DIM_IDX_Q,                 /* index_n_head * index_head_dim */
    RM_DIM_HC,                    /* hc_count: the hyper-connections' residual streams */
    RM_DIM_HC_EMBD,               /* hc_count * n_embd: all streams of a token */
    RM_DIM_HC_RANK,               /* hc_low_rank */
    RM_DIM_PLE_EMBD,              /* n_ple_head * n_embd_per_layer: a token's n-gram embedding (PLE) */
    RM_DIM_PLE_KERNEL,            /* ple_conv_kernel */
    RM_DIM_HC_MIX,                /* (2 + hc_count) * hc_count: an mHC's pre, post and comb weights */
    RM_DIM_HC_SCALES,             /* 3: an mHC's scales of pre, post and comb */
    RM_DIM_O_IN,                  /* n_head * head_dim / o_groups: one group of heads (DeepSeek-V4) */
    RM_DIM_O_MID,                 /* o_groups * o_lora_rank: every group's low-rank output */
    RM_DIM_HEAD2,                 /* 2 * head_dim: a CSA compressor's two series */
    RM_DIM_IDX_HEAD2,             /* 2 * index_head_dim: the CSA indexer's compressor's two series */
    RM_DIM_RATIO_CSA,             /* 4: a CSA layer's positions per compressed entry (llama.cpp's only one) */
    RM_DIM_RATIO_HCA,             /* 128: an HCA layer's (llama.cpp's only one) */
    RM_DIM_EXPERT_USED,           /* n_expert_used */
    RM_DIM_VOCAB,                 /* n_vocab */
    RM_DIM_COUNT
} rm_dim;

typedef enum rm_presence {
    RM_TENSOR_REQUIRED      = 0,
    RM_TENSOR_OPTIONAL      = 1,
    RM_TENSOR_REQUIRED_WHEN = 2   /* required when the layer has the bits required_when, else optional */
} rm_presence;

/* Optional rows the forward pass uses together: in a layer, the rows of one group are all present
 * or all absent (a file with one of them alone is damaged, and refused). */
typedef enum rm_tensor_group {
    RM_GROUP_NONE     = 0,
    RM_GROUP_QKV_BIAS = 1,        /* the q, k and v projections' biases */
    RM_GROUP_QK_NORM  = 2,        /* the q and k norms */
    RM_GROUP_COUNT
} rm_tensor_group;

typedef struct rm_tensor_row {
    const char * name;            /* printf pattern over the layer */
    const char * field;           /* the rm_layer field's name */
    uint16_t     off;             /* offsetof(rm_layer, field) */
    uint8_t      residual;        /* in the residual sidecar; bound only when one is loaded */
    uint8_t      presence;        /* rm_presence */
    uint32_t     required_when;
    uint32_t     when;            /* the RM_LAYER_* bits a layer needs to hold it (rm_layer_kind_has) */
    uint8_t      f32;             /* read as floats by the forward pass */
    uint8_t      expert;          /* a routed expert's base or residual: ne[2] = n_expert */
    uint8_t      ne[3];           /* rm_dim */
    uint8_t      group;           /* rm_tensor_group */
} rm_tensor_row;

/* How the layers' kinds vary with a hyperparameter n (the int32 field at n_off): the layers the
 * rule picks lose the bits clear and gain the bits set. */
typedef enum rm_rule_form {
    RM_RULE_FIRST_N     = 0,      /* layers il < n (leading dense layers) */
    RM_RULE_NOT_EVERY_N = 1,      /* n > 1: layers with il % n != n - 1 (all but every n-th: SWA or linear patterns) */
    RM_RULE_ALL_IF_SET  = 2,      /* n > 0: every layer (a feature the hyperparameters switch on, e.g. q_lora_rank) */
    RM_RULE_LISTED      = 3,      /* the layers the file's per-layer list marks (rm_hparams.layer_swa) */
    RM_RULE_NOT_INDEXED = 4,      /* the layers the file's indexer list marks 0 (rm_hparams.layer_indexer) */
    RM_RULE_EVERY_N     = 5,      /* n > 0: layers with il % n == n - 1 (every n-th: a hybrid's full layers
                                     where its plain layer is the linear one) */
    RM_RULE_PLE         = 6,      /* the layers the file's ple.layers lists (rm_hparams.ple_layers) */
    RM_RULE_RATIO       = 7       /* the layers whose compress ratio (rm_hp_ratio) is n_off itself: here
                                     n_off holds a constant ratio, not a field (DeepSeek-V4's 4 and 128) */
} rm_rule_form;

/* A float per layer, into an rm_layer field: the key (after "{arch}.") holds one for every layer
 * or an array of block_count; absent, 0 in every layer. Each must be finite and >= 0. */
typedef struct rm_layer_float_row {
    const char * key;
    const char * field;           /* the rm_layer field's name */
    uint16_t     off;             /* offsetof(rm_layer, field): a float */
} rm_layer_float_row;

typedef struct rm_kind_rule {
    uint8_t  form;                /* rm_rule_form */
    uint16_t n_off;
    uint32_t clear, set;
} rm_kind_rule;

typedef struct rm_arch {
    const char *           name;          /* general.architecture */
    const char *           family;        /* "Mixtral"; "" when the name says it */
    rm_qk_norm             qk_norm;
    rm_rope_kind           rope;
    rm_shared_expert       shared_expert;
    uint32_t               layer_kind;    /* attention and FFN kind bits, and BIAS/SINKS; the flags add the rest */
    const rm_hparam_row *  hparams;
    int32_t                n_hparams;
    const rm_tensor_row *  tensors;
    int32_t                n_tensors;
    const rm_kind_rule *   rules;
    int32_t                n_rules;
    /* an array key of per-layer flags (after "{arch}.") that, when present, must agree with the
     * rules about which layers have linear attention; NULL: none */
    const char *           linear_layers_key;
    /* an array key of per-layer flags, 1 for a sliding layer, that RM_RULE_LISTED rules read
     * (rm_hparams.layer_swa); NULL: none */
    const char *           swa_layers_key;
    uint32_t               flags;         /* rm_arch_flag */
    const rm_layer_float_row * layer_floats;   /* per-layer floats the forward pass reads */
    int32_t                n_layer_floats;
    /* an array key of per-layer bools, 1 for a layer that runs its own sparse-attention indexer,
     * that RM_RULE_NOT_INDEXED rules read (rm_hparams.layer_indexer); NULL: none */
    const char *           indexer_layers_key;
    /* an array key of per-layer int32 compress ratios (after "{arch}."), each 0, 4 or 128, that
     * RM_RULE_RATIO rules read (rm_hparams.layer_ratio); NULL: none */
    const char *           ratio_layers_key;
} rm_arch;

/* What an architecture does that no key says (llama.cpp hard-codes it). */
typedef enum rm_arch_flag {
    RM_ARCH_EMBD_SCALE = 1,       /* the token embeddings times sqrt(n_embd) (Gemma) */
    RM_ARCH_KQ_UNSCALED = 2,      /* attention logits are q.k, not q.k / sqrt(head_dim) (Gemma 4) */
    RM_ARCH_DENSE_BY_ROUTER = 4,  /* without leading_dense_block_count, the leading layers without a router
                                     (ffn_gate_inp) are the dense ones (llama.cpp's mimo2 writes no count) */
    RM_ARCH_FULL_ROT_HALF = 8,    /* the full-attention layers rotate half of rope.dimension_count, the
                                     sliding ones all of it (llama.cpp's step35) */
    RM_ARCH_DSA_ROPE_NEOX = 16,   /* the sparse attention indexer's RoPE in NEOX halves while the latent
                                     attention's turns interleaved pairs (llama.cpp's deepseek32) */
    RM_ARCH_HYPER = 32,           /* hyper-connections (rm_hc) in place of the layers' and the output's norms
                                     (llama.cpp's qwen4exp) */
    RM_ARCH_MHC = 64              /* manifold-constrained hyper-connections (rm_mhc, mhc.h) before the layers'
                                     and the output's norms; DeepSeek-V4's attention (dsv4.h) */
} rm_arch_flag;

/* Whether layer il is one of the file's PLE layers, and its place among them (-1: none). */
int32_t rm_hp_ple_index(const rm_hparams * hp, int32_t il);

/* NULL when the architecture is not supported. */
const rm_arch * rm_arch_find(const char * name, size_t len);

/* "llama (Mixtral), qwen2moe, ...", for the error that refuses an architecture. */
void rm_arch_supported_list(char * buf, size_t cap);

/* The kind of layer il, from the row, its flags and its kind rules over hp. */
uint32_t rm_arch_layer_kind(const rm_arch * a, const rm_hparams * hp, int32_t il);

/* Whether a layer of kind k holds a tensor whose row says `when`: the layer has every feature
 * bit of when, and its attention (FFN) kind is one of those when names, if it names any. */
int rm_layer_kind_has(uint32_t k, uint32_t when);

/* "sliding-window attention, dense FFN": the bits of k outside RM_LAYER_RUNS, in words. */
void rm_layer_kind_unsupported(uint32_t k, char * buf, size_t cap);

double  rm_expr_eval(const rm_expr * e, const rm_hparams * hp);
int64_t rm_dim_value(rm_dim d, const rm_hparams * hp);   /* RM_DIM_ANY: 0 */

#endif
