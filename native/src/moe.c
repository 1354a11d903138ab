/* moe.c - the MoE block: routing as llama.cpp and transformers compute it, the choice of which
 * (token, expert) slots get their residual, and the experts themselves.
 *
 * Tokens are grouped by expert, so each expert's weights are read once per batch. For a slot that
 * gets its residual the expert computes x.B + x.R for each of its three matrices (never B + R):
 * the residual rows are the first rows of the group, and the residual products run over just them. */
#include "moe.h"

#include <math.h>
#include <string.h>

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* softmax over the router logits, top-k, optional renormalisation (gguf-facts §3 pipeline). */
static void route(const rm_session * s, const float * logits, rm_route * r) {
    const rm_hparams * hp = &s->m->hp;
    float probs[512];
    memcpy(probs, logits, sizeof(float) * (size_t) hp->n_expert);
    rm_softmax(probs, hp->n_expert);
    uint8_t taken[512] = {0};
    float sum = 0.0f;
    for (int32_t k = 0; k < hp->n_expert_used; k++) {
        int32_t best = -1;
        for (int32_t e = 0; e < hp->n_expert; e++) {
            if (!taken[e] && (best < 0 || probs[e] > probs[best])) {
                best = e;
            }
        }
        taken[best] = 1;
        r[k].expert = best;
        r[k].prob = probs[best];
        r[k].weight = probs[best];
        r[k].residual = 0;
        sum += probs[best];
    }
    if (hp->norm_topk) {
        const float inv = 1.0f / (sum > 6.103515625e-5f ? sum : 6.103515625e-5f);
        for (int32_t k = 0; k < hp->n_expert_used; k++) {
            r[k].weight *= inv;
        }
    }
}

static double next_unit(uint64_t * state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (double) ((x * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}

/* log(score) of one slot under the session's policy (rm_residual_policy in rapidmoe.h). */
static float log_score(rm_session * s, int il, const rm_route * r) {
    const float g = r->weight > 1e-30f ? r->weight : 1e-30f;
    const float se = s->expert_score[(int64_t) il * s->m->hp.n_expert + r->expert];
    const float sl = s->layer_score[il];
    switch (s->policy) {
        case RM_POLICY_UMIA:   return s->gate_power * logf(g) + logf(se) + logf(sl);
        case RM_POLICY_GATE:   return logf(g);
        case RM_POLICY_EXPERT: return logf(se);
        case RM_POLICY_LAYER:  return logf(sl) + (float) next_unit(&s->rng);   /* random within a layer */
        case RM_POLICY_RANDOM: return logf((float) (1.0 - next_unit(&s->rng)));
        default:               return 0.0f;
    }
}

/* Decides, slot by slot, which activated experts get their residual. Tokens are taken in order
 * and the layer's controller is updated after each, so a batch decides as decode would. */
static void select_residuals(rm_session * s, int il, int32_t n) {
    const int32_t K = s->m->hp.n_expert_used;
    if (!s->m->residual || s->policy == RM_POLICY_NONE || !s->layer_mask[il]) {
        return;
    }
    if (s->policy == RM_POLICY_ALL) {
        for (int64_t j = 0; j < (int64_t) n * K; j++) {
            s->routes[j].residual = 1;
        }
        return;
    }
    const float target = s->layer_budget[il] * (float) K;
    for (int32_t i = 0; i < n; i++) {
        rm_route * r = s->routes + (int64_t) i * K;
        int32_t selected = 0;
        for (int32_t k = 0; k < K; k++) {
            r[k].residual = log_score(s, il, &r[k]) >= s->threshold[il];
            selected += r[k].residual;
        }
        s->threshold[il] += s->gain * ((float) selected - target);
    }
}

static void expert_matmul(rm_session * s, const rm_weight * w, int64_t e, const float * x, int64_t x_stride,
                          int32_t n, float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, e, x, x_stride, n, y, y_stride, accumulate};
    s->be->matmul(s->be, &a);
}

/* One expert over its c gathered rows in s->ex, the first c_res of which get the residual;
 * the results land in s->ed. */
static void run_expert(rm_session * s, const rm_layer * L, int32_t e, int32_t c, int32_t c_res) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp;
    if (s->calibrating && c_res > 0) {
        /* the base-only output of the residual rows, to measure what the residual changes */
        expert_matmul(s, &L->gate_exps, e, s->ex, E, c_res, s->eg, F, 0);
        expert_matmul(s, &L->up_exps, e, s->ex, E, c_res, s->eu, F, 0);
        for (int64_t j = 0; j < (int64_t) c_res * F; j++) {
            s->eg[j] = silu(s->eg[j]) * s->eu[j];
        }
        expert_matmul(s, &L->down_exps, e, s->eg, F, c_res, s->ecal, E, 0);
    }
    expert_matmul(s, &L->gate_exps, e, s->ex, E, c, s->eg, F, 0);
    expert_matmul(s, &L->up_exps, e, s->ex, E, c, s->eu, F, 0);
    if (c_res > 0) {
        expert_matmul(s, &L->gate_res, e, s->ex, E, c_res, s->eg, F, 1);
        expert_matmul(s, &L->up_res, e, s->ex, E, c_res, s->eu, F, 1);
    }
    for (int64_t j = 0; j < (int64_t) c * F; j++) {
        s->eg[j] = silu(s->eg[j]) * s->eu[j];
    }
    expert_matmul(s, &L->down_exps, e, s->eg, F, c, s->ed, E, 0);
    if (c_res > 0) {
        expert_matmul(s, &L->down_res, e, s->eg, F, c_res, s->ed, E, 1);
    }
}

