/* weights.h - internal: what a loaded model holds, as plain data: a weight tensor, one layer's
 * weights and the hyperparameters. The architecture table (arch.h) names these fields, the
 * loader (model.c) fills them, the forward pass reads them. */
#ifndef RM_WEIGHTS_H
#define RM_WEIGHTS_H

#include <stdint.h>
#include <string.h>

/* A weight tensor inside a mapped file. A 3-D expert tensor holds ne[2] matrices of ne[1] rows. */
typedef struct rm_weight {
    int32_t         type;
    int64_t         ne[4];
    const uint8_t * data;         /* NULL when the tensor is absent */
    uint64_t        row_bytes;    /* bytes of one row of ne[0] elements */
} rm_weight;

static inline const uint8_t * rm_weight_matrix(const rm_weight * w, int64_t i) {
    return w->data + (uint64_t) i * (uint64_t) w->ne[1] * w->row_bytes;
}

/* One hyper-connection (qwen4exp's gated residual): the model keeps hc_count residual streams of
 * n_embd; the block's input is their mean, each stream RMS-normed (norm) and gated by
 * sigmoid(up silu(down xn / hc)); the block's output joins stream c times 2 sigmoid(inject_c xn / hc). */
typedef struct rm_hc {
    rm_weight norm;                      /* ne = {hc_count*n_embd}: a gamma per stream (1 + w), as llama.cpp writes it */
    rm_weight down;                      /* ne = {hc_count*n_embd, hc_low_rank} */
    rm_weight up;                        /* ne = {hc_low_rank, hc_count*n_embd} */
    rm_weight inject;                    /* ne = {hc_count*n_embd, hc_count}; absent in the output's mixer */
} rm_hc;

/* One manifold-constrained hyper-connection (DeepSeek-V4's, RM_LAYER_MHC): from the hc_count
 * streams RMS-normed as one row, fn gives the streams' input weights (hc), output weights (hc)
 * and mixing matrix (hc*hc), each times its scale plus base. */
typedef struct rm_mhc {
    rm_weight fn;                        /* ne = {hc_count*n_embd, (2+hc_count)*hc_count} */
    rm_weight base;                      /* ne = {(2+hc_count)*hc_count} */
    rm_weight scale;                     /* ne = {3}: pre, post, comb */
} rm_mhc;

