/* session.h - internal: a session's KV cache, scratch buffers and MoE bookkeeping. */
#ifndef RM_SESSION_H
#define RM_SESSION_H

#include <time.h>

#include "backend.h"
#include "model.h"
#include "sizes.h"

struct rm_session {
    rm_model *   m;
    rm_backend * be;
    int32_t      n_ctx, n_batch, n_past;

    /* the profile (rm_session_profile): [0] decode, [1] prefill; prof_t the time the current
     * part began, prof_kind which of the two the current batch is */
    double       prof_us[2][RM_PROF_COUNT];
    uint64_t     prof_tokens[2];
    double       prof_t;
    int          prof_kind;

    /* backend memory (see backend.h); rows of the widths given */
    float * k_cache;              /* n_layer * n_ctx rows of n_head_kv*head_dim */
    float * v_cache;
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

    /* host memory */
    float *    embd;              /* embedded tokens before upload, rows of n_embd */
    rm_route * routes;            /* rows of n_expert_used */
    int32_t *  exp_n;             /* n_expert */
    int32_t *  exp_pairs;         /* n_expert rows of n_batch * n_expert_used */
    int32_t *  rows;              /* n_batch * n_expert_used: token rows of a gather/scatter */
    float *    scale;             /* n_batch * n_expert_used: weights of a scatter */
    float *    cal_host;          /* 2 rows of n_embd: calibration outputs brought to the host */

    /* statistics since the last reset of the counters */
    uint64_t * stat_active;       /* n_layer * n_expert: activations */
    uint64_t * stat_residual;     /* n_layer * n_expert: of which with residual */
    rm_route * last_routes;       /* n_layer rows of n_expert_used: the last token's routing */

    /* residual policy (see rm_residual_policy) */
    int32_t    policy;            /* rm_policy_kind */
    uint64_t   rng;
    float      gate_power, gain;
    float *    expert_score;      /* n_layer * n_expert */
    float *    layer_score;       /* n_layer */
    float *    layer_budget;      /* n_layer */
    float *    threshold;         /* n_layer, the controllers' state */
    uint8_t *  layer_mask;        /* n_layer */

    /* residual_budget = "auto" (rm_auto_budget); on when auto_on */
    int32_t        auto_on;
    rm_auto_budget auto_ctl;
    float *        budget_ref;    /* n_layer: layer_budget as the policy set it */

    /* calibration: mean |f_{B+R}(x) - f_B(x)| per (layer, expert) under policy ALL */
    int32_t    calibrating;
    double *   cal_delta;         /* n_layer * n_expert: sum of |delta| */
    uint64_t * cal_n;             /* n_layer * n_expert */
    rm_route * route_log;         /* n_ctx * n_layer * n_expert_used, allocated when calibrating */
};

static inline double rm_prof_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec * 1e-3;
}

/* Ends the current part of the profile (its time since the last mark goes to `part`). Inline:
 * the forward pass (session.c) and the MoE block it calls (moe.c) both mark parts, and moe.c
 * must not call back into session.c. */
static inline void rm_prof_mark(rm_session * s, int part) {
    const double t = rm_prof_now_us();
    s->prof_us[s->prof_kind][part] += t - s->prof_t;
    s->prof_t = t;
}

#endif
