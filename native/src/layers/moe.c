/* moe.c - the MoE block: routing as llama.cpp and transformers compute it, the policy's choice of
 * which (token, expert) slots get their residual (policy.c), and the experts themselves.
 *
 * Tokens are grouped by expert, so each expert's weights are read once per batch. For a slot that
 * gets its residual the expert computes x.B + x.R for each of its three matrices (never B + R):
 * the residual rows are the first rows of the group, and the residual products run over just them.
 * A backend may run the routed experts its own way (the CUDA backend splits them between the GPU
 * and host threads, see docs/SPLIT.md); otherwise they are composed here from its small ops. */
#include "moe.h"

#include "gating.h"
#include "policy.h"
#include "profile.h"
#include "stats.h"
#include "xcache.h"

#include <math.h>
#include <string.h>

static void expert_matmul(rm_backend * be, const rm_weight * w, int64_t e, const float * x, int64_t x_stride,
                          int32_t n, float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, e, x, x_stride, n, y, y_stride, accumulate};
    be->ops->matmul(be, &a);
}

/* Expert e's matrices: the layer's tensors at matrix e, or, for a streamed model, the copies of
 * the window now in the cache at matrix 0 (xcache.h, experts_streamed). */
typedef struct expert_mats {
    const rm_weight * gate, * up, * down, * gate_up, * gate_res, * up_res, * down_res;
    int64_t           mat;
} expert_mats;

static expert_mats mats_of(const rm_session * s, const rm_layer * L, int32_t e) {
    if (!s->xv) {
        return (expert_mats) {&L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_up_exps, &L->gate_res, &L->up_res,
                              &L->down_res, e};
    }
    const rm_weight * b = s->xv + (int64_t) e * 2 * RM_XC_MATS, * r = b + RM_XC_MATS;
    return (expert_mats) {&b[0], &b[1], &b[2], &b[3], &r[0], &r[1], &r[2], 0};
}

/* Adds x^2 of c rows of n columns, stride floats apart (on the backend), into sum, column by column. */
static void importance_sums(rm_session * s, const float * rows, int64_t n, int64_t stride, int32_t c, double * sum) {
    for (int32_t j = 0; j < c; j++) {
        s->be->ops->download(s->be, s->imp_host, rows + j * stride, sizeof(float) * (uint64_t) n);
        for (int64_t d = 0; d < n; d++) sum[d] += (double) s->imp_host[d] * s->imp_host[d];
    }
}

/* The gate and up products of c rows of x into g and u (rows of F), or, with llama.cpp's fused
 * gate_up tensor, both into g's rows of 2F (u is then g + F); returns the stride of g's rows. */
static int64_t gate_up(rm_backend * be, const rm_layer * L, const expert_mats * w, const float * x, int64_t E, int32_t c,
                       float * g, float * u, int64_t F) {
    if (L->gate_up_exps.data) {
        expert_matmul(be, w->gate_up, w->mat, x, E, c, g, 2 * F, 0);
        return 2 * F;
    }
    expert_matmul(be, w->gate, w->mat, x, E, c, g, F, 0);
    expert_matmul(be, w->up, w->mat, x, E, c, u, F, 0);
    return F;
}

/* The experts' activation over c rows whose gate rows are gs floats apart (gate_up's stride). */
static void expert_act_rows(rm_backend * be, const rm_layer * L, float * g, int64_t gs, float * u, int64_t F, int32_t c) {
    if (gs != F) {   /* fused: up is the second half of each gate row (GELU layers only) */
        be->ops->geglu(be, g, gs, g + F, gs, F, c);
    } else {
        rm_expert_act(be, L, g, u, (int64_t) c * F);
    }
}

/* One expert over its c gathered rows in s->ex, the first c_res of which get the residual;
 * the results land in s->ed. */
