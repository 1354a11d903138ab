/* standin.c - the CPU stand-in for the GPU (standin.h). */
#include "standin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devweights.h"
#include "split.h"
#include "status.h"

struct rm_standin {
    uint64_t        budget;       /* 0: no cap */
    uint64_t        used;         /* bytes held: the arena, the expert table and every session's */
    uint8_t *       arena;
    rm_dev_weights  weights;
    const uint8_t ** exp_tab;     /* the expert table, counted as the device's */
    uint64_t        exp_tab_bytes;
    int32_t         n_experts_on_dev;
    int32_t         upload_min_tokens;
};

/* Zeroed memory under the budget; NULL with the error set. */
static void * dev_malloc(rm_standin * d, uint64_t bytes, const char * what) {
    bytes = bytes ? bytes : 1;
    const uint64_t now = __atomic_fetch_add(&d->used, bytes, __ATOMIC_RELAXED);
    if (d->budget && now + bytes > d->budget) {
        __atomic_fetch_sub(&d->used, bytes, __ATOMIC_RELAXED);
        rm_dev_budget_error(what, bytes, now, d->budget);
        return NULL;
    }
    void * p = calloc(1, bytes);
    if (!p) {
        __atomic_fetch_sub(&d->used, bytes, __ATOMIC_RELAXED);
        rm_fail(RM_E_OOM, "%s: out of memory for the stand-in device", what);
    }
    return p;
}

static void dev_free(rm_standin * d, void * p, uint64_t bytes) {
    if (p) {
        free(p);
        __atomic_fetch_sub(&d->used, bytes ? bytes : 1, __ATOMIC_RELAXED);
    }
}

rm_status rm_standin_open(const rm_model * m, const rm_model_params * p, rm_standin ** out) {
    *out = NULL;
    rm_standin * d = calloc(1, sizeof(*d));
    if (!d || !rm_dev_weights_list(m, p->expert_on_gpu, NULL, &d->weights)) {
        free(d);
        return rm_fail(RM_E_OOM, "rm_model_load: out of host memory listing the weights for the stand-in device");
    }
    d->budget = p->gpu_memory_bytes;
    d->upload_min_tokens = p->residual_upload_min_tokens;
    const int64_t n_tab = (int64_t) m->hp.n_layer * 3 * m->hp.n_expert;
    d->exp_tab_bytes = sizeof(uint8_t *) * (uint64_t) n_tab;
    if (!(d->arena = dev_malloc(d, d->weights.bytes, "rm_model_load: the weights placed on the GPU")) ||
        !(d->exp_tab = dev_malloc(d, d->exp_tab_bytes, "rm_model_load: the expert tables"))) {
        rm_standin_close(d);
        return RM_E_OOM;
    }
    rm_dev_weights_place(&d->weights, d->arena);
    for (int64_t i = 0; i < d->weights.n_ranges; i++) {
        memcpy(d->weights.ranges[i].dev, d->weights.ranges[i].host, d->weights.ranges[i].bytes);
    }
    d->n_experts_on_dev = rm_dev_expert_table(&d->weights, m, d->exp_tab);
    *out = d;
    return RM_OK;
}

void rm_standin_close(rm_standin * d) {
    if (!d) {
        return;
    }
    dev_free(d, d->arena, d->weights.bytes);
    dev_free(d, (void *) d->exp_tab, d->exp_tab_bytes);
    rm_dev_weights_free(&d->weights);
    free(d);
}

void rm_standin_describe(const rm_standin * d, rm_gpu_info * info) {
    info->device = 0;
    snprintf(info->device_name, sizeof(info->device_name), "CPU stand-in device");
    info->weight_bytes = d->weights.bytes;
    info->used_bytes = __atomic_load_n(&d->used, __ATOMIC_RELAXED);
    info->n_experts_on_gpu = d->n_experts_on_dev;
}

/* ---- the backend ---------------------------------------------------------------------------- */

typedef struct alloc_rec {
    void *   p;
    uint64_t bytes;
} alloc_rec;

