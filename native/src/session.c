/* session.c - sessions and the forward pass.
 *
 * One generic decoder forward for every architecture in arch.c, written top to bottom like the
 * model it computes. A batch of n tokens goes through each layer together (prefill); decode is the
 * same path with n = 1. The MoE block is in moe.c. */
#include "session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "status.h"
#include "types.h"

static void * xalloc(size_t n, int * failed) {
    void * p = calloc(n ? n : 1, 1);
    if (!p) {
        *failed = 1;
    }
    return p;
}

static void session_free_buffers(rm_session * s) {
    void * bufs[] = {s->k_cache, s->v_cache, s->x, s->xn, s->q, s->k, s->v, s->attn, s->moe, s->router,
                     s->routes, s->exp_n, s->exp_pairs, s->ex, s->eg, s->eu, s->ed, s->stat_active,
                     s->stat_residual, s->last_routes, s->expert_score, s->layer_score, s->layer_budget,
                     s->threshold, s->layer_mask, s->ecal, s->cal_delta, s->cal_n};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        free(bufs[i]);
    }
    rm_backend_cpu_free(s->be);
}

rm_status rm_session_new(rm_model * m, const rm_session_params * params, rm_session ** out) {
    rm_clear_error();
    if (!m || !out) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_new: model and out must not be NULL");
    }
    *out = NULL;
    rm_session_params dflt = {sizeof(rm_session_params), 0, 0};
    if (!params) {
        params = &dflt;
    } else if (params->struct_size != sizeof(rm_session_params)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_new: params.struct_size %u != %zu (mismatched header)",
                       params->struct_size, sizeof(rm_session_params));
    }
    const rm_hparams * hp = &m->hp;
    rm_session * s = calloc(1, sizeof(*s));
    if (!s) {
        return rm_fail(RM_E_OOM, "rm_session_new: out of memory");
    }
    s->m = m;
    s->n_ctx = params->n_ctx > 0 ? params->n_ctx : hp->n_ctx_train;
    s->n_batch = params->n_batch > 0 ? params->n_batch : 256;
    if (s->n_batch > s->n_ctx) {
        s->n_batch = s->n_ctx;
    }
    const size_t B = (size_t) s->n_batch, E = (size_t) hp->n_embd;
    const size_t Q = (size_t) hp->n_head * hp->head_dim, KV = (size_t) hp->n_head_kv * hp->head_dim;
    const size_t F = (size_t) (hp->n_ff_exp > hp->n_ff_shexp ? hp->n_ff_exp : hp->n_ff_shexp);
    const size_t X = (size_t) hp->n_expert, K = (size_t) hp->n_expert_used;
    int failed = 0;
    s->k_cache = xalloc(sizeof(float) * (size_t) hp->n_layer * (size_t) s->n_ctx * KV, &failed);
    s->v_cache = xalloc(sizeof(float) * (size_t) hp->n_layer * (size_t) s->n_ctx * KV, &failed);
    s->x = xalloc(sizeof(float) * B * E, &failed);
    s->xn = xalloc(sizeof(float) * B * E, &failed);
    s->q = xalloc(sizeof(float) * B * Q, &failed);
    s->k = xalloc(sizeof(float) * B * KV, &failed);
    s->v = xalloc(sizeof(float) * B * KV, &failed);
    s->attn = xalloc(sizeof(float) * B * Q, &failed);
    s->moe = xalloc(sizeof(float) * B * E, &failed);
    s->router = xalloc(sizeof(float) * B * X, &failed);
    s->routes = xalloc(sizeof(rm_route) * B * K, &failed);
    s->exp_n = xalloc(sizeof(int32_t) * X, &failed);
    s->exp_pairs = xalloc(sizeof(int32_t) * X * B * K, &failed);
    s->ex = xalloc(sizeof(float) * B * E, &failed);
    s->eg = xalloc(sizeof(float) * B * F, &failed);
    s->eu = xalloc(sizeof(float) * B * F, &failed);
    s->ed = xalloc(sizeof(float) * B * E, &failed);
    s->stat_active = xalloc(sizeof(uint64_t) * (size_t) hp->n_layer * X, &failed);
    s->stat_residual = xalloc(sizeof(uint64_t) * (size_t) hp->n_layer * X, &failed);
    const size_t NL = (size_t) hp->n_layer;
    s->last_routes = xalloc(sizeof(rm_route) * NL * K, &failed);
    s->expert_score = xalloc(sizeof(float) * NL * X, &failed);
    s->layer_score = xalloc(sizeof(float) * NL, &failed);
    s->layer_budget = xalloc(sizeof(float) * NL, &failed);
    s->threshold = xalloc(sizeof(float) * NL, &failed);
    s->layer_mask = xalloc(NL, &failed);
    s->ecal = xalloc(sizeof(float) * B * E, &failed);
    s->cal_delta = xalloc(sizeof(double) * NL * X, &failed);
    s->cal_n = xalloc(sizeof(uint64_t) * NL * X, &failed);
    const size_t max_in = E > Q ? (E > F ? E : F) : (Q > F ? Q : F);
    s->be = failed ? NULL : rm_backend_cpu_new(m->pool, s->n_batch, (int64_t) max_in, s->n_ctx);
    if (failed || !s->be) {
        session_free_buffers(s);
        free(s);
        return rm_fail(RM_E_OOM, "rm_session_new: out of memory for a context of %d tokens", params->n_ctx);
    }
    s->policy = m->residual ? RM_POLICY_ALL : RM_POLICY_NONE;
    memset(s->layer_mask, 1, NL);
    *out = s;
    return RM_OK;
}