static void run_expert(rm_session * s, const rm_layer * L, int32_t e, int32_t c, int32_t c_res) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp;
    const expert_mats w = mats_of(s, L, e);
    if (s->calibrating && c_res > 0) {
        /* the base-only output of the residual rows, to measure what the residual changes */
        expert_matmul(be, w.gate, w.mat, s->ex, E, c_res, s->eg, F, 0);
        expert_matmul(be, w.up, w.mat, s->ex, E, c_res, s->eu, F, 0);
        rm_expert_bias(be, &L->gate_exps_b, e, s->eg, c_res);
        rm_expert_bias(be, &L->up_exps_b, e, s->eu, c_res);
        rm_expert_act(be, L, s->eg, s->eu, (int64_t) c_res * F);
        expert_matmul(be, w.down, w.mat, s->eg, F, c_res, s->ecal, E, 0);
        rm_expert_bias(be, &L->down_exps_b, e, s->ecal, c_res);
    }
    const int64_t gs = gate_up(be, L, &w, s->ex, E, c, s->eg, s->eu, F);   /* no residual with the fused form */
    if (c_res > 0) {
        expert_matmul(be, w.gate_res, w.mat, s->ex, E, c_res, s->eg, F, 1);
        expert_matmul(be, w.up_res, w.mat, s->ex, E, c_res, s->eu, F, 1);
    }
    rm_expert_bias(be, &L->gate_exps_b, e, s->eg, c);
    rm_expert_bias(be, &L->up_exps_b, e, s->eu, c);
    expert_act_rows(be, L, s->eg, gs, s->eu, F, c);
    if (s->imp_in) {
        const int64_t il = L - s->m->layers, k = il * s->m->hp.n_expert + e;
        importance_sums(s, s->ex, E, E, c, s->imp_in + k * E);
        importance_sums(s, s->eg, F, gs, c, s->imp_ff + k * F);
        s->imp_n[k] += (uint64_t) c;
    }
    expert_matmul(be, w.down, w.mat, s->eg, gs, c, s->ed, E, 0);
    if (c_res > 0) {
        expert_matmul(be, w.down_res, w.mat, s->eg, F, c_res, s->ed, E, 1);
    }
    rm_expert_bias(be, &L->down_exps_b, e, s->ed, c);
}

/* |f_{B+R}(x) - f_B(x)| of the c_res residual rows just computed, summed per (layer, expert). */
static void calibration_sums(rm_session * s, int il, int32_t e, int32_t c_res) {
    const int64_t E = s->m->hp.n_embd;
    float * full = s->cal_host, * base = s->cal_host + E;
    for (int32_t j = 0; j < c_res; j++) {
        s->be->ops->download(s->be, full, s->ed + j * E, sizeof(float) * (uint64_t) E);
        s->be->ops->download(s->be, base, s->ecal + j * E, sizeof(float) * (uint64_t) E);
        double d2 = 0.0;
        for (int64_t d = 0; d < E; d++) {
            const double diff = (double) full[d] - base[d];
            d2 += diff * diff;
        }
        s->cal_delta[(int64_t) il * s->m->hp.n_expert + e] += sqrt(d2);
    }
    s->cal_n[(int64_t) il * s->m->hp.n_expert + e] += (uint64_t) c_res;
}

/* The routed experts from the backend's small ops, one expert at a time (rm_moe_args). */
static void experts_by_ops(rm_session * s, int il, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const rm_layer * L = &s->m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd;
    const int32_t K = hp->n_expert_used, X = hp->n_expert;
    const int64_t cap = (int64_t) s->n_batch * K;
    for (int32_t e = 0; e < X; e++) {
        const int32_t c = s->exp_n[e];
        if (c == 0) {
            continue;
        }
        const int32_t * pairs = s->exp_pairs + (int64_t) e * cap;
        int32_t c_res = 0;
        for (int32_t j = 0; j < c; j++) {
            s->rows[j] = pairs[j] / K;
            s->scale[j] = s->routes[pairs[j]].weight;
            c_res += s->routes[pairs[j]].residual;
        }
        be->ops->gather_rows(be, s->ex, s->xn, s->rows, c, E);
        run_expert(s, L, e, c, c_res);
        if (s->calibrating && c_res > 0) {
            calibration_sums(s, il, e, c_res);
        }
        be->ops->scatter_add(be, s->moe, s->ed, s->rows, s->scale, c, E);
    }
}