typedef struct sb_ctx {
    rm_standin *     d;
    const rm_model * m;
    rm_backend *     dev;         /* the CPU backend doing the device's work on the device's buffers */
    rm_backend *     host;        /* the CPU backend doing the host's share of the split */
    rm_status        err;         /* sticky: the first error */
    char             msg[512];
    alloc_rec *      allocs;
    int64_t          n_allocs, cap_allocs;
    int32_t          n_batch;
    float *          cpu_us, * dev_us;
    /* the split's buffers, as the CUDA backend has them (backend.cuh, cuda_split) */
    int64_t          max_slots;
    float *          xc, * gc, * uc, * dc, * gf, * uf, * hf, * df, * hr;   /* device */
    uint8_t *        tab;                                               /* device: the plan's tables */
    uint8_t *        stage;                                             /* device: residual copies */
    uint64_t         stage_bytes;
    void *           routes_d, * idx_d, * scale_d;                      /* device: routing, indices */
    uint8_t *        tab_h;                                             /* host */
    float *          x_h, * gf_h, * uf_h, * hf_h, * hr_h, * xs, * gs, * us;
    int32_t *        host_groups;
} sb_ctx;

static sb_ctx * ctx_of(rm_backend * be) { return (sb_ctx *) be->ctx; }

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec * 1e-3;
}

static void set_error(sb_ctx * c, rm_status st, const char * msg) {
    if (c->err == RM_OK) {
        c->err = st;
        snprintf(c->msg, sizeof(c->msg), "%s", msg);
    }
}

static void * sb_alloc(rm_backend * be, uint64_t bytes) {
    sb_ctx * c = ctx_of(be);
    if (c->n_allocs == c->cap_allocs) {
        const int64_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        alloc_rec * a = realloc(c->allocs, sizeof(*a) * (size_t) cap);
        if (!a) {
            set_error(c, RM_E_OOM, "stand-in backend: out of host memory");
            return NULL;
        }
        c->allocs = a;
        c->cap_allocs = cap;
    }
    void * p = dev_malloc(c->d, bytes, "stand-in backend: session buffers");
    if (!p) {
        set_error(c, RM_E_OOM, rm_last_error());
        return NULL;
    }
    c->allocs[c->n_allocs++] = (alloc_rec) {p, bytes};
    return p;
}

static void sb_release(rm_backend * be, void * p) {
    sb_ctx * c = ctx_of(be);
    for (int64_t i = 0; i < c->n_allocs; i++) {
        if (c->allocs[i].p == p) {
            dev_free(c->d, p, c->allocs[i].bytes);
            c->allocs[i] = c->allocs[--c->n_allocs];
            return;
        }
    }
}

/* Copies across the bus: each one counted. */
static void sb_upload(rm_backend * be, void * dst, const void * src, uint64_t bytes) {
    if (ctx_of(be)->err || !bytes) return;
    memcpy(dst, src, bytes);
    be->stats.h2d_bytes += bytes;
}

static void sb_download(rm_backend * be, void * dst, const void * src, uint64_t bytes) {
    if (ctx_of(be)->err || !bytes) return;
    memcpy(dst, src, bytes);
    be->stats.d2h_bytes += bytes;
    be->stats.n_syncs++;
}

static void sb_copy(rm_backend * be, void * dst, const void * src, uint64_t bytes) {
    if (!ctx_of(be)->err && bytes && dst != src) memmove(dst, src, bytes);
}

static void sb_zero(rm_backend * be, void * dst, uint64_t bytes) {
    if (!ctx_of(be)->err && bytes) memset(dst, 0, bytes);
}

static rm_status sb_status(rm_backend * be) {
    sb_ctx * c = ctx_of(be);
    if (c->err != RM_OK) {
        rm_fail(c->err, "%s", c->msg);
    }
    return c->err;
}

/* The device's copy of matrix `mat` of w as a weight of its own; 0 (error set) when the device
 * does not hold it: nothing reads weights across the bus. */
static int dev_weight(sb_ctx * c, const rm_weight * w, int64_t mat, rm_weight * out) {
    const uint8_t * d = rm_dev_weights_find(&c->d->weights, rm_weight_matrix(w, mat));
    if (!d) {
        set_error(c, RM_E_INTERNAL, "stand-in backend: a weight the forward pass uses is not on the device");
        return 0;
    }
    *out = *w;
    out->data = d;
    out->ne[2] = 1;
    return 1;
}