void rm_session_free(rm_session * s) {
    if (!s) {
        return;
    }
    session_free_buffers(s);
    free(s);
}

rm_status rm_session_reset(rm_session * s) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_reset: NULL session");
    }
    s->n_past = 0;
    return RM_OK;
}

int32_t rm_session_n_past(const rm_session * s) { return s ? s->n_past : 0; }
int32_t rm_session_n_ctx(const rm_session * s) { return s ? s->n_ctx : 0; }

static void matmul(rm_session * s, const rm_weight * w, const float * x, int64_t x_stride, int32_t n,
                   float * y, int64_t y_stride) {
    rm_matmul_args a = {w, 0, x, x_stride, n, y, y_stride, 0};
    s->be->matmul(s->be, &a);
}

static void add_bias(float * y, const rm_weight * b, int32_t n, int64_t width) {
    if (!b->data) {
        return;
    }
    const float * bias = (const float *) b->data;
    for (int32_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < width; j++) {
            y[i * width + j] += bias[j];
        }
    }
}

/* q/k normalisation: per head (ne = {head_dim}) or over the whole projection. */
static void qk_norm(const rm_model * m, float * y, const rm_weight * w, int32_t n, int32_t n_head) {
    const int32_t D = m->hp.head_dim;
    for (int32_t i = 0; i < n; i++) {
        float * row = y + (int64_t) i * n_head * D;
        if (m->arch->qk_norm == RM_QK_NORM_PER_HEAD) {
            for (int32_t h = 0; h < n_head; h++) {
                rm_rmsnorm(row + (int64_t) h * D, row + (int64_t) h * D, (const float *) w->data, D, m->hp.rms_eps);
            }
        } else {
            rm_rmsnorm(row, row, (const float *) w->data, (int64_t) n_head * D, m->hp.rms_eps);
        }
    }
}