/* The routed experts in batched products (be->ops->matmul_many): consecutive experts whose rows fit
 * the scratch (n_batch rows) go together, one dispatch for all their gate and up products and
 * one for their down products, each residual computed beside its base over the same rows. The
 * arithmetic is experts_by_ops's, row by row, so the results are the same. In decode every
 * expert reads the token's row in place, quantized once for all of them. */
#define RM_MOE_GROUP_MAX 32

static void experts_batched(rm_session * s, int il, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const rm_layer * L = &s->m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp;
    const int32_t K = hp->n_expert_used, X = hp->n_expert;
    const int64_t cap = (int64_t) s->n_batch * K;
    rm_mm_item items[2 * RM_MOE_GROUP_MAX];
    int32_t e = 0;
    while (e < X) {
        int32_t grp[RM_MOE_GROUP_MAX][4];   /* {expert, first row, rows, residual rows} */
        int32_t ng = 0, rows = 0;
        for (; e < X && ng < RM_MOE_GROUP_MAX; e++) {
            const int32_t c = s->exp_n[e];
            if (c == 0) {
                continue;
            }
            if (rows + c > s->n_batch) {
                break;
            }
            const int32_t * pairs = s->exp_pairs + (int64_t) e * cap;
            int32_t c_res = 0;
            for (int32_t j = 0; j < c; j++) {
                s->rows[rows + j] = pairs[j] / K;
                s->scale[rows + j] = s->routes[pairs[j]].weight;
                c_res += s->routes[pairs[j]].residual;
            }
            grp[ng][0] = e, grp[ng][1] = rows, grp[ng][2] = c, grp[ng][3] = c_res;
            ng++;
            rows += c;
        }
        if (ng == 0) {
            continue;
        }
        const int decode = n == 1;
        if (!decode) {
            be->ops->gather_rows(be, s->ex, s->xn, s->rows, rows, E);
        }
        rm_prof_mark(s, RM_PROF_EXPERTS_OTHER);
        const int fused = L->gate_up_exps.data != NULL;   /* llama.cpp's gate_up: rows of 2F, no residual */
        const int64_t gs = fused ? 2 * F : F;
        for (int32_t g = 0; g < ng; g++) {
            const int32_t x = grp[g][0], r0 = grp[g][1], c = grp[g][2], c_res = grp[g][3];
            const float * in = decode ? s->xn : s->ex + (int64_t) r0 * E;
            const expert_mats w = mats_of(s, L, x);
            if (fused) {
                items[g] = (rm_mm_item) {{w.gate_up, w.mat, in, E, c, s->eg + (int64_t) r0 * gs, gs, 0}, NULL, 0};
                continue;
            }
            items[2 * g] = (rm_mm_item) {{w.gate, w.mat, in, E, c, s->eg + (int64_t) r0 * F, F, 0}, w.gate_res, c_res};
            items[2 * g + 1] = (rm_mm_item) {{w.up, w.mat, in, E, c, s->eu + (int64_t) r0 * F, F, 0}, w.up_res, c_res};
        }
        be->ops->matmul_many(be, items, fused ? ng : 2 * ng);
        for (int32_t g = 0; g < ng; g++) {
            rm_expert_bias(be, &L->gate_exps_b, grp[g][0], s->eg + (int64_t) grp[g][1] * F, grp[g][2]);
            rm_expert_bias(be, &L->up_exps_b, grp[g][0], s->eu + (int64_t) grp[g][1] * F, grp[g][2]);
        }
        rm_prof_mark(s, RM_PROF_EXPERTS_IN);
        expert_act_rows(be, L, s->eg, gs, s->eu, F, rows);
        rm_prof_mark(s, RM_PROF_EXPERTS_OTHER);
        for (int32_t g = 0; g < ng; g++) {
            const int32_t x = grp[g][0], r0 = grp[g][1], c = grp[g][2], c_res = grp[g][3];
            const expert_mats w = mats_of(s, L, x);
            items[g] = (rm_mm_item) {{w.down, w.mat, s->eg + (int64_t) r0 * gs, gs, c, s->ed + (int64_t) r0 * E, E, 0},
                                     w.down_res, c_res};
        }
        be->ops->matmul_many(be, items, ng);
        for (int32_t g = 0; g < ng; g++) {
            rm_expert_bias(be, &L->down_exps_b, grp[g][0], s->ed + (int64_t) grp[g][1] * E, grp[g][2]);
        }
        rm_prof_mark(s, RM_PROF_EXPERTS_OUT);
        be->ops->scatter_add(be, s->moe, s->ed, s->rows, s->scale, rows, E);
        rm_prof_mark(s, RM_PROF_EXPERTS_OTHER);
    }
}