static void dev_matmul(sb_ctx * c, const rm_weight * w, int64_t mat, const float * x, int64_t xs, int32_t n, float * y,
                       int64_t ys, int acc) {
    rm_weight dw;
    if (c->err || n <= 0 || !dev_weight(c, w, mat, &dw)) return;
    rm_matmul_args a = {&dw, 0, x, xs, n, y, ys, acc};
    c->dev->matmul(c->dev, &a);
}

static void sb_matmul(rm_backend * be, const rm_matmul_args * a) {
    dev_matmul(ctx_of(be), a->w, a->mat, a->x, a->x_stride, a->n_tok, a->y, a->y_stride, a->accumulate);
}

static void sb_attention(rm_backend * be, const rm_attn_args * a) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->attention(c->dev, a);
}

static void sb_rmsnorm(rm_backend * be, float * y, const float * x, const rm_weight * w, int64_t n_rows, int64_t n,
                       float eps) {
    sb_ctx * c = ctx_of(be);
    rm_weight dw;
    if (!c->err && dev_weight(c, w, 0, &dw)) c->dev->rmsnorm(c->dev, y, x, &dw, n_rows, n, eps);
}

static void sb_rope(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                    int32_t pos0, float base, int neox) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->rope(c->dev, x, n_tok, n_head, head_dim, n_rot, pos0, base, neox);
}

static void sb_add(rm_backend * be, float * y, const float * x, int64_t n) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->add(c->dev, y, x, n);
}

static void sb_add_bias(rm_backend * be, float * y, const rm_weight * b, int64_t n_rows, int64_t n) {
    sb_ctx * c = ctx_of(be);
    rm_weight db;
    if (!c->err && dev_weight(c, b, 0, &db)) c->dev->add_bias(c->dev, y, &db, n_rows, n);
}

static void sb_add_gated(rm_backend * be, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->add_gated(c->dev, y, x, gate, n_rows, n);
}

static void sb_swiglu(rm_backend * be, float * g, const float * u, int64_t n) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->swiglu(c->dev, g, u, n);
}

/* Index arrays go up before a gather or scatter, as on the GPU. */
static int index_up(rm_backend * be, int32_t n, int with_scale) {
    sb_ctx * c = ctx_of(be);
    if (n > c->max_slots) {
        set_error(c, RM_E_INTERNAL, "stand-in backend: more rows than a batch has slots");
        return 0;
    }
    be->stats.h2d_bytes += (with_scale ? 8u : 4u) * (uint64_t) n;
    return c->err == RM_OK;
}

static void sb_gather_rows(rm_backend * be, float * dst, const float * src, const int32_t * rows, int32_t n,
                           int64_t width) {
    sb_ctx * c = ctx_of(be);
    if (!c->err && index_up(be, n, 0)) c->dev->gather_rows(c->dev, dst, src, rows, n, width);
}

static void sb_scatter_add(rm_backend * be, float * dst, const float * src, const int32_t * rows, const float * scale,
                           int32_t n, int64_t width) {
    sb_ctx * c = ctx_of(be);
    if (!c->err && index_up(be, n, 1)) c->dev->scatter_add(c->dev, dst, src, rows, scale, n, width);
}

/* The router on the device; its choices come down to the host, where the policy decides. */
static void sb_route(rm_backend * be, const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm,
                     rm_route * out) {
    sb_ctx * c = ctx_of(be);
    if (c->err) return;
    c->dev->route(c->dev, logits, n_tok, n_expert, k, norm, (rm_route *) c->routes_d);
    sb_download(be, out, c->routes_d, sizeof(rm_route) * (uint64_t) n_tok * (uint64_t) k);
}

/* ---- the split: the device's part, on the device's buffers (cf. native/cuda/split.cu) ------ */

/* out[t] += sum over t's slots s with row[s] >= 0 of w[s] * src[row[s]] (the GPU's k_combine). */
static void combine(float * out, const float * src, const int32_t * row, const float * w, int32_t n_tok, int32_t K,
                    int64_t E) {
    for (int32_t t = 0; t < n_tok; t++) {
        float * y = out + (int64_t) t * E;
        for (int32_t k = 0; k < K; k++) {
            const int32_t s = t * K + k, r = row[s];
            if (r < 0) continue;
            const float * x = src + (int64_t) r * E;
            for (int64_t i = 0; i < E; i++) y[i] += w[s] * x[i];
        }
    }
}

