/* stats.c - a session's counters and records: activations and residual slots per expert, the
 * split's backend counters, the last token's routing, and calibration (its sums and route log). */
#include "stats.h"

#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "profile.h"
#include "session.h"
#include "status.h"

/* Into o's counters: the n tokens' slots at routes. */
static void count_rows(rm_session * o, const rm_route * routes, int il, int32_t n) {
    const int32_t K = o->m->hp.n_expert_used, X = o->m->hp.n_expert;
    uint64_t * active = o->stat_active + (int64_t) il * X;
    uint64_t * resid = o->stat_residual + (int64_t) il * X;
    for (int64_t j = 0; j < (int64_t) n * K; j++) {
        active[routes[j].expert]++;
        resid[routes[j].expert] += routes[j].residual;
    }
}

void rm_stats_count(rm_session * s, int il, int32_t n) {
    if (s->n_runs == 0) {
        count_rows(s, s->routes, il, n);
        return;
    }
    const int64_t K = s->m->hp.n_expert_used;
    for (int32_t r = 0; r < s->n_runs; r++) {   /* each sequence into its own session's counters */
        count_rows(s->runs[r].s, s->routes + s->runs[r].row0 * K, il, s->runs[r].n);
    }
}

void rm_stats_record_routes(rm_session * s, int il, int32_t n) {
    const int32_t K = s->m->hp.n_expert_used;
    if (s->n_runs > 1 || (s->n_runs == 1 && s->runs[0].s != s)) {   /* a batch of sequences: each session keeps its last row's (no calibration here) */
        for (int32_t r = 0; r < s->n_runs; r++) {
            const rm_seq_run * run = &s->runs[r];
            memcpy(run->s->last_routes + (int64_t) il * K, s->routes + (int64_t) (run->row0 + run->n - 1) * K,
                   sizeof(rm_route) * (size_t) K);
        }
        return;
    }
    memcpy(s->last_routes + (int64_t) il * K, s->routes + (int64_t) (n - 1) * K, sizeof(rm_route) * (size_t) K);
    if (s->route_log) {
        for (int32_t i = 0; i < n; i++) {
            rm_route * dst = s->route_log + ((int64_t) (s->n_past + i) * s->m->hp.n_layer + il) * K;
            memcpy(dst, s->routes + (int64_t) i * K, sizeof(rm_route) * (size_t) K);
        }
    }
}

rm_status rm_session_backend_stats(const rm_session * s, rm_backend_stats * out) {
    rm_clear_error();
    if (!s || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_backend_stats: NULL argument");
    }
    if (out->struct_size != sizeof(rm_backend_stats)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_backend_stats: struct_size %u != %zu (mismatched header)",
                       out->struct_size, sizeof(rm_backend_stats));
    }
    *out = s->be->stats;
    out->struct_size = sizeof(rm_backend_stats);
    out->auto_budget = rm_policy_auto_budget(&s->policy);
    return RM_OK;
}

rm_status rm_session_stats(const rm_session * s, uint64_t * active, uint64_t * residual, uint64_t cap) {
    rm_clear_error();
    if (!s || !active || !residual) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_stats: NULL argument");
    }
    const uint64_t n = (uint64_t) s->m->hp.n_layer * (uint64_t) s->m->hp.n_expert;
    if (cap < n) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_stats: buffers hold %llu entries, %llu needed",
                       (unsigned long long) cap, (unsigned long long) n);
    }
    memcpy(active, s->stat_active, sizeof(uint64_t) * n);
    memcpy(residual, s->stat_residual, sizeof(uint64_t) * n);
    return RM_OK;
}

rm_status rm_session_clear_stats(rm_session * s) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_clear_stats: NULL session");
    }
    const size_t n = (size_t) s->m->hp.n_layer * (size_t) s->m->hp.n_expert;
    memset(s->stat_active, 0, sizeof(uint64_t) * n);
    memset(s->stat_residual, 0, sizeof(uint64_t) * n);
    rm_prof_clear(s);
    rm_backend_stats * bs = &s->be->stats;
    char name[sizeof(bs->backend)];
    memcpy(name, bs->backend, sizeof(name));
    memset(bs, 0, sizeof(*bs));
    memcpy(bs->backend, name, sizeof(name));
    return RM_OK;
}

rm_status rm_session_last_routes(const rm_session * s, int32_t * experts, float * weights, uint8_t * residual,
                                 uint64_t cap) {
    rm_clear_error();
    if (!s || !experts || !weights || !residual) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_last_routes: NULL argument");
    }
    const uint64_t n = (uint64_t) s->m->hp.n_layer * (uint64_t) s->m->hp.n_expert_used;
    if (cap < n) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_last_routes: buffers hold %llu entries, %llu needed",
                       (unsigned long long) cap, (unsigned long long) n);
    }
    for (uint64_t i = 0; i < n; i++) {
        experts[i] = s->last_routes[i].expert;
        weights[i] = s->last_routes[i].weight;
        residual[i] = s->last_routes[i].residual;
    }
    return RM_OK;
}

/* ---- calibration -------------------------------------------------------------------------- */