typedef struct rm_layer {
    uint32_t  kind;                      /* RM_LAYER_* bits (rapidmoe.h): what this layer is */
    rm_weight attn_norm;                 /* ne = {n_embd} */
    rm_weight wq, wk, wv;                /* ne = {n_embd, n_head*head_dim}, {n_embd, n_head_kv*head_dim} */
    rm_weight bq, bk, bv;                /* optional biases, ne = {n_out} */
    rm_weight q_norm, k_norm;            /* ne = {head_dim} (per head) or {n_head*head_dim} (full) */
    rm_weight wo;                        /* ne = {n_head*head_dim, n_embd} */
    rm_weight ffn_norm;                  /* ne = {n_embd} */
    rm_weight router;                    /* ne = {n_embd, n_expert} */
    rm_weight gate_exps, up_exps;        /* ne = {n_embd, n_ff_exp, n_expert} */
    rm_weight down_exps;                 /* ne = {n_ff_exp, n_embd, n_expert} */
    rm_weight gate_res, up_res, down_res;/* residuals, same shapes as their bases; absent without sidecar */
    rm_weight gate_shexp, up_shexp;      /* ne = {n_embd, n_ff_shexp} */
    rm_weight down_shexp;                /* ne = {n_ff_shexp, n_embd} */
    rm_weight gate_inp_shexp;            /* ne = {n_embd} */
    rm_weight bo;                        /* output projection bias, ne = {n_embd} */
    rm_weight sinks;                     /* attention sink logits, ne = {n_head} */
    rm_weight router_b;                  /* ne = {n_expert} */
    rm_weight gate_exps_b, up_exps_b;    /* ne = {n_ff_exp, n_expert} */
    rm_weight down_exps_b;               /* ne = {n_embd, n_expert} */
    rm_weight exp_probs_b;               /* selection bias of the routed experts, ne = {n_expert} */
    rm_weight ffn_gate, ffn_up;          /* dense FFN, ne = {n_embd, n_ff} */
    rm_weight ffn_down;                  /* ne = {n_ff, n_embd} */
    /* multi-head latent attention (mla.c); head_dim = nope + n_rot, head_dim_v the value width */
    rm_weight wq_a;                      /* ne = {n_embd, q_lora_rank} */
    rm_weight q_a_norm;                  /* ne = {q_lora_rank} */
    rm_weight wq_b;                      /* ne = {q_lora_rank, n_head*head_dim} */
    rm_weight wkv_a;                     /* ne = {n_embd, kv_lora_rank + n_rot} */
    rm_weight kv_a_norm;                 /* ne = {kv_lora_rank} */
    rm_weight wk_b;                      /* ne = {nope, kv_lora_rank, n_head}: per head, k's up-projection transposed */
    rm_weight wv_b;                      /* ne = {kv_lora_rank, head_dim_v, n_head} */
    /* DeepSeek sparse attention's lightning indexer (RM_LAYER_DSA_INDEX): index_n_head query heads of
     * index_head_dim from the q low rank, one key from the layer's input, LayerNorm'd; RoPE on the
     * first n_rot dims of each (interleaved pairs) */
    rm_weight idx_wq_b;                  /* ne = {q_lora_rank, index_n_head*index_head_dim} */
    rm_weight idx_wk;                    /* ne = {n_embd, index_head_dim} */
    rm_weight idx_k_norm, idx_k_norm_b;  /* ne = {index_head_dim}: the key's LayerNorm */
    rm_weight idx_proj;                  /* ne = {n_embd, index_n_head}: each head's weight per token */
    /* QSA's indexer (RM_LAYER_QSA_INDEX, qwen4exp): index_n_head query heads and one raw key of
     * index_head_dim from the layer's input, per-head RMSNorms; RoPE on the first n_rot dims (NEOX) */
    rm_weight qsa_wq;                    /* ne = {n_embd, index_n_head*index_head_dim} */
    rm_weight qsa_wk;                    /* ne = {n_embd, index_head_dim} */
    rm_weight qsa_q_norm, qsa_k_norm;    /* ne = {index_head_dim} */
    /* linear attention (Gated DeltaNet): conv_dim = 2*n_k*d_state + n_v*head_v, d_inner = n_v*head_v */
    rm_weight wqkv;                      /* ne = {n_embd, conv_dim}: q, k (n_k heads of d_state), v (n_v heads) */
    rm_weight wz;                        /* ne = {n_embd, d_inner}: the output gate z */
    rm_weight ssm_beta, ssm_alpha;       /* ne = {n_embd, n_v} (qwen35moe) */
    rm_weight ssm_ba;                    /* ne = {n_embd, 2*n_v}: per key head, its b's then its a's (qwen3next) */
    rm_weight ssm_conv1d;                /* ne = {d_conv, conv_dim}: one causal filter per channel */
    rm_weight ssm_dt;                    /* ne = {n_v}: bias added to alpha before softplus */
    rm_weight ssm_a;                     /* ne = {n_v}: -exp(A_log), the decay rate */
    rm_weight ssm_norm;                  /* ne = {head_v}: the gated RMSNorm's weight */
    rm_weight ssm_out;                   /* ne = {d_inner, n_embd} */
    /* Gemma 4: sandwich norms (RM_LAYER_POST_NORM), the dense FFN beside the experts, its router */
    rm_weight attn_post_norm;            /* ne = {n_embd}: on the attention output */
    rm_weight ffn_post_norm;             /* ne = {n_embd}: on the FFN output (dense + experts) */
    rm_weight ffn_post_norm_1;           /* ne = {n_embd}: on the dense FFN's output */
    rm_weight ffn_pre_norm_2;            /* ne = {n_embd}: the experts' input norm (ffn_norm: the dense FFN's) */
    rm_weight ffn_post_norm_2;           /* ne = {n_embd}: on the experts' output */
    rm_weight router_norm;               /* ne = {n_embd}: the router's input norm (ffn_gate_inp.scale) */
    rm_weight down_exps_scale;           /* ne = {n_expert}: each expert's output times this */
    rm_weight gate_up_exps;              /* ne = {n_embd, 2*n_ff_exp, n_expert}: gate rows, then up rows (llama.cpp's
                                            fused form; gate_exps and up_exps absent) */
    rm_weight out_scale;                 /* ne = {1}: the layer's output times this */
    /* Step-3.5: a sigmoid gate per query head on the attention output (RM_LAYER_HEAD_GATE) */
    rm_weight attn_gate;                 /* ne = {n_embd, n_head} (the layer kind's heads) */
    /* the SwiGLU's limit (Step-3.5): silu(gate) at most it, up within [-it, it]; 0: none. The
     * routed experts' and the others' (shared expert, dense FFN), from the arch's layer floats */
    float     ffn_limit, ffn_limit_sh;
    float     ffn_limit_alpha;           /* which limited SwiGLU: 0 Step-3.5's, RM_SWIGLU_DSV4_ALPHA DeepSeek-V4's */
    /* QSA: the positions of a key block (attention.compress_ratios' entry, a whole number); 0: none */
    float     qsa_ratio;
    rm_hc     hc_attn, hc_ffn;             /* RM_ARCH_HYPER: before the token mixer, before the FFN */
    /* PLE (RM_LAYER_PLE, qwen4exp): ple_embd = n_ple_head * n_embd_per_layer floats of hashed n-gram
     * rows (per_layer_token_embd) give a value and a key per stream; hc_embd = hc_count * n_embd */
    rm_weight ple_key;                   /* ne = {ple_embd, hc_embd} */
    rm_weight ple_value;                 /* ne = {ple_embd, n_embd} */
    rm_weight ple_norm_key, ple_norm_query, ple_norm_conv; /* ne = {hc_embd}: a gamma per stream (1 + w) */
    rm_weight ple_conv1d;                /* ne = {ple_conv_kernel, hc_embd}: a dilated causal filter per channel */
    int32_t   ple_index;                 /* the layer's place in ple.layers (its hash constants), -1: none */
    /* DeepSeek-V4 (RM_LAYER_MHC): one key head that is also the value, a grouped output projection;
     * the q low rank (wq_a, q_a_norm, wq_b), sinks and the FFN rows are the shared ones */
    rm_weight wkv;                       /* ne = {n_embd, head_dim} */
    rm_weight kv_norm;                   /* ne = {head_dim} */
    rm_weight wo_a;                      /* ne = {n_head*head_dim/o_groups, o_groups*o_lora_rank}: per group a block */
    rm_weight wo_b;                      /* ne = {o_groups*o_lora_rank, n_embd} */
    rm_mhc    mhc_attn, mhc_ffn;         /* before the attention, before the FFN */
    /* the compressor (RM_LAYER_CSA: two series of head_dim, ratio 4; RM_LAYER_HCA: one, ratio 128) */
    rm_weight comp_wkv, comp_wgate;      /* ne = {n_embd, 2*head_dim} (CSA) or {n_embd, head_dim} (HCA) */
    rm_weight comp_ape;                  /* ne = {2*head_dim, 4} or {head_dim, 128}: a gate bias per window slot */
    rm_weight comp_norm;                 /* ne = {head_dim} */
    /* CSA's indexer: its own compressor at index_head_dim (two series), its queries from the q low
     * rank (idx_wq_b) and each head's weight (idx_proj) */
    rm_weight idx_comp_wkv, idx_comp_wgate; /* ne = {n_embd, 2*index_head_dim} */
    rm_weight idx_comp_ape;              /* ne = {2*index_head_dim, 4} */
    rm_weight idx_comp_norm;             /* ne = {index_head_dim} */
    rm_weight hash_experts;              /* ne = {n_expert_used, n_vocab}, I32: the experts per token id (RM_LAYER_HASH_ROUTE) */
} rm_layer;