static void grouped(sb_ctx * c, const rm_weight * w, const rm_split_group * g, int32_t n_groups, const float * x,
                    int64_t xs, float * y, int64_t ys) {
    for (int32_t k = 0; k < n_groups; k++) {
        dev_matmul(c, w, g[k].mat, x + g[k].row0 * xs, xs, g[k].n, y + g[k].row0 * ys, ys, 0);
    }
}

/* A residual matrix copied into the staging buffer: a weight of the device's. */
static rm_weight staged_copy(rm_backend * be, const rm_weight * w, int64_t e, uint8_t ** dst) {
    const uint64_t bytes = w->row_bytes * (uint64_t) w->ne[1];
    memcpy(*dst, rm_weight_matrix(w, e), bytes);
    be->stats.h2d_bytes += bytes;
    be->stats.h2d_weight_bytes += bytes;
    rm_weight out = *w;
    out.data = *dst;
    out.ne[2] = 1;
    *dst += bytes;
    return out;
}

static void sb_moe_experts(rm_backend * be, const rm_moe_args * a) {
    sb_ctx * c = ctx_of(be);
    const rm_layer * L = a->L;
    const int il = a->layer;
    const int32_t K = a->n_expert_used, S = a->n_tok * K;
    const int64_t E = a->n_embd, F = a->n_ff;
    const uint64_t f = sizeof(float);
    c->cpu_us[il] = c->dev_us[il] = 0.0f;
    if (c->err || S <= 0) return;
    if (S > c->max_slots) {
        set_error(c, RM_E_INTERNAL, "stand-in backend: more slots than the split's scratch holds");
        return;
    }
    rm_split_plan p;
    rm_split_make_plan(a, c->d->exp_tab, c->stage != NULL && L->gate_res.data, c->d->upload_min_tokens, c->tab_h,
                       c->host_groups, &p);
    const int host_work = p.n_host_rows > 0;
    sb_upload(be, c->tab, c->tab_h, p.lay.end);
    const int32_t * tab_tok = (const int32_t *) (c->tab + p.lay.tok_of_row);

    /* the device's base work, and the copies the host needs from it */
    double t0 = now_us();
    c->dev->gather_rows(c->dev, c->xc, a->xn, tab_tok, S, E);
    if (host_work) {
        sb_download(be, c->x_h, a->xn, f * (uint64_t) a->n_tok * (uint64_t) E);
    }
    const rm_split_group * groups = (const rm_split_group *) (c->tab + p.lay.groups);
    grouped(c, &L->gate_exps, groups, p.n_groups, c->xc, E, c->gc, F);
    grouped(c, &L->up_exps, groups, p.n_groups, c->xc, E, c->uc, F);
    rm_weight staged[RM_SPLIT_STAGE_MAX][3];
    uint8_t * dst = c->stage;
    for (int k = 0; k < p.n_stage; k++) {    /* prefill: this expert's residual goes to the device */
        const int32_t e = p.stage[k].mat, r0 = p.stage[k].row0, n = p.stage[k].n;
        staged[k][0] = staged_copy(be, &L->gate_res, e, &dst);
        staged[k][1] = staged_copy(be, &L->up_res, e, &dst);
        staged[k][2] = staged_copy(be, &L->down_res, e, &dst);
        rm_matmul_args g = {&staged[k][0], 0, c->xc + r0 * E, E, n, c->gc + r0 * F, F, 1};
        rm_matmul_args u = {&staged[k][1], 0, c->xc + r0 * E, E, n, c->uc + r0 * F, F, 1};
        c->dev->matmul(c->dev, &g);
        c->dev->matmul(c->dev, &u);
    }
    if (p.n_fix) {
        const int32_t * fix_rows = (const int32_t *) (c->tab + p.lay.fix_rows);
        c->dev->gather_rows(c->dev, c->gf, c->gc, fix_rows, p.n_fix, F);
        c->dev->gather_rows(c->dev, c->uf, c->uc, fix_rows, p.n_fix, F);
        sb_download(be, c->gf_h, c->gf, f * (uint64_t) p.n_fix * (uint64_t) F);
        sb_download(be, c->uf_h, c->uf, f * (uint64_t) p.n_fix * (uint64_t) F);
    }
    c->dev->swiglu(c->dev, c->gc, c->uc, (int64_t) S * F);
    grouped(c, &L->down_exps, groups, p.n_groups, c->gc, F, c->dc, E);
    for (int k = 0; k < p.n_stage; k++) {
        const int32_t r0 = p.stage[k].row0;
        rm_matmul_args d = {&staged[k][2], 0, c->gc + r0 * F, F, p.stage[k].n, c->dc + r0 * E, E, 1};
        c->dev->matmul(c->dev, &d);
    }
    combine(a->out, c->dc, (const int32_t *) (c->tab + p.lay.slot_row), (const float *) (c->tab + p.lay.w_gpu),
            a->n_tok, K, E);
    const double dev_us = now_us() - t0;
    if (!host_work || c->err) {
        return;
    }

    /* the host's share (on the GPU it runs while the device works; here it follows) */
    const rm_split_host hs = {c->host, c->x_h, c->xs, c->gs, c->us, c->gf_h, c->uf_h, c->hf_h, c->hr_h};
    double t = now_us();
    rm_split_host_first(&hs, a, &p);
    if (p.n_fix) {
        rm_split_host_second(&hs, a, &p);
    }
    const double host_us = now_us() - t;
    c->cpu_us[il] = (float) host_us;
    c->dev_us[il] = (float) dev_us;
    be->stats.n_layer_steps++;
    be->stats.host_ms += host_us / 1000.0;
    be->stats.device_ms += dev_us / 1000.0;
    be->stats.n_stalls += host_us > dev_us;

    /* the fix-up: h'.B_d of the fix rows, and the host results, into the sum */
    if (p.n_fix) {
        sb_upload(be, c->hf, c->hf_h, f * (uint64_t) p.n_fix * (uint64_t) F);
        grouped(c, &L->down_exps, (const rm_split_group *) (c->tab + p.lay.fix_groups), p.n_fix_groups, c->hf, F,
                c->df, E);
        combine(a->out, c->df, (const int32_t *) (c->tab + p.lay.fix_of_slot), (const float *) (c->tab + p.lay.w_fix),
                a->n_tok, K, E);
    }
    sb_upload(be, c->hr, c->hr_h, f * (uint64_t) p.n_host_rows * (uint64_t) E);
    combine(a->out, c->hr, (const int32_t *) (c->tab + p.lay.host_of_slot), (const float *) (c->tab + p.lay.w_host),
            a->n_tok, K, E);
}

