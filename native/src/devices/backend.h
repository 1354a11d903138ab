/* backend.h - the operations the forward pass needs, as a table of functions.
 *
 * The model code (session.c, moe.c) only calls through this table, so the CPU and the CUDA
 * backend run the same forward pass. Activations are row-major float arrays that live where the
 * backend computes (host memory for the CPU, device memory for CUDA): the model code allocates
 * them with be->alloc and never reads them itself; host data crosses through upload/download.
 * Weights are rm_weight views into the mapped files; a backend finds its own copy of a weight
 * from the view (the CUDA backend keeps the device copies made at load, see gpu.h). Arrays named
 * `..._host` are host memory on every backend.
 *
 * On a device backend the ops are queued in order and run asynchronously; download waits for
 * everything queued before it. Errors are sticky: the first failing op records its message, the
 * ops after it do nothing, and be->status reports it (rm_session_eval returns it). */
#ifndef RM_BACKEND_H
#define RM_BACKEND_H

#include <math.h>

#include "model.h"

typedef struct rm_backend rm_backend;

/* One token's routing in one layer: one of its n_expert_used choices. */
typedef struct rm_route {
    int32_t expert;
    float   weight;               /* router weight after renormalisation */
    float   prob;                 /* softmax probability before renormalisation */
    uint8_t residual;             /* 1 when this slot gets its expert's residual */
} rm_route;

/* The DeepSeek/GLM router's rules (gating.c): scores by softmax or sigmoid (rm_gating), a
 * selection bias that counts for the choice only, group-limited top-k, weights renormalised and
 * scaled. */
typedef struct rm_gating_params {
    int32_t gating;               /* rm_gating */
    int32_t n_group, n_group_used;/* group-limited top-k when n_group > 1 */
    int32_t norm;                 /* divide the k weights by their sum */
    float   scale;                /* then multiply them by this */
    const int32_t * hash;         /* host: n_tok rows of k expert ids, each token's choice (DeepSeek-V4's table per
                                     token id, RM_LAYER_HASH_ROUTE) in place of the top k, each in [0, n_expert);
                                     NULL: by score. CPU only */
} rm_gating_params;

typedef struct rm_matmul_args {
    const rm_weight * w;
    int64_t           mat;        /* which matrix of a 3-D tensor (expert index); 0 for 2-D */
    const float *     x;          /* n_tok rows of w->ne[0] floats, x_stride floats apart */
    int64_t           x_stride;
    int32_t           n_tok;
    float *           y;          /* n_tok rows of w->ne[1] floats, y_stride floats apart */
    int64_t           y_stride;
    int32_t           accumulate; /* y += W x instead of y = W x */
} rm_matmul_args;

/* One product of a batch (matmul_many): y = W x as `a` says, then, when res is set, y += R x on
 * the first n_res of its n_tok rows, R being matrix a.mat of res (W's shape). Row by row this is
 * the same arithmetic as a matmul followed by an accumulating one. */
typedef struct rm_mm_item {
    rm_matmul_args    a;
    const rm_weight * res;
    int32_t           n_res;
} rm_mm_item;

typedef struct rm_attn_args {
    const float * q;              /* n_tok rows of n_head*head_dim */
    const float * k_cache;        /* n_ctx rows of n_head_kv*head_dim: this layer's cache */
    const float * v_cache;        /* n_ctx rows of n_head_kv*head_dim_v */
    float *       out;            /* n_tok rows of n_head*head_dim_v */
    int32_t       n_tok;
    int32_t       pos0;           /* position of the first token; token t sees positions [0, pos0 + t] */
    int32_t       n_head, n_head_kv, head_dim;
    int32_t       window;         /* > 0: token t sees only the last `window` of those positions */
    const rm_weight * sinks;      /* NULL, or F32 ne = {n_head}: a logit per head that joins each
                                     softmax and takes its share of the weight, with no value */
    int32_t       ring;           /* > 0: the cache is a ring of `ring` rows, position p in row p % ring
                                     (a sliding layer's; rm_kv_ring_rows); 0: position p in row p */
    int32_t       type_k, type_v; /* the caches' element types (RM_TYPE_F32: the float rows above; others,
                                     rows of rm_kv_row_bytes: the CPU backend only) */
    float *       scratch;        /* host scratch for the CPU attention, scratch_floats of them (at least
                                     rm_cpu_attn_scratch_floats for this layer's shape); NULL: the CPU backend
                                     takes its own */
    float         scale;          /* the logits are q.k times this; 0: 1 / sqrt(head_dim) */
    int32_t       head_dim_v;     /* the values' head width (MiMo's are narrower than the keys'); 0: head_dim */
    int64_t       scratch_floats;
    int32_t       v_in_k;         /* 1: a kv head's values are the first head_dim_v floats of its keys (MLA's
                                     latents: v_cache and type_v unused); the CPU backend only */
} rm_attn_args;

/* The host scratch the CPU attention of n_threads threads takes (rm_attn_args.scratch), in floats,
 * for layers of at most n_head query heads and n_head_kv kv heads of at most head_dim floats (keys
 * or values) over a cache of n_ctx positions: each thread's tile of K and V as floats and a
 * segment's output sums, and the partial sums of a decode split over segments of positions. */