/* A gated FFN on xn (SwiGLU, limited where the layer says (ffn_limit_sh), or GELU in a layer of
 * RM_LAYER_GELU), its down projection added into y (or written, accumulate 0): the ungated shared
 * experts (into the MoE output), the leading dense layers (into the residual stream), Gemma 4's FFN
 * beside the experts. */
static void dense_ffn(rm_session * s, const rm_layer * L, const rm_weight * gate, const rm_weight * up,
                      const rm_weight * down, int32_t n, float * y, int accumulate) {
    rm_backend * be = s->be;
    const int64_t E = s->m->hp.n_embd, F = gate->ne[1];
    if (be->ops->matmul_many) {   /* gate and up in one dispatch, the input quantized once */
        const rm_mm_item gu[2] = {{{gate, 0, s->xn, E, n, s->eg, F, 0}, NULL, 0}, {{up, 0, s->xn, E, n, s->eu, F, 0}, NULL, 0}};
        be->ops->matmul_many(be, gu, 2);
    } else {
        expert_matmul(be, gate, 0, s->xn, E, n, s->eg, F, 0);
        expert_matmul(be, up, 0, s->xn, E, n, s->eu, F, 0);
    }
    if (L->kind & RM_LAYER_GELU) {
        be->ops->geglu(be, s->eg, F, s->eu, F, F, n);
    } else if (L->ffn_limit_sh > 0.0f) {
        be->ops->swiglu_clamp(be, s->eg, s->eu, (int64_t) n * F, L->ffn_limit_alpha, L->ffn_limit_sh);
    } else {
        be->ops->swiglu(be, s->eg, s->eu, (int64_t) n * F);
    }
    expert_matmul(be, down, 0, s->eg, F, n, y, E, accumulate);
}

/* The router's choices: the backend's softmax router, or, for sigmoid scores, a selection bias,
 * expert groups or a scale, its DeepSeek/GLM router (gating.c's rules). */
static void route(rm_session * s, const rm_layer * L, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int32_t K = hp->n_expert_used, X = hp->n_expert;
    rm_gating_params g = {hp->gating, hp->n_group, hp->n_group_used, hp->norm_topk,
                          hp->expert_weights_scale > 0.0f ? hp->expert_weights_scale : 1.0f, NULL};
    if (L->kind & RM_LAYER_HASH_ROUTE) {   /* each token's experts from its row of the table (ids checked at load) */
        for (int32_t t = 0; t < n; t++) {
            memcpy(s->rows + (int64_t) t * K, L->hash_experts.data + (uint64_t) s->tokens[t] * L->hash_experts.row_bytes,
                   sizeof(int32_t) * (size_t) K);
        }
        g.hash = s->rows;   /* free until the experts gather */
    }
    const rm_weight * bias = L->exp_probs_b.data ? &L->exp_probs_b : NULL;
    if (rm_gating_is_plain(&g, bias ? (const float *) bias->data : NULL)) {
        be->ops->route(be, s->router, n, X, K, hp->norm_topk, s->routes);
    } else {
        be->ops->route_gated(be, s->router, bias, &g, n, X, K, s->routes);
    }
}

/* Gemma 4's router: logits of the input normed without weight and scaled by router_norm /
 * sqrt(n_embd) (the norm takes router_norm, the logits the scalar); the renormalised weights then
 * times each chosen expert's down_exps_scale. */