/* ---- lifetime ------------------------------------------------------------------------------- */

static void sb_free(rm_backend * be) {
    if (!be) {
        return;
    }
    sb_ctx * c = ctx_of(be);
    if (c) {
        while (c->n_allocs > 0) {
            sb_release(be, c->allocs[c->n_allocs - 1].p);
        }
        free(c->allocs);
        if (c->dev) c->dev->free(c->dev);
        if (c->host) c->host->free(c->host);
        float * host_bufs[] = {c->x_h, c->gf_h, c->uf_h, c->hf_h, c->hr_h, c->xs, c->gs, c->us};
        for (size_t i = 0; i < sizeof(host_bufs) / sizeof(host_bufs[0]); i++) free(host_bufs[i]);
        free(c->tab_h);
        free(c->host_groups);
        free(c->cpu_us);
        free(c->dev_us);
        free(c);
    }
    free(be);
}

/* The split's buffers, the sizes the CUDA backend allocates (so the planner's sums hold for both). */
static int split_init(rm_backend * be) {
    sb_ctx * c = ctx_of(be);
    const rm_hparams * hp = &c->m->hp;
    const uint64_t S = (uint64_t) c->max_slots, E = (uint64_t) hp->n_embd, F = (uint64_t) hp->n_ff_exp, f = sizeof(float);
    const uint64_t tab = rm_split_layout_for((int64_t) S).end;
    struct { void ** p; uint64_t bytes; } dev[] = {
        {&c->routes_d, sizeof(rm_route) * S}, {&c->idx_d, sizeof(int32_t) * S}, {&c->scale_d, sizeof(float) * S},
        {(void **) &c->xc, f * S * E}, {(void **) &c->gc, f * S * F}, {(void **) &c->uc, f * S * F},
        {(void **) &c->dc, f * S * E}, {(void **) &c->gf, f * S * F}, {(void **) &c->uf, f * S * F},
        {(void **) &c->hf, f * S * F}, {(void **) &c->df, f * S * E}, {(void **) &c->hr, f * S * E},
        {(void **) &c->tab, tab},
    };
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) {
        if (!(*dev[i].p = sb_alloc(be, dev[i].bytes))) return 0;
    }
    if (c->d->upload_min_tokens > 0 && c->m->residual) {
        c->stage_bytes = RM_SPLIT_STAGE_MAX * rm_split_stage_bytes(c->m);
        if (!(c->stage = sb_alloc(be, c->stage_bytes))) return 0;
    }
    c->tab_h = malloc(tab);
    c->x_h = malloc(f * (uint64_t) c->n_batch * E);
    c->gf_h = malloc(f * S * F);
    c->uf_h = malloc(f * S * F);
    c->hf_h = malloc(f * S * F);
    c->hr_h = malloc(f * S * E);
    c->xs = malloc(f * S * E);
    c->gs = malloc(f * S * F);
    c->us = malloc(f * S * F);
    c->host_groups = malloc(sizeof(int32_t) * 4 * (size_t) hp->n_expert);
    if (!c->tab_h || !c->x_h || !c->gf_h || !c->uf_h || !c->hf_h || !c->hr_h || !c->xs || !c->gs || !c->us ||
        !c->host_groups) {
        set_error(c, RM_E_OOM, "stand-in backend: out of host memory for the split's scratch");
        return 0;
    }
    return 1;
}

