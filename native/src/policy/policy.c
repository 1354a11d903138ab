/* policy.c - the residual policy: slot scores, the per-layer threshold controllers, the auto
 * budget controller, and the calls that set them (rm_residual_policy in rapidmoe.h).
 *
 * Each activated slot gets log(score) by its policy kind; it gets its residual when that is at
 * least its layer's threshold, and after each token the threshold moves by gain * (selected -
 * target), target = layer_budget[l] * n_expert_used. With the auto budget on, the targets follow
 * one budget that an AIMD rule moves on the split's measured times. */
#include "policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"
#include "status.h"

/* ---- kinds and scores --------------------------------------------------------------------- */

static const char * const KIND_NAMES[RM_POLICY_COUNT] = {
    [RM_POLICY_NONE] = "none",     [RM_POLICY_ALL] = "all",       [RM_POLICY_UMIA] = "umia",
    [RM_POLICY_RANDOM] = "random", [RM_POLICY_GATE] = "gate",     [RM_POLICY_EXPERT] = "expert",
    [RM_POLICY_LAYER] = "layer",
};

const char * rm_policy_kind_name(int32_t kind) {
    return kind >= 0 && kind < RM_POLICY_COUNT ? KIND_NAMES[kind] : NULL;
}

/* Kinds that select by score and so need a budget per layer (all but NONE and ALL). */
static int kind_is_scored(int32_t kind) { return kind >= RM_POLICY_UMIA; }

/* A uniform draw in [0, 1) for slot k of layer il at cache position pos: a hash of the four, so
 * that the draw belongs to the slot and not to the order the session met its slots in. */
static double slot_unit(uint64_t seed, int64_t pos, int il, int k) {
    /* splitmix64's finaliser over the four, each spread by its own odd constant */
    uint64_t z = seed + (uint64_t) pos * 0x9E3779B97F4A7C15ULL + (uint64_t) il * 0xD1B54A32D192ED03ULL +
                 (uint64_t) k * 0x8CB92BA72F3D8DD7ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double) (z >> 11) * (1.0 / 9007199254740992.0);
}

/* log(score) of one slot: gate its router weight, se its expert's score, sl its layer's. RANDOM
 * and LAYER use the slot's draw u. */
static float log_score(int32_t kind, float gate_power, float gate, float se, float sl, double u) {
    const float g = gate > 1e-30f ? gate : 1e-30f;
    switch (kind) {
        case RM_POLICY_UMIA:   return gate_power * logf(g) + logf(se) + logf(sl);
        case RM_POLICY_GATE:   return logf(g);
        case RM_POLICY_EXPERT: return logf(se);
        case RM_POLICY_LAYER:  return logf(sl) + (float) u;   /* random within a layer */
        case RM_POLICY_RANDOM: return logf((float) (1.0 - u));
        default:               return 0.0f;
    }
}

rm_status rm_policy_log_scores(int32_t kind, float gate_power, const float * expert_score, int32_t n_expert,
                               float layer_score, const int32_t * experts, const float * gates, int64_t n,
                               float * out) {
    rm_clear_error();
    if (kind != RM_POLICY_UMIA && kind != RM_POLICY_GATE && kind != RM_POLICY_EXPERT) {
        return rm_fail(RM_E_INVALID_ARG, "rm_policy_log_scores: kind %d is not UMIA, GATE or EXPERT", kind);
    }
    if (n < 0 || n_expert <= 0 || (n > 0 && (!expert_score || !experts || !gates || !out))) {
        return rm_fail(RM_E_INVALID_ARG, "rm_policy_log_scores: NULL argument, n = %lld or n_expert = %d",
                       (long long) n, n_expert);
    }
    for (int64_t i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= n_expert) {
            return rm_fail(RM_E_INVALID_ARG, "rm_policy_log_scores: experts[%lld] = %d is outside [0, %d)",
                           (long long) i, experts[i], n_expert);
        }
        out[i] = log_score(kind, gate_power, gates[i], expert_score[experts[i]], layer_score, 0.0);
    }
    return RM_OK;
}

/* ---- the session's state ------------------------------------------------------------------ */

