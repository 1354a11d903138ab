/* session.h - internal: a session's KV cache, scratch buffers and MoE bookkeeping; the policy
 * (policy.c), profile (profile.c) and statistics (stats.c) keep their state here. */
#ifndef RM_SESSION_H
#define RM_SESSION_H

#include "backend.h"
#include "model.h"
#include "policy.h"
#include "profile.h"
#include "sizes.h"

/* One sequence's rows in a batch: the session whose KV cache and residual policy they use, and
 * the position of the first (rows row0 .. row0 + n - 1 are its positions pos ..). */
typedef struct rm_seq_run {
    struct rm_session * s;
    int32_t             row0, n, pos;
} rm_seq_run;

struct rm_session {
    rm_model *   m;
    rm_backend * be;
    int32_t      n_ctx, n_batch, n_past;

    /* the sequences of the batch in the forward pass now (set by rm_session_forward on the session
     * whose scratch runs it; each run's rows use its own session's cache and policy) */
    const rm_seq_run * runs;
    int32_t            n_runs;

    rm_profile   prof;            /* where evaluation time goes (profile.c) */

    /* backend memory (see backend.h); rows of the widths given */
    float * k_cache;              /* n_layer * n_ctx rows of n_head_kv*head_dim elements of type_k (bytes: */
    float * v_cache;              /* k_row_bytes each), and of type_v (v_row_bytes); F32 unless asked */
    int32_t  type_k, type_v;
    uint64_t k_row_bytes, v_row_bytes;
    float *  attn_scratch;        /* host: rm_attn_args.scratch, attn_scratch_floats of them */
    int64_t  attn_scratch_floats;
    float * x;                    /* residual stream, rows of n_embd */
    float * xn;                   /* normalised input of a block, rows of n_embd */
    float * q, * k, * v;          /* projections, rows of n_head*head_dim / n_head_kv*head_dim */
    float * attn;                 /* attention output, rows of n_head*head_dim */
    float * moe;                  /* MoE output accumulator, rows of n_embd */
    float * router;               /* router logits, rows of n_expert */
    float * ex;                   /* gathered expert inputs, rows of n_embd */
    float * eg, * eu;             /* gate / up outputs, rows of max(n_ff_exp, n_ff_shexp) */
    float * ed;                   /* down outputs, rows of n_embd */
    float * ecal;                 /* base-only expert outputs while calibrating, rows of n_embd */
    float * shgate;               /* shared-expert gate logits, n_batch */
    float * logits;               /* RM_LOGIT_ROWS rows of n_vocab */
    float * mla;                  /* multi-head latent attention's scratch (mla.c); NULL without MLA */
    float * hc;                   /* hyper-connections' streams and scratch (hyper.c); NULL without them */

    /* host memory */
    float *    embd;              /* embedded tokens before upload, rows of n_embd */
    struct rm_kv_place * kv_at;   /* n_layer: where each layer's cache lies (rm_attention_kv_layout) */
    float *    mla_host;          /* MLA's per-thread scratch (rm_mla_thread_floats each); NULL without MLA */
    float *    dsa_host;          /* sparse attention's scratch (rm_dsa_host_floats); NULL without it */
    int32_t *  dsa_sel;           /* n_batch rows of min(index_top_k, n_ctx): each token's picked positions */
    rm_route * routes;            /* rows of n_expert_used */
    int32_t *  exp_n;             /* n_expert */
    int32_t *  exp_pairs;         /* n_expert rows of n_batch * n_expert_used */
    int32_t *  rows;              /* n_batch * n_expert_used: token rows of a gather/scatter */
    float *    scale;             /* n_batch * n_expert_used: weights of a scatter */
    float *    cal_host;          /* 2 rows of n_embd: calibration outputs brought to the host */

    /* a streamed model's experts (xcache.h); all NULL otherwise */
    struct rm_weight * xv;        /* n_expert * 2 * RM_XC_MATS: the window's experts in the cache (moe.c) */
    int32_t *  exp_n_all;         /* n_expert: exp_n of the whole batch while a window runs part of it */
    float *    pred;              /* n_batch rows of n_expert: the next layer's router logits, predicted */
    int32_t *  pred_experts;      /* n_expert: the experts predicted for the next layer */
    rm_status  xc_status;         /* the first failed read of this forward pass (the rest of it is skipped) */
    float *    xc_res_us;         /* n_layer, the last evaluation's: time waiting on residual reads, and */
    float *    xc_layer_us;       /* the rest of each layer's time (the auto budget's measure, policy.c) */

    /* statistics since the last reset of the counters (stats.c) */
    uint64_t * stat_active;       /* n_layer * n_expert: activations */
    uint64_t * stat_residual;     /* n_layer * n_expert: of which with residual */
    rm_route * last_routes;       /* n_layer rows of n_expert_used: the last token's routing */

    rm_policy_state policy;       /* which slots get their residual (policy.c) */

    struct rm_hybrid * hy;        /* hybrid models: recurrent states and scratch (deltanet.h); else NULL */
    struct rm_qsa *    qsa;       /* QSA sparse attention's indexer keys and scratch (qsa.h); else NULL */
    struct rm_ple *    ple;       /* PLE's scratch (ple.h; its state is in hy's conv state); else NULL */
    struct rm_dsv4 *   dsv4;      /* DeepSeek-V4's compressors' state and the layer's scratch (dsv4.h); else NULL */
    const int32_t *    tokens;    /* host: the step's token ids while a forward pass runs (hash routing) */

    /* calibration: mean |f_{B+R}(x) - f_B(x)| per (layer, expert) under policy ALL */
    int32_t    calibrating;
    double *   cal_delta;         /* n_layer * n_expert: sum of |delta| */
    uint64_t * cal_n;             /* n_layer * n_expert */
    rm_route * route_log;         /* n_ctx * n_layer * n_expert_used, allocated when calibrating */

    /* importance (rm_session_set_importance): sums of x^2 per input column of each expert's
     * matrices, over the rows routed to it; all NULL when not collecting */
    double *   imp_in;            /* n_layer * n_expert * n_embd: gate and up inputs */
    double *   imp_ff;            /* n_layer * n_expert * n_ff_exp: down inputs */
    uint64_t * imp_n;             /* n_layer * n_expert: rows summed */
    float *    imp_host;          /* one row of max(n_embd, n_ff_exp), brought to the host */
};

/* Runs n <= n_batch tokens of the sequences in runs (ordered by row, covering rows 0 .. n - 1)
 * through every layer on s's scratch, and advances each run's session. Logits: the rows
 * out_rows[0 .. n_out) (ascending; NULL: the last n_out rows) into out, n_vocab floats each. A run
 * of another session has at most its own n_batch rows and a context no larger than s's (its MLA
 * attention uses s's per-thread scratch). */
void rm_session_forward(rm_session * s, const rm_seq_run * runs, int32_t n_runs, const int32_t * tokens, int32_t n,
                        const int32_t * out_rows, int32_t n_out, float * out);

#endif