static void route_scaled(rm_session * s, const rm_layer * L, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd;
    const int32_t K = hp->n_expert_used, X = hp->n_expert;
    be->ops->rmsnorm(be, s->xn, s->x, &L->router_norm, n, E, hp->rms_eps);
    rm_matmul_args ra = {&L->router, 0, s->xn, E, n, s->router, X, 0};
    be->ops->matmul(be, &ra);
    be->ops->scale(be, s->router, (int64_t) n * X, 1.0f / sqrtf((float) E));
    route(s, L, n);
    const float * es = (const float *) L->down_exps_scale.data;   /* host memory: the mapped file */
    for (int64_t j = 0; j < (int64_t) n * K; j++) {
        s->routes[j].weight *= es[s->routes[j].expert];
    }
}

static void shared_expert(rm_session * s, const rm_layer * L, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, S = hp->n_ff_shexp;
    expert_matmul(be, &L->gate_shexp, 0, s->xn, E, n, s->eg, S, 0);
    expert_matmul(be, &L->up_shexp, 0, s->xn, E, n, s->eu, S, 0);
    be->ops->swiglu(be, s->eg, s->eu, (int64_t) n * S);
    expert_matmul(be, &L->down_shexp, 0, s->eg, S, n, s->ed, E, 0);
    expert_matmul(be, &L->gate_inp_shexp, 0, s->xn, E, n, s->shgate, 1, 0);   /* ne = {n_embd}: one row */
    be->ops->add_gated(be, s->moe, s->ed, s->shgate, n, E);
}

/* The experts of exp_n (grouped in exp_pairs) through the backend's widest form. */
static void experts_run(rm_session * s, int il, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    rm_backend * be = s->be;
    const int32_t K = hp->n_expert_used, X = hp->n_expert;
    const int by_ops = s->calibrating || s->imp_in;   /* both read each expert's rows on the host */
    if (be->ops->moe_experts && !by_ops) {
        rm_moe_args a = {&s->m->layers[il], il, n, X, K, hp->n_embd, hp->n_ff_exp, s->xn, s->moe, s->routes, s->exp_n,
                         s->exp_pairs, (int64_t) s->n_batch * K};
        be->ops->moe_experts(be, &a);
        rm_prof_mark(s, RM_PROF_EXPERTS_OTHER);
    } else if (be->ops->matmul_many && !by_ops) {
        experts_batched(s, il, n);
    } else {
        experts_by_ops(s, il, n);
        rm_prof_mark(s, RM_PROF_EXPERTS_OTHER);
    }
}

/* 1 when expert e's slots of this batch include residual ones (they come first in its group). */
static int wants_residual(const rm_session * s, int32_t e) {
    const int64_t cap = (int64_t) s->n_batch * s->m->hp.n_expert_used;
    return s->exp_n_all[e] > 0 && s->routes[s->exp_pairs[e * cap]].residual;
}

/* The experts from e0 on whose units fit one window: the end of the run. */
static int32_t window_end(const rm_session * s, int32_t e0) {
    const int32_t X = s->m->hp.n_expert, W = rm_xcache_window(s->m->xcache);
    int32_t units = 0, e = e0;
    for (; e < X; e++) {
        if (s->exp_n_all[e] == 0) {
            continue;
        }
        const int32_t need = 1 + wants_residual(s, e);
        if (units + need > W) {
            break;
        }
        units += need;
    }
    return e;
}

/* A streamed model's experts (xcache.h): the batch's experts run in windows of what the cache
 * holds at once. Each window's units are got (read on a miss) into s->xv, the next window's are
 * asked of the reader thread, and the window's experts run as experts_run runs them, with exp_n
 * zero outside it. A failed read ends the pass (s->xc_status). */