#define RM_PLE_MAX_NGRAM 8
#define RM_PLE_MAX_HEADS 256
#define RM_PLE_MAX_KERNEL 16

/* Filled from the keys by walking the architecture's hyperparameter rows (arch.c), in the order
 * the rows give; fields no row names stay 0. */
typedef struct rm_hparams {
    int32_t n_vocab, n_embd, n_layer;
    int32_t n_head, n_head_kv, head_dim, n_rot;
    int32_t head_dim_v;                  /* value_length: value heads' width (MLA's; MiMo's narrower than the keys') */
    int32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int32_t n_ctx_train;
    int32_t norm_topk;
    int32_t n_layer_dense_lead;          /* leading layers with a dense FFN (DeepSeek/GLM rows); 0: none */
    int32_t n_ff;                        /* dense FFN width */
    int32_t n_expert_shared;             /* shared experts of n_ff_exp each (DeepSeek/GLM); n_ff_shexp is their sum */
    int32_t gating;                      /* rm_gating; 0 read as softmax (today's rows) */
    int32_t n_group, n_group_used;       /* group-limited top-k: keep the best n_group_used of n_group groups */
    int32_t q_lora_rank, kv_lora_rank;   /* MLA */
    int32_t n_layer_nextn;               /* trailing next-token-prediction layers the forward pass skips */
    float   rms_eps;
    float   rope_base;
    int32_t n_swa;                       /* sliding window of the sliding layers (positions a token sees, itself included) */
    int32_t swa_pattern;                 /* every swa_pattern-th layer attends to the whole context, the others slide */
    float   rope_yarn_factor;            /* YaRN context extension; 1: plain RoPE */
    int32_t n_ctx_orig_yarn;             /* the context the model was trained at before YaRN */
    float   yarn_beta_fast, yarn_beta_slow;
    int32_t yarn_truncate;               /* round YaRN's correction range to whole dims (llama.cpp always does) */
    float   expert_weights_scale;        /* routed weights times this (routed_scaling_factor); 0 read as 1 */
    float   yarn_rope_mult;              /* MLA's YaRN: cos and sin times this (DeepSeek's mscale ratio) */
    float   kq_scale;                    /* attention logits times this (DeepSeek's mscale^2 / sqrt(head_dim)); 0: 1/sqrt(head_dim) */
    /* linear attention (qwen35moe, qwen3next): llama.cpp's ssm.* keys */
    int32_t ssm_d_conv;                  /* conv kernel length */
    int32_t ssm_d_state;                 /* key head width (d_state) */
    int32_t ssm_n_k;                     /* key heads (group_count) */
    int32_t ssm_n_v;                     /* value heads (time_step_rank) */
    int32_t ssm_d_inner;                 /* n_v * value head width */
    int32_t full_attn_interval;          /* every n-th layer is full attention, the others linear */
    int32_t n_layer_linear;              /* layers with linear attention, counted by the loader */
    int32_t n_layer_swa;                 /* layers with a sliding window (when n_swa > 0), counted by the loader */
    int32_t n_layer_csa, n_layer_hca;    /* DeepSeek-V4's compressed layers (RM_LAYER_CSA, RM_LAYER_HCA), counted so */
    /* sliding layers of another shape (Gemma 4); the loader sets them to the others' where the file is silent */
    int32_t n_head_kv_swa, head_dim_swa, n_rot_swa;
    int32_t n_head_swa;                  /* their query heads (Step-3.5's differ) */
    float   rope_base_swa;
    float   final_softcap;               /* logits = c * tanh(logits / c); 0: none */
    int32_t n_embd_per_layer;            /* per-layer input embeddings (Gemma 4's small models): not run */
    int32_t n_kv_shared;                 /* trailing layers that reuse earlier layers' KV: not run */
    const uint8_t * layer_swa;           /* per layer, nonzero when it slides: the arch's swa_layers_key list (in
                                            the mapped file; rm_hp_slides reads it); NULL without one */
    int32_t layer_swa_bytes;             /* its entries' width: 1 (bools, Gemma 4's) or 4 (int32s, MiMo's) */
    float   v_scale;                     /* the values times this (attention.value_scale, MiMo's); 0 read as 1 */
    /* DeepSeek sparse attention (GLM-5): the indexer's heads and key width, the positions kept */
    int32_t index_n_head, index_head_dim, index_top_k;
    int32_t hc_count, hc_low_rank;      /* hyper-connections (RM_ARCH_HYPER): residual streams, the gate's rank */
    int32_t ssm_gate;                    /* the Gated DeltaNet's gated norm: rm_ssm_gate */
    const uint8_t * layer_indexer;       /* per layer, 1 where it runs its own indexer, 0 where it takes the
                                            previous one's positions: the arch's indexer_layers_key list (bools,
                                            in the mapped file); NULL: every layer runs its own */
    /* PLE (qwen4exp): the layers ple.layers lists (0-based, ascending; n_ple of them, 32-bit integers in the
     * mapped file), n-grams of 2 .. ple_ngram tokens hashed by ple_heads_per_ngram heads each (n_ple_head =
     * (ple_ngram - 1) * ple_heads_per_ngram heads per layer, rows of n_embd_per_layer), an eos token that
     * cuts them, and the dilated conv's taps. The hash constants, u64 arrays in the mapped file, are per
     * PLE layer in ple.layers' order: ple_ngram multipliers, n_ple_head row offsets and vocab sizes. The
     * loader's limits: ple_ngram <= RM_PLE_MAX_NGRAM, n_ple_head <= RM_PLE_MAX_HEADS, ple_conv_kernel <=
     * RM_PLE_MAX_KERNEL. */
    const void *    ple_layers;
    int32_t         n_ple, ple_ngram, ple_heads_per_ngram, n_ple_head, ple_conv_kernel, ple_eos;
    const uint8_t * ple_mult, * ple_head_off, * ple_head_vocab;
    /* DeepSeek-V4 */
    int32_t o_groups, o_lora_rank;       /* the grouped output projection: head groups, each group's rank */
    int32_t hc_sinkhorn_iters;           /* the mixing matrix's Sinkhorn-Knopp iterations */
    float   hc_eps;                      /* added to the streams' weights and the Sinkhorn sums */
    float   compress_rope_base;          /* RoPE base of the compressed layers (and of their entries) */
    int32_t n_layer_hash;                /* the first layers route by a table per token id */
    const uint8_t * layer_ratio;         /* per layer, its compress ratio as int32 (0, 4 or 128): the arch's
                                            ratio_layers_key list (in the mapped file); NULL: none */
} rm_hparams;