int64_t rm_cpu_attn_scratch_floats(int32_t n_threads, int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                   int32_t n_ctx);

/* Positions of K and V the CPU attention reads as one tile (flash attention's order; ops.c). */
#define RM_ATTN_TILE 64

/* One sequence's part of a step of multi-head latent attention (rm_mla_args). */
typedef struct rm_mla_seq {
    const void *  cache;          /* its latents of this layer: rows of kv_lora_rank + n_rot, of rm_mla_args' type */
    int32_t       row0, n, pos;   /* its rows of q and out; the position of its first token */
} rm_mla_seq;

/* Multi-head latent attention's core (mla.c has the math): each sequence's tokens attend, causally,
 * to its cached latents. Head h's scores are q_nope . Kb_h c_j + q_rope . k_rope,j, its output Vb_h
 * (sum_j w_j c_j). A backend may run either form (absorbed or expanded) for any sequence: they
 * differ only in the order of float sums; the CPU runs a sequence of several tokens expanded and
 * runs of one token absorbed together. */
typedef struct rm_mla_args {
    const rm_weight * wk_b;       /* n_head matrices Kb_h^T: kv_lora_rank rows of head_dim - n_rot */
    const rm_weight * wv_b;       /* n_head matrices Vb_h: head_dim_v rows of kv_lora_rank */
    const float *     q;          /* rows of n_head * head_dim, RoPE applied to each head's last n_rot */
    float *           qlat;       /* scratch: rows of n_head * (kv_lora_rank + n_rot) */
    float *           olat;       /* scratch: rows of n_head * kv_lora_rank */
    float *           out;        /* rows of n_head * head_dim_v */
    const rm_mla_seq * seqs_host; /* n_seqs sequences, runs of one token together (rm_batch_eval's order) */
    int32_t           n_seqs;
    int32_t           n_head, head_dim, n_rot, kv_lora_rank, head_dim_v, n_ctx;
    float             scale;
    float *           thread_host;/* the CPU's scratch: rm_mla_thread_floats per thread of its pool */
    int32_t           type;       /* the latents' type: RM_TYPE_F32 (every backend), or another cache type
                                     (the CPU's, rows of rm_kv_row_bytes: read a block of rows at a time as floats) */
    uint64_t          row_bytes;  /* bytes of one cached latent row (with sparse attention, the indexer's key too) */
    /* DeepSeek sparse attention: a token that sees more than top_k positions attends to the top_k of
     * its row of sel_host (rm_dsa_args) only; 0: every token to all it sees. The CPU reads each
     * token's positions' latents (lat_bytes of a row) into gather_host (rm_dsa_gather_floats) first. */
    int32_t           top_k;
    const int32_t *   sel_host;   /* rows of top_k, one per token row of q */
    uint64_t          lat_bytes;  /* bytes of a row's latent (kv_lora_rank + n_rot) */
    float *           gather_host;
} rm_mla_args;

/* DeepSeek sparse attention's lightning indexer: for each token of the step's sequences that sees
 * more than top_k positions, the top_k positions j with the best score sum_h w_h relu(q_h . k_j)
 * (k_j: the indexer's key cached in position j's row; ties to the earlier position), ascending, into
 * its row of sel_host. Rows of tokens that see at most top_k positions are left as they are. */
typedef struct rm_dsa_args {
    const float *      q;         /* rows of n_head * head_dim: the indexer's queries, RoPE applied */
    const float *      w;         /* rows of n_head: the heads' weights (scaled as the model wants) */
    const rm_mla_seq * seqs_host; /* the step's sequences: their caches, rows and positions */
    int32_t            n_seqs;
    int32_t            n_head, head_dim, top_k;
    int32_t            type;      /* the cache's type */
    uint64_t           row_bytes; /* bytes of a cached row */
    uint64_t           key_off;   /* bytes into a row where the indexer's key starts (a block boundary) */
    int32_t            n_ctx;
    int32_t *          sel_host;  /* out: rows of top_k, one per token row */
    float *            scratch_host;   /* rm_dsa_host_floats less rm_dsa_gather_floats */
} rm_dsa_args;

/* QSA's indexer (qwen4exp): which blocks of `ratio` consecutive positions each token's attention
 * keeps. A token at position p sees the nb = (p + 1) / ratio complete blocks b < nb (the positions
 * after them, its tail, it always keeps). Block b's key is K_b = rope(rmsnorm(mean of the raw keys
 * of its positions) * k_norm) at its first position b * ratio; its score for the token is
 * sum_h relu(q_h . K_b) / sqrt(head_dim). A token with nb > top_k keeps its top_k best blocks (ties:
 * the earlier), ascending, in its row of sel_host; rows of tokens with nb <= top_k (every block
 * kept) are left as they are. */