int rm_policy_state_init(rm_policy_state * p, int32_t n_layer, int32_t n_expert, int32_t n_ctx, int has_residual) {
    const size_t NL = n_layer > 0 ? (size_t) n_layer : 1, NX = NL * (n_expert > 0 ? (size_t) n_expert : 1);
    memset(p, 0, sizeof(*p));
    p->n_pos = (n_ctx > 0 ? n_ctx : 0) + 1;
    p->expert_score = calloc(NX, sizeof(float));
    p->layer_score = calloc(NL, sizeof(float));
    p->layer_budget = calloc(NL, sizeof(float));
    p->budget_ref = calloc(NL, sizeof(float));
    p->threshold = has_residual ? calloc((size_t) p->n_pos * NL, sizeof(float)) : NULL;
    p->layer_mask = calloc(NL, 1);
    if (!p->expert_score || !p->layer_score || !p->layer_budget || !p->budget_ref || !p->layer_mask ||
        (has_residual && !p->threshold)) {
        return 0;
    }
    p->kind = has_residual ? RM_POLICY_ALL : RM_POLICY_NONE;
    memset(p->layer_mask, 1, NL);
    return 1;
}

void rm_policy_state_free(rm_policy_state * p) {
    free(p->expert_score);
    free(p->layer_score);
    free(p->layer_budget);
    free(p->budget_ref);
    free(p->threshold);
    free(p->layer_mask);
    free(p->mask);
    memset(p, 0, sizeof(*p));
}

/* ---- select ------------------------------------------------------------------------------- */

/* Marks the n tokens' slots at routes, the first at cache position pos0, with the policy p (of a
 * session of model m). */
static void select_rows(rm_policy_state * p, const rm_model * m, rm_route * routes, int il, int32_t n, int32_t pos0) {
    const int32_t K = m->hp.n_expert_used;
    if (m->residual && p->mask) {   /* a given selection, by cache position */
        const int64_t NL = m->hp.n_layer;
        for (int32_t i = 0; i < n; i++) {
            const int64_t pos = (int64_t) pos0 + i;
            for (int32_t k = 0; k < K; k++) {
                routes[(int64_t) i * K + k].residual = pos < p->mask_pos && p->mask[(pos * NL + il) * K + k];
            }
        }
        return;
    }
    if (!m->residual || p->kind == RM_POLICY_NONE || !p->layer_mask[il]) {
        return;
    }
    if (p->kind == RM_POLICY_ALL) {
        for (int64_t j = 0; j < (int64_t) n * K; j++) {
            routes[j].residual = 1;
        }
        return;
    }
    const float * se = p->expert_score + (int64_t) il * m->hp.n_expert;
    const float target = p->layer_budget[il] * (float) K;
    const int64_t NL = m->hp.n_layer;
    const int draws = p->kind == RM_POLICY_RANDOM || p->kind == RM_POLICY_LAYER;
    for (int32_t i = 0; i < n; i++) {
        const int64_t pos = (int64_t) pos0 + i;   /* < n_ctx, so row pos + 1 exists */
        const float thr = p->threshold[pos * NL + il];
        rm_route * r = routes + (int64_t) i * K;
        int32_t selected = 0;
        for (int32_t k = 0; k < K; k++) {
            const double u = draws ? slot_unit(p->seed, pos, il, k) : 0.0;
            const float score = log_score(p->kind, p->gate_power, r[k].weight, se[r[k].expert], p->layer_score[il], u);
            r[k].residual = score >= thr;
            selected += r[k].residual;
        }
        p->threshold[(pos + 1) * NL + il] = thr + p->gain * ((float) selected - target);
    }
}

/* Each sequence of the batch by its own session's policy. */
void rm_policy_select(rm_session * s, int il, int32_t n) {
    if (s->n_runs == 0) {
        select_rows(&s->policy, s->m, s->routes, il, n, s->n_past);
        return;
    }
    const int64_t K = s->m->hp.n_expert_used;
    for (int32_t r = 0; r < s->n_runs; r++) {
        const rm_seq_run * run = &s->runs[r];
        select_rows(&run->s->policy, s->m, s->routes + run->row0 * K, il, run->n, run->pos);
    }
}

/* ---- set ---------------------------------------------------------------------------------- */

static rm_status check_positive(const char * what, const float * v, int64_t n, float hi) {
    for (int64_t i = 0; v && i < n; i++) {
        if (!(v[i] > 0.0f) || !(v[i] <= hi)) {
            return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: %s[%lld] = %g is outside (0, %g]",
                           what, (long long) i, v[i], hi);
        }
    }
    return RM_OK;
}