/* Layer il's compress ratio by the file's list (0 without one). */
static inline int32_t rm_hp_ratio(const rm_hparams * hp, int32_t il) {
    int32_t v = 0;
    if (hp->layer_ratio) {
        memcpy(&v, hp->layer_ratio + 4 * (size_t) il, sizeof(v));
    }
    return v;
}

/* The activation of a Gated DeltaNet layer's output gate in its gated norm (the key
 * rapidmoe.ssm.output_gate_func, the project's own: GGUF has none). */
typedef enum rm_ssm_gate {
    RM_SSM_GATE_SILU    = 1,     /* silu(z) (Qwen3-Next, Qwen3.5) */
    RM_SSM_GATE_SIGMOID = 2      /* sigmoid(z) (qwen4exp's output_gate_type sigmoid) */
} rm_ssm_gate;

/* The floats of one MLA cache row: the latent and the shared rotary key, then with DeepSeek
 * sparse attention the indexer's key. */
static inline int64_t rm_mla_row(const rm_hparams * hp) {
    return hp->kv_lora_rank > 0 ? (int64_t) hp->kv_lora_rank + hp->n_rot + hp->index_head_dim : 0;
}

/* A sliding layer's value head width: its key heads' (Gemma 4's own width), unless value_length
 * makes the values narrower than the keys, then that width in both shapes (MiMo's). */
static inline int32_t rm_head_dim_v_swa(int32_t head_dim, int32_t head_dim_v, int32_t head_dim_swa) {
    return head_dim_v > 0 && head_dim_v != head_dim ? head_dim_v : head_dim_swa;
}

/* Whether layer il slides by the file's list (0 without one). */
static inline int rm_hp_slides(const rm_hparams * hp, int32_t il) {
    if (!hp->layer_swa) {
        return 0;
    }
    if (hp->layer_swa_bytes == 4) {
        int32_t v;
        memcpy(&v, hp->layer_swa + 4 * (size_t) il, sizeof(v));
        return v != 0;
    }
    return hp->layer_swa[il] != 0;
}

#endif