typedef struct rm_qsa_args {
    const float *     q;          /* n_tok rows of n_head * head_dim: the queries, normed and RoPE'd */
    const float *     keys;       /* the sequence's raw keys (before their norm), position j in row j of head_dim */
    const rm_weight * k_norm;     /* F32, ne = {head_dim} */
    int32_t           n_tok, pos0;/* the tokens are at positions pos0 .. pos0 + n_tok - 1 */
    int32_t           n_head, head_dim, n_rot;
    int32_t           ratio, top_k;
    float             eps, rope_base;
    int32_t           neox;
    int32_t *         sel_host;   /* out: n_tok rows of top_k block indices */
    float *           scratch_host;   /* rm_qsa_host_floats */
} rm_qsa_args;

/* Floats of the CPU's QSA scratch (cpu/qsa.c) for blocks of at least ratio positions over n_ctx:
 * the blocks' keys, and per thread each block's score and a copy the selection reorders. */
uint64_t rm_qsa_host_floats(int32_t head_dim, int32_t ratio, int32_t n_ctx, int32_t n_threads);

/* One sequence's part of a step of PLE's conv (rm_ple_conv_args). */
typedef struct rm_ple_conv_seq {
    float * state;                /* its conv state of this layer: (kernel - 1) * dilation rows of width, oldest
                                     first (zeros: none yet) */
    int32_t row0, n;              /* its rows of the step */
} rm_ple_conv_seq;

/* PLE's dilated causal depthwise conv (qwen4exp; layers/ple.c): for each sequence's rows t,
 * out[t] += silu(sum_j w[j] x[t - (kernel - 1 - j) * dilation]) per channel, the positions before
 * the step read from the sequence's state, which then holds its last (kernel - 1) * dilation rows
 * of x. A token's floats do not depend on how its sequence was cut into steps. */
typedef struct rm_ple_conv_args {
    const rm_weight * conv1d;     /* F32, ne = {kernel, width}: channel c's taps, oldest first */
    const float *     x;          /* n_tok rows of width */
    float *           out;        /* n_tok rows of width */
    const rm_ple_conv_seq * seqs_host;
    int32_t           n_seqs;
    int64_t           width;
    int32_t           kernel, dilation;
} rm_ple_conv_args;

/* DeepSeek-V4's compressor (transformers' DeepseekV4HCACompressor and DeepseekV4CSACompressor, and
 * the CSA indexer's own): n_win windows of ratio positions, each into one entry of head_dim.
 * Per window w and dim d, over its slots j: entry[d] = sum_j softmax_j(z)[j] c_j[d], with the slots
 * the window's ratio rows (kv's, gate's + ape's columns from off, off = head_dim with overlap, else
 * 0) and, with overlap (CSA), before them the previous window's ratio rows' first head_dim columns
 * (gate + ape's first head_dim; the window before the first from prev_kv/prev_gate, none when NULL);
 * then entry = rmsnorm(entry) * norm, its last n_rot dims turned by RoPE (interleaved pairs) at
 * position pos0 + w * ratio. */
typedef struct rm_compress_args {
    float *           out;        /* n_win rows of head_dim */
    const float *     kv;         /* n_win * ratio rows of width: the kv projection */
    const float *     gate;       /* the same of the gate projection */
    const float *     prev_kv;    /* overlap: ratio rows of width, the window before the first; NULL: none */
    const float *     prev_gate;
    const rm_weight * ape;        /* F32, ne = {width, ratio}: a gate bias per slot */
    const rm_weight * norm;       /* F32, ne = {head_dim} */
    int32_t           n_win, ratio, head_dim;
    int32_t           overlap;    /* 1: width = 2 * head_dim, two series (CSA); 0: width = head_dim (HCA) */
    int32_t           n_rot, pos0;
    float             rope_base, eps;
    const struct rm_rope_yarn * yarn; /* the RoPE with YaRN (rope_base unread); NULL: plain */
} rm_compress_args;

/* DeepSeek-V4's lightning indexer in a CSA layer (transformers' DeepseekV4Indexer): a token at
 * position p sees the nb = (p + 1) / ratio entries s < nb of the indexer's compressed keys; its score
 * of entry s is sum_h (w_h / sqrt(n_head)) relu(q_h . k_s) / sqrt(head_dim). Into its row of
 * sel_host: with nb > top_k its top_k best entries (ties: the earlier), else all nb, ascending, the
 * row's rest -1. */
typedef struct rm_csa_args {
    const float * q;              /* n_tok rows of n_head * head_dim: the queries, RoPE applied */
    const float * w;              /* n_tok rows of n_head: the heads' weights (weights_proj, unscaled) */
    const float * keys;           /* rows of head_dim: the compressed keys, entry s in row s */
    int32_t       n_tok, pos0;    /* the tokens are at positions pos0 .. pos0 + n_tok - 1 */
    int32_t       n_head, head_dim, ratio, top_k;
    int32_t *     sel_host;       /* out: n_tok rows of top_k */
    float *       scratch_host;   /* rm_csa_host_floats */
} rm_csa_args;

/* Floats of the CPU's CSA scratch (cpu/csa.c): per thread the scores of n_ctx / ratio entries and a
 * copy the selection reorders. */
uint64_t rm_csa_host_floats(int32_t ratio, int32_t n_ctx, int32_t n_threads);