static void attention_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    const int64_t E = hp->n_embd, Q = (int64_t) hp->n_head * hp->head_dim, KV = (int64_t) hp->n_head_kv * hp->head_dim;
    for (int32_t i = 0; i < n; i++) {
        rm_rmsnorm(s->xn + i * E, s->x + i * E, (const float *) L->attn_norm.data, E, hp->rms_eps);
    }
    matmul(s, &L->wq, s->xn, E, n, s->q, Q);
    matmul(s, &L->wk, s->xn, E, n, s->k, KV);
    matmul(s, &L->wv, s->xn, E, n, s->v, KV);
    add_bias(s->q, &L->bq, n, Q);
    add_bias(s->k, &L->bk, n, KV);
    add_bias(s->v, &L->bv, n, KV);
    if (m->arch->qk_norm != RM_QK_NORM_NONE) {
        qk_norm(m, s->q, &L->q_norm, n, hp->n_head);
        qk_norm(m, s->k, &L->k_norm, n, hp->n_head_kv);
    }
    float * kc = s->k_cache + (int64_t) il * s->n_ctx * KV;
    float * vc = s->v_cache + (int64_t) il * s->n_ctx * KV;
    const int neox = m->arch->rope == RM_ROPE_NEOX;
    for (int32_t i = 0; i < n; i++) {
        const int32_t pos = s->n_past + i;
        rm_rope(s->q + i * Q, hp->n_head, hp->head_dim, hp->n_rot, pos, hp->rope_base, neox);
        rm_rope(s->k + i * KV, hp->n_head_kv, hp->head_dim, hp->n_rot, pos, hp->rope_base, neox);
        memcpy(kc + (int64_t) pos * KV, s->k + i * KV, sizeof(float) * (size_t) KV);
        memcpy(vc + (int64_t) pos * KV, s->v + i * KV, sizeof(float) * (size_t) KV);
    }
    rm_attn_args aa = {s->q, kc, vc, s->attn, n, s->n_past, hp->n_head, hp->n_head_kv, hp->head_dim};
    s->be->attention(s->be, &aa);
    rm_matmul_args o = {&L->wo, 0, s->attn, Q, n, s->x, E, 1};   /* x += Wo attn */
    s->be->matmul(s->be, &o);
}

static void embed(rm_session * s, const int32_t * tokens, int32_t n) {
    const rm_weight * w = &s->m->tok_embd;
    const rm_type_traits * tt = rm_type_traits_get(w->type);
    for (int32_t i = 0; i < n; i++) {
        tt->to_float(w->data + (uint64_t) tokens[i] * w->row_bytes, s->x + (int64_t) i * w->ne[0], w->ne[0]);
    }
}

/* Runs n <= n_batch tokens through every layer; the logits of rows [first_out, n) go to out. */
static void forward(rm_session * s, const int32_t * tokens, int32_t n, int32_t first_out, float * out) {
    const rm_model * m = s->m;
    const int64_t E = m->hp.n_embd;
    embed(s, tokens, n);
    for (int il = 0; il < m->hp.n_layer; il++) {
        attention_block(s, il, n);
        rm_moe_block(s, il, n);
    }
    if (out && first_out < n) {
        for (int32_t i = first_out; i < n; i++) {
            rm_rmsnorm(s->xn + i * E, s->x + i * E, (const float *) m->output_norm.data, E, m->hp.rms_eps);
        }
        matmul(s, &m->output, s->xn + first_out * E, E, n - first_out, out, m->hp.n_vocab);
    }
    s->n_past += n;
}

rm_status rm_session_eval(rm_session * s, const int32_t * tokens, int32_t n, int32_t all_logits,
                          float * logits, uint64_t logits_cap) {
    rm_clear_error();
    if (!s || (!tokens && n > 0)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: NULL argument");
    }
    const rm_hparams * hp = &s->m->hp;
    if (n <= 0) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: no tokens to evaluate (n = %d)", n);
    }
    if ((int64_t) s->n_past + n > s->n_ctx) {
        return rm_fail(RM_E_STATE, "rm_session_eval: %d tokens after %d in the cache exceed the context of %d",
                       n, s->n_past, s->n_ctx);
    }
    for (int32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: token %d at index %d is outside the vocabulary [0, %d)",
                           tokens[i], i, hp->n_vocab);
        }
    }
    const uint64_t need = (uint64_t) hp->n_vocab * (all_logits ? (uint64_t) n : 1);
    if (logits && logits_cap < need) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_eval: logits buffer holds %llu floats, %llu needed",
                       (unsigned long long) logits_cap, (unsigned long long) need);
    }
    pthread_mutex_lock(&s->m->lock);
    for (int32_t done = 0; done < n;) {
        const int32_t nb = n - done < s->n_batch ? n - done : s->n_batch;
        const int last = done + nb == n;
        float * dst = NULL;             /* where the logits of row first_out go */
        int32_t first_out = nb;
        if (logits && all_logits) {
            dst = logits + (uint64_t) done * hp->n_vocab;
            first_out = 0;
        } else if (logits && last) {
            dst = logits;
            first_out = nb - 1;
        }
        forward(s, tokens + done, nb, first_out, dst);
        done += nb;
    }
    pthread_mutex_unlock(&s->m->lock);
    return RM_OK;
}