rm_status rm_session_set_policy(rm_session * s, const rm_residual_policy * pol) {
    rm_clear_error();
    if (!s || !pol) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: NULL argument");
    }
    if (pol->struct_size != sizeof(rm_residual_policy)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: struct_size %u != %zu (mismatched header)",
                       pol->struct_size, sizeof(rm_residual_policy));
    }
    if (pol->kind < 0 || pol->kind >= RM_POLICY_COUNT) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: unknown policy kind %d", pol->kind);
    }
    if (pol->kind != RM_POLICY_NONE && !s->m->residual) {
        return rm_fail(RM_E_NO_RESIDUAL, "rm_session_set_policy: policy '%s' needs a residual sidecar, and the "
                       "model was loaded without one", rm_policy_kind_name(pol->kind));
    }
    const int64_t NL = s->m->hp.n_layer, X = s->m->hp.n_expert;
    const int scored = kind_is_scored(pol->kind);
    if (scored && !pol->layer_budget) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: policy %d needs layer_budget", pol->kind);
    }
    for (int64_t l = 0; scored && l < NL; l++) {
        if (!(pol->layer_budget[l] >= 0.0f && pol->layer_budget[l] <= 1.0f)) {
            return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: layer_budget[%lld] = %g is outside [0, 1]",
                           (long long) l, pol->layer_budget[l]);
        }
    }
    rm_status st;
    if ((st = check_positive("expert_score", pol->expert_score, NL * X, 1e30f)) != RM_OK ||
        (st = check_positive("layer_score", pol->layer_score, NL, 1e30f)) != RM_OK) {
        return st;
    }
    if (!isfinite(pol->gain) || pol->gain < 0.0f || !isfinite(pol->gate_power)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: gain %g / gate_power %g invalid", pol->gain,
                       pol->gate_power);
    }
    rm_policy_state * p = &s->policy;
    free(p->mask);
    p->mask = NULL;
    p->mask_pos = 0;
    p->kind = pol->kind;
    p->seed = pol->seed;
    p->gate_power = pol->gate_power;
    p->gain = pol->gain;
    for (int64_t i = 0; i < NL * X; i++) p->expert_score[i] = pol->expert_score ? pol->expert_score[i] : 1.0f;
    for (int64_t l = 0; l < NL; l++) {
        p->layer_score[l] = pol->layer_score ? pol->layer_score[l] : 1.0f;
        p->layer_budget[l] = pol->layer_budget ? pol->layer_budget[l] : 0.0f;
        p->layer_mask[l] = pol->layer_mask ? (pol->layer_mask[l] != 0) : 1;
    }
    /* the controllers restart: at position 0 and at every position up to the next token's, so the
     * next token starts from threshold0 whatever the cache holds, and so do earlier positions
     * should the cache be truncated */
    for (int64_t pos = 0; p->threshold && pos <= s->n_past; pos++) {
        for (int64_t l = 0; l < NL; l++) {
            p->threshold[pos * NL + l] = pol->threshold0 ? pol->threshold0[l] : 0.0f;
        }
    }
    memcpy(p->budget_ref, p->layer_budget, sizeof(float) * (size_t) NL);
    p->auto_on = 0;
    return RM_OK;
}

rm_status rm_session_set_residual_mask(rm_session * s, const uint8_t * mask, int64_t n_pos) {
    rm_clear_error();
    if (!s || n_pos < 0 || (n_pos > 0 && !mask)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_residual_mask: NULL argument or n_pos = %lld",
                       (long long) n_pos);
    }
    if (n_pos > 0 && !s->m->residual) {
        return rm_fail(RM_E_NO_RESIDUAL, "rm_session_set_residual_mask: the model was loaded without a "
                       "residual sidecar");
    }
    rm_policy_state * p = &s->policy;
    free(p->mask);
    p->mask = NULL;
    p->mask_pos = 0;
    if (!mask || n_pos == 0) {
        return RM_OK;
    }
    const size_t n = (size_t) n_pos * (size_t) s->m->hp.n_layer * (size_t) s->m->hp.n_expert_used;
    p->mask = malloc(n);
    if (!p->mask) {
        return rm_fail(RM_E_OOM, "rm_session_set_residual_mask: out of memory for %zu bytes", n);
    }
    memcpy(p->mask, mask, n);
    p->mask_pos = n_pos;
    return RM_OK;
}

/* ---- the auto budget ---------------------------------------------------------------------- */