/* DeepSeek-V4's attention core (transformers' DeepseekV4Attention between its projections): one
 * key head that is also the value. A token at position p attends, with each of n_head heads, to the
 * positions j of its window (p - n_swa < j <= p; position j's row in kv is j % n_ring) and to the
 * compressed entries it sees (s < (p + 1) / ratio: all of them, or those of its row of sel, -1
 * ending it), logits q_h . k * scale and a sink logit per head that takes a share but adds nothing;
 * out_h = sum softmax * k, then with n_rot > 0 its last n_rot dims turned back by RoPE (interleaved
 * pairs, base rope_base) at the token's position: the keys' own turn undone on what they gave. */
typedef struct rm_dsv4_attn_args {
    float *         out;          /* n_tok rows of n_head * head_dim */
    const float *   q;            /* n_tok rows of n_head * head_dim */
    const float *   kv;           /* n_ring rows of head_dim: position j in row j % n_ring (n_ring >= n_swa + n_tok - 1) */
    int32_t         n_ring;
    const float *   entries;      /* rows of head_dim, entry s in row s; NULL: none (a sliding-only layer) */
    int32_t         ratio;
    const int32_t * sel;          /* host, n_tok rows of top_k (csa_select's); NULL: every entry the token sees */
    int32_t         top_k;
    const float *   sinks;        /* n_head */
    int32_t         n_tok, pos0, n_head, head_dim, n_swa;
    float           scale;
    float *         scratch_host; /* rm_dsv4_attn_host_floats */
    int32_t         n_rot;        /* 0: no turn back */
    float           rope_base;
    const struct rm_rope_yarn * yarn; /* the turn with YaRN (rope_base unread); NULL: plain */
} rm_dsv4_attn_args;

/* Floats of the CPU's scratch for it (cpu/dsv4_attn.c): per thread one head's logits over a window
 * and the entries a token at n_ctx - 1 sees. */
uint64_t rm_dsv4_attn_host_floats(int32_t n_swa, int32_t ratio, int32_t n_ctx, int32_t n_threads);

/* A Gated DeltaNet value head's state between calls, on every backend alike (a state saved from
 * one loads on another): S0 (d_k x d_v, row-major), the state at the start of the chunk of
 * RM_GDN_CHUNK positions being filled, then that chunk's rows so far: their keys (ne = {d_k, C}),
 * their u (ne = {d_v, C}) and cumulative log-decays (C). All zeros is the empty state.
 * cpu/gdn.h has the math. */
#define RM_GDN_CHUNK 64
static inline int64_t rm_gdn_state_floats(int32_t d_k, int32_t d_v) {
    return (int64_t) d_k * d_v + (int64_t) RM_GDN_CHUNK * (d_k + d_v + 1);
}
/* Floats of the CPU delta rule's scratch per value head. */
static inline int64_t rm_gdn_chunk_scratch(int32_t d_k, int32_t d_v) {
    (void) d_k;
    return d_v;
}

/* One sequence's part of a step of a Gated DeltaNet layer (rm_gdn_args). */
typedef struct rm_gdn_seq {
    float * conv_state;           /* its conv state of this layer: d_conv - 1 rows of conv_dim */
    float * ssm_state;            /* its delta-rule states of this layer: n_v heads of rm_gdn_state_floats */
    int32_t row0, n, pos;         /* its rows of the step; the position of its first token */
} rm_gdn_seq;

/* The middle of a Gated DeltaNet layer (deltanet.c has the math; the projections before and after
 * are matmuls): from the projected rows, the gates (beta = sigmoid(b), g = -exp(A_log) softplus(a
 * + dt_bias)), the causal conv over each sequence's conv state (SiLU after), unit q and k per key
 * head (q scaled by 1/sqrt(d_k)), the gated delta rule of each value head over each sequence's
 * state, in chunks aligned to positions (cpu/gdn.h: a token's floats do not depend on how its
 * sequence was cut into steps), and the gated RMSNorm: core = rmsnorm(o) * norm * silu(z), or
 * * sigmoid(z) with gate_sigmoid (qwen4exp's output_gate_type sigmoid). */
typedef struct rm_gdn_args {
    const rm_weight * conv1d;     /* ssm_conv1d: conv_dim rows of d_conv taps (F32 or F16) */
    const rm_weight * a;          /* ssm_a: n_v floats, -exp(A_log) */
    const rm_weight * dt_bias;    /* ssm_dt: n_v floats */
    const rm_weight * norm;       /* ssm_norm: d_v floats */
    const float *     mixed;      /* n_tok rows of conv_dim: q, k, v as projected */
    const float *     z;          /* n_tok rows of d_inner (n_v * d_v): the output gate */
    const float *     ba;         /* n_tok rows of 2 * n_v: b and a as projected */
    float *           conv_out;   /* scratch: n_tok rows of conv_dim */
    float *           g, * beta;  /* scratch: n_tok rows of n_v */
    float *           core;       /* n_tok rows of d_inner: the output */
    float *           conv_w;     /* scratch: conv_dim * d_conv floats (the filters as floats) */
    float *           chunk;      /* scratch: n_v of rm_gdn_chunk_scratch */
    const rm_gdn_seq * seqs_host;
    int32_t           n_seqs, n_tok;
    int32_t           n_k, n_v, d_k, d_v, d_conv;
    int32_t           fused_ba;   /* ba holds, per key head, its n_v / n_k b's then its a's; else all b's, then all a's */
    int32_t           tiled;      /* value head v reads key head v % n_k, else v / (n_v / n_k) */
    float             eps;        /* the gated norm's */
    int32_t           gate_sigmoid; /* the gated norm's gate: sigmoid(z), else silu(z) */
} rm_gdn_args;