/* ---- residual policy and statistics -------------------------------------------------------- */

static rm_status check_positive(const char * what, const float * v, int64_t n, float hi) {
    for (int64_t i = 0; v && i < n; i++) {
        if (!(v[i] > 0.0f) || !(v[i] <= hi)) {
            return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: %s[%lld] = %g is outside (0, %g]",
                           what, (long long) i, v[i], hi);
        }
    }
    return RM_OK;
}

rm_status rm_session_set_policy(rm_session * s, const rm_residual_policy * p) {
    rm_clear_error();
    if (!s || !p) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: NULL argument");
    }
    if (p->struct_size != sizeof(rm_residual_policy)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: struct_size %u != %zu (mismatched header)",
                       p->struct_size, sizeof(rm_residual_policy));
    }
    if (p->kind < RM_POLICY_NONE || p->kind > RM_POLICY_LAYER) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: unknown policy kind %d", p->kind);
    }
    if (p->kind != RM_POLICY_NONE && !s->m->residual) {
        return rm_fail(RM_E_STATE, "rm_session_set_policy: the model was loaded without a residual sidecar");
    }
    const int64_t NL = s->m->hp.n_layer, X = s->m->hp.n_expert;
    const int scored = p->kind >= RM_POLICY_UMIA;
    if (scored && !p->layer_budget) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: policy %d needs layer_budget", p->kind);
    }
    for (int64_t l = 0; scored && l < NL; l++) {
        if (!(p->layer_budget[l] >= 0.0f && p->layer_budget[l] <= 1.0f)) {
            return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: layer_budget[%lld] = %g is outside [0, 1]",
                           (long long) l, p->layer_budget[l]);
        }
    }
    rm_status st;
    if ((st = check_positive("expert_score", p->expert_score, NL * X, 1e30f)) != RM_OK ||
        (st = check_positive("layer_score", p->layer_score, NL, 1e30f)) != RM_OK) {
        return st;
    }
    if (!isfinite(p->gain) || p->gain < 0.0f || !isfinite(p->gate_power)) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_policy: gain %g / gate_power %g invalid", p->gain, p->gate_power);
    }
    s->policy = p->kind;
    s->rng = p->seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
    if (s->rng == 0) s->rng = 1;
    s->gate_power = p->gate_power;
    s->gain = p->gain;
    for (int64_t i = 0; i < NL * X; i++) s->expert_score[i] = p->expert_score ? p->expert_score[i] : 1.0f;
    for (int64_t l = 0; l < NL; l++) {
        s->layer_score[l] = p->layer_score ? p->layer_score[l] : 1.0f;
        s->layer_budget[l] = p->layer_budget ? p->layer_budget[l] : 0.0f;
        s->threshold[l] = p->threshold0 ? p->threshold0[l] : 0.0f;
        s->layer_mask[l] = p->layer_mask ? (p->layer_mask[l] != 0) : 1;
    }
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

rm_status rm_session_set_calibration(rm_session * s, int32_t on) {
    rm_clear_error();
    if (!s) {
        return rm_fail(RM_E_INVALID_ARG, "rm_session_set_calibration: NULL session");
    }
    if (on && !s->m->residual) {
        return rm_fail(RM_E_STATE, "rm_session_set_calibration: the model was loaded without a residual sidecar");
    }
    const size_t n = (size_t) s->m->hp.n_layer * (size_t) s->m->hp.n_expert;
    if (on) {
        memset(s->cal_delta, 0, sizeof(double) * n);
        memset(s->cal_n, 0, sizeof(uint64_t) * n);
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