static void experts_streamed(rm_session * s, int il, int32_t n) {
    rm_xcache * c = s->m->xcache;
    const int32_t X = s->m->hp.n_expert;
    memcpy(s->exp_n_all, s->exp_n, sizeof(int32_t) * (size_t) X);
    for (int32_t e0 = 0; e0 < X && s->xc_status == RM_OK;) {
        const int32_t e1 = window_end(s, e0);
        rm_xcache_begin(c);
        memset(s->exp_n, 0, sizeof(int32_t) * (size_t) X);
        for (int32_t e = e0; e < e1 && s->xc_status == RM_OK; e++) {
            if (s->exp_n_all[e] == 0) {
                continue;
            }
            rm_weight * v = s->xv + (int64_t) e * 2 * RM_XC_MATS;
            s->xc_status = rm_xcache_get(c, il, e, RM_XC_BASE, v);
            if (s->xc_status == RM_OK && wants_residual(s, e)) {
                const double t0 = rm_now_us();
                s->xc_status = rm_xcache_get(c, il, e, RM_XC_RES, v + RM_XC_MATS);
                s->xc_res_us[il] += (float) (rm_now_us() - t0);
            }
            s->exp_n[e] = s->exp_n_all[e];
        }
        const int32_t e2 = e1 < X ? window_end(s, e1) : X;   /* the next window, read meanwhile */
        int32_t n_next = 0;
        for (int32_t e = e1; e < e2; e++) {
            if (s->exp_n_all[e] > 0) s->pred_experts[n_next++] = e;
        }
        rm_xcache_prefetch(c, il, s->pred_experts, n_next, 0);
        rm_prof_mark(s, RM_PROF_EXPERTS_OTHER);
        if (s->xc_status == RM_OK) {
            experts_run(s, il, n);
        }
        e0 = e1;
    }
    memcpy(s->exp_n, s->exp_n_all, sizeof(int32_t) * (size_t) X);
}

/* A streamed model's guess at layer il + 1's experts, from its router on the residual stream as it
 * leaves layer il (before il + 1's attention adds to it): each token's top n_expert_used, asked of
 * the reader thread so that they are read while that attention runs. */
static void prefetch_next(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    /* the hyper-connections' next input is not a norm of x: no prediction */
    if (!s->xv || !rm_xcache_predicts(m->xcache) || il + 1 >= hp->n_layer || s->xc_status != RM_OK ||
        (m->arch->flags & (RM_ARCH_HYPER | RM_ARCH_MHC)) ||
        !(m->layers[il + 1].kind & RM_LAYER_FFN_MOE)) {
        return;
    }
    const rm_layer * L = &m->layers[il + 1];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd;
    const int32_t X = hp->n_expert, K = hp->n_expert_used;
    be->ops->rmsnorm(be, s->xn, s->x, L->router_norm.data ? &L->router_norm : &L->ffn_norm, n, E, hp->rms_eps);
    rm_matmul_args ra = {&L->router, 0, s->xn, E, n, s->router, X, 0};
    be->ops->matmul(be, &ra);
    be->ops->download(be, s->pred, s->router, sizeof(float) * (uint64_t) n * (uint64_t) X);
    const float * bias = L->exp_probs_b.data ? (const float *) L->exp_probs_b.data : NULL;
    int32_t * count = s->exp_n_all;   /* free until the next layer's experts */
    memset(count, 0, sizeof(int32_t) * (size_t) X);
    for (int32_t t = 0; t < n; t++) {
        float * row = s->pred + (int64_t) t * X;
        if (bias) {
            for (int32_t e = 0; e < X; e++) row[e] += bias[e];
        }
        for (int32_t k = 0; k < K; k++) {   /* the top K, one at a time, each taken out */
            int32_t best = 0;
            for (int32_t e = 1; e < X; e++) best = row[e] > row[best] ? e : best;
            count[best]++;
            row[best] = -INFINITY;
        }
    }
    int32_t n_pred = 0;
    for (int32_t e = 0; e < X; e++) {
        if (count[e] > 0) s->pred_experts[n_pred++] = e;
    }
    rm_xcache_prefetch(m->xcache, il + 1, s->pred_experts, n_pred, 0);
}