/* Floats of the CPU's MLA scratch per thread (rm_mla_args.thread_host; cpu/mla.c): a head's
 * up-projections as floats, its expanded keys and values, the scores of a block of queries, and a
 * block's partial sum; 0 without MLA. */
uint64_t rm_mla_thread_floats(const rm_hparams * hp, int32_t n_ctx);

/* Floats of the CPU's sparse attention scratch (cpu/dsa.c): first the gathered latents of one token
 * (rm_dsa_gather_floats: min(index_top_k, n_ctx) latents as F32, the widest rows), then the
 * indexer's scores and each thread's keys; 0 without sparse attention. */
uint64_t rm_dsa_host_floats(const rm_hparams * hp, int32_t n_ctx, int32_t n_threads);
uint64_t rm_dsa_gather_floats(const rm_hparams * hp, int32_t n_ctx);

/* RoPE with YaRN's context extension (rm_rope_yarn_of, yarn.c): frequency i blends the
 * interpolated (inv_freq * freq_scale) and the original one (inv_freq) by a ramp over the dims
 * [corr_lo, corr_hi], and cos and sin are scaled by mscale. freq_scale 1 is plain RoPE. */
typedef struct rm_rope_yarn {
    float base;
    float freq_scale;             /* 1 / factor */
    float corr_lo, corr_hi;       /* dims below corr_lo keep their frequency, above corr_hi are interpolated */
    float mscale;
} rm_rope_yarn;

/* The clamped SwiGLU of gpt-oss's experts: g = min(g, limit) sigmoid(alpha min(g, limit)) *
 * (clamp(u, -limit, limit) + 1). llama.cpp hard-codes alpha 1.702 and limit 7 for gpt-oss. */
#define RM_SWIGLU_OAI_ALPHA 1.702f
#define RM_SWIGLU_OAI_LIMIT 7.0f
/* swiglu_clamp's alpha for DeepSeek-V4's clamped SwiGLU (transformers' DeepseekV4MLP and Experts):
 * g = silu(min(g, limit)) * clamp(u, -limit, limit), without gpt-oss's + 1 */
#define RM_SWIGLU_DSV4_ALPHA (-1.0f)

/* The routed experts of one MoE block: out[i] += sum over token i's slots of weight * f_e(xn[i]),
 * with f_e the expert's base, plus its residual on the slots marked residual. The slots routed to
 * expert e are exp_pairs[e * cap .. e * cap + exp_n[e]), residual slots first; slot j is
 * (token j / n_expert_used, choice j % n_expert_used). */
typedef struct rm_moe_args {
    const rm_layer * L;
    int32_t          layer;
    int32_t          n_tok, n_expert, n_expert_used;
    int64_t          n_embd, n_ff;
    const float *    xn;          /* n_tok rows of n_embd */
    float *          out;         /* n_tok rows of n_embd */
    const rm_route * routes_host; /* n_tok * n_expert_used */
    const int32_t *  exp_n_host;  /* n_expert */
    const int32_t *  exp_pairs_host;
    int64_t          cap;
} rm_moe_args;

/* A backend's operations: one static const table per backend (cpu/ops.c, standin.c,
 * cuda/backend.cu); the model code calls be->ops->op(be, ...). To add an op: its field here with
 * its contract, its function in each of the three tables, and a case in
 * native/tests/test_backend_ops.c against the CPU backend. */