static rm_status check_auto(const rm_auto_budget * c, const char * fn) {
    if (c->struct_size != sizeof(rm_auto_budget)) {
        return rm_fail(RM_E_INVALID_ARG, "%s: struct_size %u != %zu (mismatched header)", fn, c->struct_size,
                       sizeof(rm_auto_budget));
    }
    if (!(c->min_budget >= 0.0f && c->min_budget <= c->max_budget && c->max_budget <= 1.0f) ||
        !(c->budget >= 0.0f && c->budget <= 1.0f) || !(c->increase >= 0.0f && c->increase <= 1.0f) ||
        !(c->decrease > 0.0f && c->decrease < 1.0f) || !(c->margin >= 0.0f && c->margin < 1.0f) ||
        !(c->reference_budget > 0.0f && c->reference_budget <= 1.0f)) {
        return rm_fail(RM_E_INVALID_ARG,
                       "%s: need 0 <= min_budget (%g) <= max_budget (%g) <= 1, budget (%g) in [0, 1], increase (%g) "
                       "in [0, 1], decrease (%g) in (0, 1), margin (%g) in [0, 1), reference_budget (%g) in (0, 1]",
                       fn, c->min_budget, c->max_budget, c->budget, c->increase, c->decrease, c->margin,
                       c->reference_budget);
    }
    return RM_OK;
}

rm_status rm_auto_budget_step(rm_auto_budget * c, const float * host_us, const float * device_us, int32_t n_layer) {
    rm_clear_error();
    if (!c || (n_layer > 0 && (!host_us || !device_us)) || n_layer < 0) {
        return rm_fail(RM_E_INVALID_ARG, "rm_auto_budget_step: NULL argument or negative n_layer");
    }
    rm_status st = check_auto(c, "rm_auto_budget_step");
    if (st != RM_OK) {
        return st;
    }
    int stalled = 0, room = 1;
    for (int32_t l = 0; l < n_layer; l++) {
        if (!(host_us[l] > 0.0f)) {
            continue;   /* no host work in this layer: nothing to wait for */
        }
        if (host_us[l] > device_us[l]) {
            stalled = 1;
        }
        if (host_us[l] > (1.0f - c->margin) * device_us[l]) {
            room = 0;
        }
    }
    float b = c->budget;
    if (stalled) {
        b *= c->decrease;
    } else if (room) {
        b += c->increase;
    }
    c->budget = b < c->min_budget ? c->min_budget : b > c->max_budget ? c->max_budget : b;
    return RM_OK;
}

/* Each layer's target follows the budget: the policy's share scaled by budget / reference. */
static void apply_auto_budget(rm_policy_state * p, int32_t n_layer) {
    const float f = p->auto_ctl.budget / p->auto_ctl.reference_budget;
    for (int l = 0; l < n_layer; l++) {
        const float t = p->budget_ref[l] * f;
        p->layer_budget[l] = t < 1.0f ? t : 1.0f;
    }
}

/* After a decoded token, the auto budget's step: on a split, from the host's and the device's
 * time per layer; with the experts streamed from the disk, from each layer's wait on residual
 * reads against the rest of its time (the residuals read per token should fit in the token's
 * compute, as a split's host work fits under the device's). */
void rm_policy_after_token(rm_session * s) {
    if (!s->policy.auto_on) {
        return;
    }
    if (s->xc_res_us) {
        rm_auto_budget_step(&s->policy.auto_ctl, s->xc_res_us, s->xc_layer_us, s->m->hp.n_layer);
    } else if (s->be->layer_cpu_us) {
        rm_auto_budget_step(&s->policy.auto_ctl, s->be->layer_cpu_us, s->be->layer_gpu_us, s->m->hp.n_layer);
    } else {
        return;   /* a CPU backend holding every weight: no overlap to measure */
    }
    apply_auto_budget(&s->policy, s->m->hp.n_layer);
}

float rm_policy_auto_budget(const rm_policy_state * p) { return p->auto_on ? p->auto_ctl.budget : -1.0f; }

rm_status rm_session_set_auto_budget(rm_session * s, const rm_auto_budget * ctl) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_auto_budget: NULL session");
    }
    rm_policy_state * p = &s->policy;
    if (!ctl) {
        if (p->auto_on) {
            memcpy(p->layer_budget, p->budget_ref, sizeof(float) * (size_t) s->m->hp.n_layer);
        }
        p->auto_on = 0;
        return RM_OK;
    }
    rm_status st = check_auto(ctl, "rm_session_set_auto_budget");
    if (st != RM_OK) {
        return st;
    }
    if (!kind_is_scored(p->kind)) {
        return rm_fail(RM_E_NO_BUDGET, "rm_session_set_auto_budget: the policy '%s' has no budget to adjust; "
                       "set a scored policy first", rm_policy_kind_name(p->kind));
    }
    if (!p->auto_on) {
        memcpy(p->budget_ref, p->layer_budget, sizeof(float) * (size_t) s->m->hp.n_layer);
    }
    p->auto_ctl = *ctl;
    p->auto_on = 1;
    apply_auto_budget(p, s->m->hp.n_layer);
    return RM_OK;
}