static void shared_expert(rm_session * s, const rm_layer * L, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t E = hp->n_embd, S = hp->n_ff_shexp;
    expert_matmul(s, &L->gate_shexp, 0, s->xn, E, n, s->eg, S, 0);
    expert_matmul(s, &L->up_shexp, 0, s->xn, E, n, s->eu, S, 0);
    for (int64_t j = 0; j < (int64_t) n * S; j++) {
        s->eg[j] = silu(s->eg[j]) * s->eu[j];
    }
    expert_matmul(s, &L->down_shexp, 0, s->eg, S, n, s->ed, E, 0);
    const float * gw = (const float *) L->gate_inp_shexp.data;
    for (int32_t i = 0; i < n; i++) {
        float g = 0.0f;
        for (int64_t j = 0; j < E; j++) {
            g += gw[j] * s->xn[i * E + j];
        }
        g = 1.0f / (1.0f + expf(-g));
        for (int64_t j = 0; j < E; j++) {
            s->moe[i * E + j] += g * s->ed[i * E + j];
        }
    }
}

void rm_moe_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    const int64_t E = hp->n_embd;
    const int32_t K = hp->n_expert_used, X = hp->n_expert;

    for (int32_t i = 0; i < n; i++) {
        rm_rmsnorm(s->xn + i * E, s->x + i * E, (const float *) L->ffn_norm.data, E, hp->rms_eps);
    }
    rm_matmul_args ra = {&L->router, 0, s->xn, E, n, s->router, X, 0};
    s->be->matmul(s->be, &ra);
    for (int32_t i = 0; i < n; i++) {
        route(s, s->router + (int64_t) i * X, s->routes + (int64_t) i * K);
    }
    select_residuals(s, il, n);

    /* group the slots by expert, residual slots first within each group */
    memset(s->exp_n, 0, sizeof(int32_t) * (size_t) X);
    const int64_t cap = (int64_t) s->n_batch * K;
    for (int pass = 1; pass >= 0; pass--) {
        for (int64_t j = 0; j < (int64_t) n * K; j++) {
            const rm_route * r = &s->routes[j];
            if (r->residual == pass) {
                s->exp_pairs[(int64_t) r->expert * cap + s->exp_n[r->expert]++] = (int32_t) j;
            }
        }
    }
    memset(s->moe, 0, sizeof(float) * (size_t) (n * E));
    uint64_t * active = s->stat_active + (int64_t) il * X;
    uint64_t * resid = s->stat_residual + (int64_t) il * X;
    for (int32_t e = 0; e < X; e++) {
        const int32_t c = s->exp_n[e];
        if (c == 0) {
            continue;
        }
        const int32_t * pairs = s->exp_pairs + (int64_t) e * cap;
        int32_t c_res = 0;
        for (int32_t j = 0; j < c; j++) {
            memcpy(s->ex + j * E, s->xn + (pairs[j] / K) * E, sizeof(float) * (size_t) E);
            c_res += s->routes[pairs[j]].residual;
        }
        run_expert(s, L, e, c, c_res);
        if (s->calibrating) {
            for (int32_t j = 0; j < c_res; j++) {
                double d2 = 0.0;
                for (int64_t d = 0; d < E; d++) {
                    const double diff = (double) s->ed[j * E + d] - s->ecal[j * E + d];
                    d2 += diff * diff;
                }
                s->cal_delta[(int64_t) il * X + e] += sqrt(d2);
            }
            s->cal_n[(int64_t) il * X + e] += (uint64_t) c_res;
        }
        for (int32_t j = 0; j < c; j++) {
            const float w = s->routes[pairs[j]].weight;
            float * dst = s->moe + (pairs[j] / K) * E;
            const float * src = s->ed + j * E;
            for (int64_t d = 0; d < E; d++) {
                dst[d] += w * src[d];
            }
        }
        active[e] += (uint64_t) c;
        resid[e] += (uint64_t) c_res;
    }
    memcpy(s->last_routes + (int64_t) il * K, s->routes + (int64_t) (n - 1) * K, sizeof(rm_route) * (size_t) K);
    if (m->arch->shared_expert == RM_SHEXP_GATED) {
        shared_expert(s, L, n);
    }
    for (int64_t j = 0; j < (int64_t) n * E; j++) {
        s->x[j] += s->moe[j];
    }
}