typedef struct rm_backend_ops {
    const char * name;            /* "cpu", "standin", "cuda" */

    /* memory: alloc returns zeroed memory or NULL (error recorded) */
    void *    (*alloc)(rm_backend * be, uint64_t bytes);
    void      (*release)(rm_backend * be, void * p);
    void      (*upload)(rm_backend * be, void * dst, const void * src_host, uint64_t bytes);
    void      (*download)(rm_backend * be, void * dst_host, const void * src, uint64_t bytes);
    void      (*copy)(rm_backend * be, void * dst, const void * src, uint64_t bytes);
    void      (*zero)(rm_backend * be, void * dst, uint64_t bytes);
    rm_status (*status)(rm_backend * be);

    /* y = W x for n_tok tokens (each weight row is read once per batch). */
    void (*matmul)(rm_backend * be, const rm_matmul_args * a);
    /* Independent products in one dispatch (no item reads another's output); NULL: the backend
     * has no batched form and moe.c calls matmul per product. */
    void (*matmul_many)(rm_backend * be, const rm_mm_item * items, int32_t n);
    /* Causal attention over the cache for n_tok consecutive tokens. */
    void (*attention)(rm_backend * be, const rm_attn_args * a);

    /* y = x / rms(x) * w over n_rows rows of n (y may be x); w is F32, ne = {n}, or NULL: no weight */
    void (*rmsnorm)(rm_backend * be, float * y, const float * x, const rm_weight * w, int64_t n_rows,
                    int64_t n, float eps);
    /* rotary embedding in place on n_tok rows of n_head*head_dim at positions pos0.. */
    void (*rope)(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                 int32_t pos0, float base, int neox);
    void (*add)(rm_backend * be, float * y, const float * x, int64_t n);                        /* y += x */
    void (*add_bias)(rm_backend * be, float * y, const rm_weight * b, int64_t n_rows, int64_t n);
    /* y[i] += sigmoid(gate[i]) * x[i] for n_rows rows of n */
    void (*add_gated)(rm_backend * be, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n);
    void (*swiglu)(rm_backend * be, float * g, const float * u, int64_t n);                     /* g = silu(g) u */
    /* rope with YaRN (rm_rope_yarn), in place on n_tok rows of n_head*head_dim at positions pos0.. */
    void (*rope_yarn)(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                      int32_t pos0, const rm_rope_yarn * y, int neox);
    /* a clamped SwiGLU over n floats, g = f(g, u) (rm_swiglu_clamp_ref): gpt-oss's (alpha > 0,
     * RM_SWIGLU_OAI_*), the limited one (alpha 0: Step-3.5's) or DeepSeek-V4's (RM_SWIGLU_DSV4_ALPHA) */
    void (*swiglu_clamp)(rm_backend * be, float * g, const float * u, int64_t n, float alpha, float limit);
    /* dst[j] = src[rows[j]], j < n (rows of width floats) */
    void (*gather_rows)(rm_backend * be, float * dst, const float * src, const int32_t * rows_host, int32_t n,
                        int64_t width);
    /* dst[rows[j]] += scale[j] * src[j], j < n; rows may repeat */
    void (*scatter_add)(rm_backend * be, float * dst, const float * src, const int32_t * rows_host,
                        const float * scale_host, int32_t n, int64_t width);
    /* softmax over n_expert logits per token, the top k (ties: the lower index), renormalised
     * when norm; into out_host (n_tok * k entries; residual cleared) */
    void (*route)(rm_backend * be, const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm,
                  rm_route * out_host);
    /* The DeepSeek/GLM router (rm_gating_params) over n_tok rows of n_expert (<= 512) logits;
     * bias (F32, n_expert) or NULL counts for the choice only; into out_host as route does. */
    void (*route_gated)(rm_backend * be, const float * logits, const rm_weight * bias, const rm_gating_params * g,
                        int32_t n_tok, int32_t n_expert, int32_t k, rm_route * out_host);
    /* Multi-head latent attention's core (rm_mla_args). */
    void (*mla_attention)(rm_backend * be, const rm_mla_args * a);
    /* DeepSeek sparse attention's pick of positions (rm_dsa_args); NULL: the backend runs no sparse
     * attention (a session of such a model is refused). */
    void (*dsa_select)(rm_backend * be, const rm_dsa_args * a);
    /* QSA's pick of key blocks (rm_qsa_args); NULL: the backend runs no QSA attention (a session of
     * such a model is refused). */
    void (*qsa_select)(rm_backend * be, const rm_qsa_args * a);
    /* DeepSeek-V4's attention core (rm_dsv4_attn_args); NULL: the backend has none (the CPU's only). */
    void (*dsv4_attention)(rm_backend * be, const rm_dsv4_attn_args * a);
    /* DeepSeek-V4's CSA pick of compressed entries (rm_csa_args); NULL: the backend has none (the CPU's only). */
    void (*csa_select)(rm_backend * be, const rm_csa_args * a);
    /* DeepSeek-V4's compressed entries (rm_compress_args); NULL: the backend has none (the CPU's only). */
    void (*compress)(rm_backend * be, const rm_compress_args * a);
    /* y = (x - mean(x)) / sqrt(var(x) + eps) * w + b over n_rows rows of n (y may be x); w and b F32,
     * ne = {n}; NULL: the backend has none (only sparse attention's indexer uses it). */
    void (*layernorm)(rm_backend * be, float * y, const float * x, const rm_weight * w, const rm_weight * b,
                      int64_t n_rows, int64_t n, float eps);
    /* The middle of a Gated DeltaNet layer (rm_gdn_args). */
    void (*gdn)(rm_backend * be, const rm_gdn_args * a);
    /* dst row r (width floats) = src row r, for n_rows rows dst_stride and src_stride floats apart */
    void (*copy_rows)(rm_backend * be, float * dst, int64_t dst_stride, const float * src, int64_t src_stride,
                      int64_t width, int64_t n_rows);
    /* y[i] = y[i] / (1 + exp(-gate[i / width])), i < n * width: an output gate, one per element (width
     * 1) or one per row of width floats (Step-3.5's, a head's) */
    void (*mul_sigmoid)(rm_backend * be, float * y, const float * gate, int64_t n, int64_t width);
    /* g = gelu(g) * u, GELU's tanh form (rm_gelu), over n_rows rows of width floats, g's rows g_stride
     * and u's u_stride floats apart (u may be the second half of g's rows) */
    void (*geglu)(rm_backend * be, float * g, int64_t g_stride, const float * u, int64_t u_stride, int64_t width,
                  int64_t n_rows);
    /* x[i] *= f, i < n */
    void (*scale)(rm_backend * be, float * x, int64_t n, float f);
    /* rope with its frequencies divided per pair of dims: pair i turns by pos * base^(-2i/n_rot) /
     * freq_div[i] (F32, ne = {n_rot / 2}; llama.cpp's rope_freqs, 1e30 for a pair that does not turn) */
    void (*rope_div)(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                     int32_t pos0, float base, int neox, const rm_weight * freq_div);
    /* Hyper-connections (qwen4exp; layers/hyper.c composes them with matmuls). NULL: the backend has
     * none (the CPU's and the stand-in's only). rmsnorm_groups: y = x / rms(x) * w_g over n_rows rows of
     * n, row r scaled by the n floats of w from (r % n_groups) * n on (F32, n * n_groups of them) (y may be x) */
    void (*rmsnorm_groups)(rm_backend * be, float * y, const float * x, const rm_weight * w, int64_t n_rows,
                           int64_t n, int64_t n_groups, float eps);
    /* x[i] = silu(f x[i]), i < n */
    void (*silu)(rm_backend * be, float * x, int64_t n, float f);
    /* the streams' gated mean: y[t] = (1/hc) sum_c sigmoid(gate[t][c]) x[t][c], for n_tok tokens of hc
     * rows of n (x and gate rows of hc * n floats, y rows of n) */
    void (*hc_mix)(rm_backend * be, float * y, const float * x, const float * gate, int64_t n_tok, int64_t hc,
                   int64_t n);
    /* a block's output into the streams: h[t][c] += 2 sigmoid(inj[t][c] / hc) b[t] (h rows of hc * n,
     * b rows of n, inj rows of hc) */
    void (*hc_add)(rm_backend * be, float * h, const float * b, const float * inj, int64_t n_tok, int64_t hc,
                   int64_t n);
    /* PLE (qwen4exp; layers/ple.c composes them with matmuls and rmsnorm_groups). NULL: the backend has
     * none (the CPU's only). ple_gate: per token and stream c of hc (rows of n), g = (key_c . query_c) /
     * sqrt(n), out_c = sigmoid(sign(g) sqrt(max(|g|, 1e-6))) value (key, query and out rows of hc * n,
     * value rows of n) */
    void (*ple_gate)(rm_backend * be, float * out, const float * key, const float * query, const float * value,
                     int64_t n_tok, int64_t hc, int64_t n);
    /* PLE's dilated conv (rm_ple_conv_args) */
    void (*ple_conv)(rm_backend * be, const rm_ple_conv_args * a);
    /* DeepSeek-V4's manifold-constrained hyper-connections (layers/mhc.c composes them with rmsnorm and
     * matmul; transformers' DeepseekV4HyperConnection and DeepseekV4HyperHead). NULL: the backend has
     * none (the CPU's only). mhc_weights: per token, its n_mix logits l (the streams RMS-normed as one
     * row, times fn) into the weights, in place. A block's (n_mix = (2 + hc) * hc, scale ne = {3}):
     * pre_c = sigmoid(l_c s_0 + b_c) + eps, post_c = 2 sigmoid(l_{hc+c} s_1 + b_{hc+c}), and comb, hc
     * rows j (the input stream) of hc columns k (the output stream): each row softmax(l s_2 + b) + eps,
     * then the columns normalised, then iters - 1 rounds of rows and columns (each x / (sum + eps):
     * Sinkhorn-Knopp). The output's (n_mix = hc, scale ne = {1}): pre alone. base F32, ne = {n_mix}. */
    void (*mhc_weights)(rm_backend * be, float * mix, const rm_weight * scale, const rm_weight * base, int64_t n_tok,
                        int64_t hc, int64_t n_mix, int32_t iters, float eps);
    /* the streams' weighted sum: y[t] = sum_c pre[t][c] h[t][c] (h rows of hc * n, y rows of n, mix rows
     * of n_mix whose first hc are pre) */
    void (*mhc_collapse)(rm_backend * be, float * y, const float * h, const float * mix, int64_t n_mix,
                         int64_t n_tok, int64_t hc, int64_t n);
    /* a block's output b (rows of n) into the streams, in place: h[t][k] = post[t][k] b[t] +
     * sum_j comb[t][j][k] h[t][j] (mix rows of (2 + hc) * hc as mhc_weights leaves them; hc <= 64) */
    void (*mhc_expand)(rm_backend * be, float * h, const float * b, const float * mix, int64_t n_tok, int64_t hc,
                       int64_t n);
    /* The routed experts (rm_moe_args); NULL: moe.c composes them from the ops above. */
    void (*moe_experts)(rm_backend * be, const rm_moe_args * a);

    void (*free)(rm_backend * be);
} rm_backend_ops;