rm_backend * rm_backend_standin_new(rm_standin * d, const rm_model * m, rm_pool * pool, int32_t n_batch,
                                    int64_t max_in, int32_t n_ctx, rm_status * st) {
    *st = RM_E_OOM;
    rm_backend * be = calloc(1, sizeof(*be));
    sb_ctx * c = calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for the stand-in backend");
        return NULL;
    }
    be->ctx = c;
    be->name = "standin";
    be->alloc = sb_alloc;
    be->release = sb_release;
    be->upload = sb_upload;
    be->download = sb_download;
    be->copy = sb_copy;
    be->zero = sb_zero;
    be->status = sb_status;
    be->matmul = sb_matmul;
    be->attention = sb_attention;
    be->rmsnorm = sb_rmsnorm;
    be->rope = sb_rope;
    be->add = sb_add;
    be->add_bias = sb_add_bias;
    be->add_gated = sb_add_gated;
    be->swiglu = sb_swiglu;
    be->gather_rows = sb_gather_rows;
    be->scatter_add = sb_scatter_add;
    be->route = sb_route;
    be->moe_experts = sb_moe_experts;
    be->free = sb_free;
    snprintf(be->stats.backend, sizeof(be->stats.backend), "standin");
    be->stats.auto_budget = -1.0f;
    c->d = d;
    c->m = m;
    c->n_batch = n_batch;
    c->max_slots = (int64_t) n_batch * m->hp.n_expert_used;
    c->cpu_us = calloc((size_t) m->hp.n_layer, sizeof(float));
    c->dev_us = calloc((size_t) m->hp.n_layer, sizeof(float));
    c->dev = rm_backend_cpu_new(pool, n_batch, max_in, n_ctx);
    c->host = rm_backend_cpu_new(pool, n_batch, max_in, n_ctx);
    if (!c->cpu_us || !c->dev_us || !c->dev || !c->host) {
        sb_free(be);
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for the stand-in backend");
        return NULL;
    }
    be->layer_cpu_us = c->cpu_us;
    be->layer_gpu_us = c->dev_us;
    if (!split_init(be)) {
        *st = c->err;
        rm_fail(c->err, "%s", c->msg);
        sb_free(be);
        return NULL;
    }
    *st = RM_OK;
    return be;
}
