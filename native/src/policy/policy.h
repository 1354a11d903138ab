/* policy.h - internal: the residual policy of a session (rm_residual_policy in rapidmoe.h): which
 * activated (token, layer, expert) slots get their expert's residual, the per-layer controllers
 * that keep each layer on its budget, and the auto budget controller above them. */
#ifndef RM_POLICY_H
#define RM_POLICY_H

#include "rapidmoe.h"

/* The controllers' state is a function of the sequence's own tokens: threshold[p][l] is layer l's
 * threshold before the token at cache position p, row 0 the calibrated start. Deciding position p
 * reads row p and writes row p + 1, so a sequence decides the same whatever else shares its batch,
 * however its prompt was cut into steps, and whatever the session evaluated before: a truncated or
 * reset cache rewinds its controllers with it. RANDOM and LAYER draw from a hash of (seed,
 * position, layer, slot), not from a stream, for the same reason. */
typedef struct rm_policy_state {
    int32_t    kind;              /* rm_policy_kind */
    uint64_t   seed;              /* RANDOM and LAYER draws */
    float      gate_power, gain;
    int32_t    n_pos;             /* rows of threshold: n_ctx + 1 */
    float *    expert_score;      /* n_layer * n_expert */
    float *    layer_score;       /* n_layer */
    float *    layer_budget;      /* n_layer: each layer's target share of its slots */
    float *    threshold;         /* ne = {n_layer, n_ctx + 1}: the controllers' state by position, in
                                   * log-score units (NULL without a sidecar) */
    uint8_t *  layer_mask;        /* n_layer: 0 = never a residual in that layer */

    /* residual_budget = "auto" (rm_auto_budget): on when auto_on */
    int32_t        auto_on;
    rm_auto_budget auto_ctl;
    float *        budget_ref;    /* n_layer: layer_budget as rm_session_set_policy set it */

    /* rm_session_set_residual_mask: when mask is set it decides instead of the kind */
    uint8_t *      mask;          /* n_pos * n_layer * n_expert_used */
    int64_t        mask_pos;      /* n_pos */
} rm_policy_state;

/* Allocates the arrays for n_layer layers of n_expert experts and a cache of n_ctx positions, kind
 * ALL with a sidecar, else NONE; 0 when out of memory (then rm_policy_state_free releases what was
 * allocated). */
int  rm_policy_state_init(rm_policy_state * p, int32_t n_layer, int32_t n_expert, int32_t n_ctx, int has_residual);
void rm_policy_state_free(rm_policy_state * p);

/* Marks routes[i * n_expert_used + k].residual for the n tokens routed in layer il, token by token
 * at their cache positions (each layer's controller stepped after each token, so a batch decides
 * as decode would). */
void rm_policy_select(rm_session * s, int il, int32_t n);

/* After a decoded token: one step of the auto budget controller on the backend's measured
 * per-layer times, when it is on. */
void rm_policy_after_token(rm_session * s);

/* The auto controller's budget now; -1 when it is off (rm_backend_stats.auto_budget). */
float rm_policy_auto_budget(const rm_policy_state * p);

#endif