struct rm_backend {
    const rm_backend_ops * ops;
    void *                 ctx;   /* the backend's own state */

    /* What crossed the bus and how the split went; a device backend counts, the CPU leaves 0. */
    rm_backend_stats stats;
    /* per layer, of the last token: host time on residual / host experts, and device time on the
     * experts' base work (microseconds; 0 when the layer had no host work). n_layer entries,
     * owned by the backend; NULL on the CPU backend. */
    float * layer_cpu_us;
    float * layer_gpu_us;
};

/* The CPU backend, running on the pool's threads; scratch sized for n_batch tokens of at most
 * max_in inputs and n_ctx positions. */
rm_backend * rm_backend_cpu_new(rm_pool * pool, int32_t n_batch, int64_t max_in, int32_t n_ctx);
/* The model's repacked weights (repack.h), which the CPU backend then reads in place of the
 * file's bytes of those matrices; NULL: none. */
struct rm_dev_weights;
void rm_backend_cpu_use_repacked(rm_backend * be, const struct rm_dev_weights * repacked);

/* Host reference math shared by the CPU backend and the model code. */
void rm_rmsnorm(float * y, const float * x, const float * w, int64_t n, float eps);
void rm_rope(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, float base, int neox);
/* rm_rope with pair i's frequency divided by div[i] (NULL: 1) */
/* Pair i of every one of n_head heads (head_dim apart) turned by the angle whose cosine and sine
 * are c and s: elements (i, i + n_rot / 2) with neox, else (2i, 2i + 1). RoPE's and YaRN's step. */