/* The routed experts of layer il over xn into s->moe (zeroed first), the router's choices in s->routes. */
static void routed_experts(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd;
    const int32_t K = hp->n_expert_used, X = hp->n_expert;
    rm_policy_select(s, il, n);

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
    rm_stats_count(s, il, n);
    be->ops->zero(be, s->moe, sizeof(float) * (uint64_t) n * (uint64_t) E);
    rm_prof_mark(s, RM_PROF_ROUTER);
    if (s->xv) {
        experts_streamed(s, il, n);
    } else {
        experts_run(s, il, n);
    }
    rm_stats_record_routes(s, il, n);
}

/* Gemma 4's FFN (RM_LAYER_POST_NORM with experts): x += post(post_1(dense(ffn_norm(x))) +
 * post_2(experts(pre_2(x)))), the router reading x through its own norm; then x times the
 * layer's scale. The dense FFN's output waits in s->attn (rows of n_embd: sizes.c). */
static void sandwich_block(rm_session * s, int il, int32_t n) {
    const rm_hparams * hp = &s->m->hp;
    const rm_layer * L = &s->m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd;
    be->ops->rmsnorm(be, s->xn, s->x, &L->ffn_norm, n, E, hp->rms_eps);
    dense_ffn(s, L, &L->ffn_gate, &L->ffn_up, &L->ffn_down, n, s->attn, 0);
    be->ops->rmsnorm(be, s->attn, s->attn, &L->ffn_post_norm_1, n, E, hp->rms_eps);
    rm_prof_mark(s, RM_PROF_SHARED);
    route_scaled(s, L, n);
    be->ops->rmsnorm(be, s->xn, s->x, &L->ffn_pre_norm_2, n, E, hp->rms_eps);
    routed_experts(s, il, n);
    be->ops->rmsnorm(be, s->moe, s->moe, &L->ffn_post_norm_2, n, E, hp->rms_eps);
    be->ops->add(be, s->moe, s->attn, (int64_t) n * E);
    be->ops->rmsnorm(be, s->moe, s->moe, &L->ffn_post_norm, n, E, hp->rms_eps);
    be->ops->add(be, s->x, s->moe, (int64_t) n * E);
    if (L->out_scale.data) {
        be->ops->scale(be, s->x, (int64_t) n * E, *(const float *) L->out_scale.data);   /* host: the mapped file */
    }
    rm_prof_mark(s, RM_PROF_SHARED);
    prefetch_next(s, il, n);
}

void rm_moe_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd;
    const int32_t X = hp->n_expert;

    if ((L->kind & RM_LAYER_POST_NORM) && (L->kind & RM_LAYER_FFN_MOE)) {
        sandwich_block(s, il, n);
        return;
    }
    if (!(m->arch->flags & (RM_ARCH_HYPER | RM_ARCH_MHC))) {   /* else the hyper-connections gave xn */
        be->ops->rmsnorm(be, s->xn, s->x, &L->ffn_norm, n, E, hp->rms_eps);
    }
    if (!(L->kind & RM_LAYER_FFN_MOE)) {   /* a leading dense layer: no experts */
        dense_ffn(s, L, &L->ffn_gate, &L->ffn_up, &L->ffn_down, n, s->x, 1);
        rm_prof_mark(s, RM_PROF_SHARED);
        prefetch_next(s, il, n);
        return;
    }
    rm_matmul_args ra = {&L->router, 0, s->xn, E, n, s->router, X, 0};
    be->ops->matmul(be, &ra);
    if (L->router_b.data) be->ops->add_bias(be, s->router, &L->router_b, n, X);
    route(s, L, n);
    routed_experts(s, il, n);
    if (m->arch->shared_expert == RM_SHEXP_GATED) {
        shared_expert(s, L, n);
    } else if (m->arch->shared_expert == RM_SHEXP_PLAIN && L->gate_shexp.data) {
        dense_ffn(s, L, &L->gate_shexp, &L->up_shexp, &L->down_shexp, n, s->moe, 1);
    }
    be->ops->add(be, s->x, s->moe, (int64_t) n * E);
    rm_prof_mark(s, RM_PROF_SHARED);
    prefetch_next(s, il, n);
}