rm_status rm_session_set_calibration(rm_session * s, int32_t on) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_calibration: NULL session");
    }
    if (on && !s->m->residual) {
        return rm_fail(RM_E_NO_RESIDUAL, "rm_session_set_calibration: the model was loaded without a residual sidecar");
    }
    if (on && s->be->ops->moe_experts) {
        return rm_fail(RM_E_NEEDS_CPU, "rm_session_set_calibration: calibration runs on the CPU backend; load the "
                       "model without a GPU to calibrate");
    }
    const size_t n = (size_t) s->m->hp.n_layer * (size_t) s->m->hp.n_expert;
    if (on) {
        memset(s->cal_delta, 0, sizeof(double) * n);
        memset(s->cal_n, 0, sizeof(uint64_t) * n);
        if (!s->route_log) {
            s->route_log = calloc((size_t) s->n_ctx * (size_t) s->m->hp.n_layer * (size_t) s->m->hp.n_expert_used,
                                  sizeof(rm_route));
            if (!s->route_log) {
                return rm_fail(RM_E_OOM, "rm_session_set_calibration: out of memory for the route log");
            }
        }
    } else {
        free(s->route_log);
        s->route_log = NULL;
    }
    s->calibrating = on != 0;
    return RM_OK;
}

rm_status rm_session_calibration(const rm_session * s, double * sum_delta, uint64_t * count, uint64_t cap) {
    rm_clear_error();
    if (!s || !sum_delta || !count) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_calibration: NULL argument");
    }
    const uint64_t n = (uint64_t) s->m->hp.n_layer * (uint64_t) s->m->hp.n_expert;
    if (cap < n) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_calibration: buffers hold %llu entries, %llu needed",
                       (unsigned long long) cap, (unsigned long long) n);
    }
    memcpy(sum_delta, s->cal_delta, sizeof(double) * n);
    memcpy(count, s->cal_n, sizeof(uint64_t) * n);
    return RM_OK;
}

/* ---- importance of the experts' input columns ---------------------------------------------- */

static void importance_free(rm_session * s) {
    free(s->imp_in), free(s->imp_ff), free(s->imp_n), free(s->imp_host);
    s->imp_in = NULL, s->imp_ff = NULL, s->imp_n = NULL, s->imp_host = NULL;
}

rm_status rm_session_set_importance(rm_session * s, int32_t on) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_importance: NULL session");
    }
    if (!on) {
        importance_free(s);
        return RM_OK;
    }
    if (s->be->ops->moe_experts) {
        return rm_fail(RM_E_NEEDS_CPU, "rm_session_set_importance: it runs on the CPU backend; load the model "
                       "without a GPU to collect importance");
    }
    const rm_hparams * hp = &s->m->hp;
    const size_t k = (size_t) hp->n_layer * (size_t) hp->n_expert;
    const size_t E = (size_t) hp->n_embd, F = (size_t) hp->n_ff_exp;
    importance_free(s);
    s->imp_in = calloc(k * E, sizeof(double));
    s->imp_ff = calloc(k * F, sizeof(double));
    s->imp_n = calloc(k, sizeof(uint64_t));
    s->imp_host = malloc(sizeof(float) * (E > F ? E : F));
    if (!s->imp_in || !s->imp_ff || !s->imp_n || !s->imp_host) {
        importance_free(s);
        return rm_fail(RM_E_OOM, "rm_session_set_importance: out of memory for %zu x (%zu + %zu) sums", k, E, F);
    }
    return RM_OK;
}

rm_status rm_session_importance(const rm_session * s, double * sum_in, uint64_t cap_in, double * sum_ff,
                                uint64_t cap_ff, uint64_t * count, uint64_t cap_count) {
    rm_clear_error();
    if (!s || !sum_in || !sum_ff || !count) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_importance: NULL argument");
    }
    if (!s->imp_in) {
        return rm_fail(RM_E_STATE, "rm_session_importance: the session is not collecting importance");
    }
    const rm_hparams * hp = &s->m->hp;
    const uint64_t k = (uint64_t) hp->n_layer * (uint64_t) hp->n_expert;
    const uint64_t n_in = k * (uint64_t) hp->n_embd, n_ff = k * (uint64_t) hp->n_ff_exp;
    if (cap_in < n_in || cap_ff < n_ff || cap_count < k) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_importance: buffers hold %llu, %llu and %llu entries; %llu, %llu "
                       "and %llu needed", (unsigned long long) cap_in, (unsigned long long) cap_ff,
                       (unsigned long long) cap_count, (unsigned long long) n_in, (unsigned long long) n_ff,
                       (unsigned long long) k);
    }
    memcpy(sum_in, s->imp_in, sizeof(double) * n_in);
    memcpy(sum_ff, s->imp_ff, sizeof(double) * n_ff);
    memcpy(count, s->imp_n, sizeof(uint64_t) * k);
    return RM_OK;
}

rm_status rm_session_route_log(const rm_session * s, int32_t * experts, float * weights, uint64_t cap) {
    rm_clear_error();
    if (!s || !experts || !weights) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_route_log: NULL argument");
    }
    if (!s->route_log) {
        return rm_fail(RM_E_NOT_CALIBRATING, "rm_session_route_log: routes are recorded only while calibrating");
    }
    const uint64_t n = (uint64_t) s->n_past * (uint64_t) s->m->hp.n_layer * (uint64_t) s->m->hp.n_expert_used;
    if (cap < n) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_route_log: buffers hold %llu entries, %llu needed",
                       (unsigned long long) cap, (unsigned long long) n);
    }
    for (uint64_t i = 0; i < n; i++) {
        experts[i] = s->route_log[i].expert;
        weights[i] = s->route_log[i].weight;
    }
    return RM_OK;
}