void rm_rope_turn(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t i, float c, float s, int neox);
void rm_rope_div(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, float base, int neox,
                 const float * div);
/* GELU, tanh form (transformers' gelu_pytorch_tanh) */
static inline float rm_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
void rm_softmax(float * x, int64_t n);
/* yarn.c: YaRN's parameters from the hyperparameters, as llama.cpp and transformers compute them,
 * and the host math of the two new ops */
void rm_rope_yarn_of(const rm_hparams * hp, rm_rope_yarn * out);
void rm_rope_yarn_row(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, const rm_rope_yarn * y,
                      int neox);
/* alpha > 0, gpt-oss's: g' = min(g, limit), u' = clamp(u, -limit, limit), g = g' sigmoid(alpha g') (u' + 1);
 * alpha 0, the limited SwiGLU (Step-3.5's): g = min(silu(g), limit) clamp(u, -limit, limit);
 * alpha < 0, DeepSeek-V4's: g = silu(min(g, limit)) clamp(u, -limit, limit) */
void rm_swiglu_clamp_ref(float * g, const float * u, int64_t n, float alpha, float limit);
/* softmax of n scores joined by a sink logit that takes a share but is not returned */
void rm_softmax_sink(float * x, int64_t n, float sink);

/* Independent products in one dispatch where the backend has matmul_many, else one after another. */
static inline void rm_matmul_many(rm_backend * be, const rm_mm_item * items, int32_t n) {
    if (be->ops->matmul_many) {
        be->ops->matmul_many(be, items, n);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        be->ops->matmul(be, &items[i].a);
    }
}

/* The backend's buffers among p[0 .. n) handed back (NULL ones passed over). */
static inline void rm_release_each(rm_backend * be, void * const * p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (p[i]) be->ops->release(be, p[i]);
    }
}

/* y (c rows of b's ne[0] floats) += row e of the per-expert bias b (ne = {width, n_expert}), a
 * gpt-oss layer's; nothing when the layer has none. A bias is added once, after base + residual.
 * The MoE block (moe.c) and the split's host side (split.c) both add them this way. */
static inline void rm_expert_bias(rm_backend * be, const rm_weight * b, int32_t e, float * y, int32_t c) {
    if (!b->data || c <= 0) {
        return;
    }
    rm_weight row = *b;
    row.data = b->data + (uint64_t) e * b->row_bytes;
    row.ne[1] = 1;
    be->ops->add_bias(be, y, &row, c, b->ne[0]);
}

/* The experts' activation g = act(g, u) over n floats: gpt-oss's clamped SwiGLU, Gemma 4's GELU or
 * Step-3.5's or DeepSeek-V4's limited SwiGLU where the layer has it. */
static inline void rm_expert_act(rm_backend * be, const rm_layer * L, float * g, const float * u, int64_t n) {
    if (L->kind & RM_LAYER_GELU) {
        be->ops->geglu(be, g, n, u, n, n, 1);
    } else if (L->kind & RM_LAYER_SWIGLU_CLAMP) {
        be->ops->swiglu_clamp(be, g, u, n, RM_SWIGLU_OAI_ALPHA, RM_SWIGLU_OAI_LIMIT);
    } else if (L->ffn_limit > 0.0f) {
        be->ops->swiglu_clamp(be, g, u, n, L->ffn_limit_alpha, L->ffn_limit);
    } else {
        be->ops->swiglu(be, g, u, n);
    }
}
void rm_route_token(const float * logits, int32_t n_expert, int32_t k, int norm, rm_route * out);

#endif
