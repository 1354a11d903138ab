/* standin.c - a CPU stand-in for the GPU, to run the CPU/device split without one.
 *
 * The stand-in is a second CPU backend posing as a device: its own buffers under its own memory
 * budget (counted as the CUDA device counts them), the same placement of weights (devweights.h,
 * copied into its arena at load, so the forward pass never reads the mapped file's weights
 * through it), explicit copies across a "bus" that count every byte both ways, and the same
 * split of each MoE block (split.h) between its ops and host threads. Its kernels are the CPU
 * backend's, so its logits must equal the CPU's up to the order of float sums. Loaded with
 * use_gpu = RM_GPU_STANDIN (rapidmoe.h): it is rm_device_standin (device.h).
 * tests/test_split_standin.py exercises it. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devweights.h"
#include "sizes.h"
#include "split.h"
#include "status.h"

typedef struct rm_standin {
    uint64_t        budget;       /* 0: no cap */
    uint64_t        used;         /* bytes held: the arena, the expert table and every session's */
    uint8_t *       arena;
    rm_dev_weights  weights;
    const uint8_t ** exp_tab;     /* the expert table, counted as the device's */
    uint64_t        exp_tab_bytes;
    int32_t         n_experts_on_dev;
    int32_t         upload_min_tokens;
} rm_standin;

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

static void standin_close(void * dev);

static rm_status standin_open(const rm_model * m, const rm_model_params * p, void ** out, char * note, size_t note_cap) {
    *out = NULL;
    rm_standin * d = calloc(1, sizeof(*d));
    if (!d || !rm_dev_weights_list(m, p->expert_on_gpu, NULL, &d->weights)) {
        free(d);
        return rm_fail(RM_E_OOM, "rm_model_load: out of host memory listing the weights for the stand-in device");
    }
    d->budget = p->gpu_memory_bytes;
    d->upload_min_tokens = p->residual_upload_min_tokens;
    d->exp_tab_bytes = rm_device_expert_table_bytes(m->hp.n_layer, m->hp.n_expert);
    if (!(d->arena = dev_malloc(d, d->weights.bytes, "rm_model_load: the weights placed on the GPU")) ||
        !(d->exp_tab = dev_malloc(d, d->exp_tab_bytes, "rm_model_load: the expert tables"))) {
        standin_close(d);
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

static void standin_close(void * dev) {
    rm_standin * d = dev;
    if (!d) {
        return;
    }
    dev_free(d, d->arena, d->weights.bytes);
    dev_free(d, (void *) d->exp_tab, d->exp_tab_bytes);
    rm_dev_weights_free(&d->weights);
    free(d);
}

static void standin_describe(const void * dev, rm_gpu_info * info) {
    const rm_standin * d = dev;
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
    double           base_t0, base_t1;   /* the current layer's base work (split.h marks) */
    rm_split_state   sp;          /* the split of the MoE blocks (split.h) */
    void *           routes_d, * idx_d, * scale_d;                      /* device: routing, indices */
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
    c->dev->ops->matmul(c->dev, &a);
}

static void sb_matmul(rm_backend * be, const rm_matmul_args * a) {
    dev_matmul(ctx_of(be), a->w, a->mat, a->x, a->x_stride, a->n_tok, a->y, a->y_stride, a->accumulate);
}

static void sb_attention(rm_backend * be, const rm_attn_args * a) {
    sb_ctx * c = ctx_of(be);
    rm_attn_args da = *a;
    rm_weight ds;
    if (a->sinks && (c->err || !dev_weight(c, a->sinks, 0, &ds))) return;
    da.sinks = a->sinks ? &ds : NULL;
    if (!c->err) c->dev->ops->attention(c->dev, &da);
}

/* A per-head weight (ne[2] matrices) as the device's copy of all of it; 0 (error set) when the
 * device does not hold it whole. */
static int dev_weight_3d(sb_ctx * c, const rm_weight * w, rm_weight * out) {
    const uint8_t * d0 = rm_dev_weights_find(&c->d->weights, w->data);
    const uint8_t * last = rm_dev_weights_find(&c->d->weights, rm_weight_matrix(w, w->ne[2] - 1));
    if (!d0 || last != d0 + (rm_weight_matrix(w, w->ne[2] - 1) - w->data)) {
        set_error(c, RM_E_INTERNAL, "stand-in backend: a per-head weight the forward pass uses is not on the device");
        return 0;
    }
    *out = *w;
    out->data = d0;
    return 1;
}

static void sb_mla_attention(rm_backend * be, const rm_mla_args * a) {
    sb_ctx * c = ctx_of(be);
    rm_weight kb, vb;
    if (c->err || !dev_weight_3d(c, a->wk_b, &kb) || !dev_weight_3d(c, a->wv_b, &vb)) return;
    rm_mla_args da = *a;
    da.wk_b = &kb, da.wv_b = &vb;
    c->dev->ops->mla_attention(c->dev, &da);
}

static void sb_gdn(rm_backend * be, const rm_gdn_args * a) {
    sb_ctx * c = ctx_of(be);
    rm_weight cw, A, dt, norm;
    if (c->err || !dev_weight(c, a->conv1d, 0, &cw) || !dev_weight(c, a->a, 0, &A) || !dev_weight(c, a->dt_bias, 0, &dt) ||
        !dev_weight(c, a->norm, 0, &norm)) {
        return;
    }
    rm_gdn_args da = *a;
    da.conv1d = &cw, da.a = &A, da.dt_bias = &dt, da.norm = &norm;
    c->dev->ops->gdn(c->dev, &da);
}

static void sb_copy_rows(rm_backend * be, float * dst, int64_t dst_stride, const float * src, int64_t src_stride,
                         int64_t width, int64_t n_rows) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->copy_rows(c->dev, dst, dst_stride, src, src_stride, width, n_rows);
}

static void sb_mul_sigmoid(rm_backend * be, float * y, const float * gate, int64_t n, int64_t width) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->mul_sigmoid(c->dev, y, gate, n, width);
}

static void sb_rmsnorm(rm_backend * be, float * y, const float * x, const rm_weight * w, int64_t n_rows, int64_t n,
                       float eps) {
    sb_ctx * c = ctx_of(be);
    rm_weight dw;
    if (!w) {
        if (!c->err) c->dev->ops->rmsnorm(c->dev, y, x, NULL, n_rows, n, eps);
    } else if (!c->err && dev_weight(c, w, 0, &dw)) {
        c->dev->ops->rmsnorm(c->dev, y, x, &dw, n_rows, n, eps);
    }
}

static void sb_geglu(rm_backend * be, float * g, int64_t g_stride, const float * u, int64_t u_stride, int64_t width,
                     int64_t n_rows) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->geglu(c->dev, g, g_stride, u, u_stride, width, n_rows);
}

static void sb_scale(rm_backend * be, float * x, int64_t n, float f) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->scale(c->dev, x, n, f);
}

static void sb_rope_div(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                        int32_t pos0, float base, int neox, const rm_weight * div) {
    sb_ctx * c = ctx_of(be);
    rm_weight dd;
    if (!c->err && dev_weight(c, div, 0, &dd)) c->dev->ops->rope_div(c->dev, x, n_tok, n_head, head_dim, n_rot, pos0, base, neox, &dd);
}

static void sb_rope(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                    int32_t pos0, float base, int neox) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->rope(c->dev, x, n_tok, n_head, head_dim, n_rot, pos0, base, neox);
}

static void sb_rope_yarn(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                         int32_t pos0, const rm_rope_yarn * y, int neox) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->rope_yarn(c->dev, x, n_tok, n_head, head_dim, n_rot, pos0, y, neox);
}

static void sb_swiglu_clamp(rm_backend * be, float * g, const float * u, int64_t n, float alpha, float limit) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->swiglu_clamp(c->dev, g, u, n, alpha, limit);
}

static void sb_add(rm_backend * be, float * y, const float * x, int64_t n) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->add(c->dev, y, x, n);
}

static void sb_add_bias(rm_backend * be, float * y, const rm_weight * b, int64_t n_rows, int64_t n) {
    sb_ctx * c = ctx_of(be);
    rm_weight db;
    if (!c->err && dev_weight(c, b, 0, &db)) c->dev->ops->add_bias(c->dev, y, &db, n_rows, n);
}

static void sb_add_gated(rm_backend * be, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->add_gated(c->dev, y, x, gate, n_rows, n);
}

static void sb_swiglu(rm_backend * be, float * g, const float * u, int64_t n) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->swiglu(c->dev, g, u, n);
}

/* Index arrays go up before a gather or scatter, as on the GPU. */
static int index_up(rm_backend * be, int32_t n, int with_scale) {
    sb_ctx * c = ctx_of(be);
    if (n > c->sp.max_slots) {
        set_error(c, RM_E_INTERNAL, "stand-in backend: more rows than a batch has slots");
        return 0;
    }
    be->stats.h2d_bytes += (with_scale ? 8u : 4u) * (uint64_t) n;
    return c->err == RM_OK;
}

static void sb_gather_rows(rm_backend * be, float * dst, const float * src, const int32_t * rows, int32_t n,
                           int64_t width) {
    sb_ctx * c = ctx_of(be);
    if (!c->err && index_up(be, n, 0)) c->dev->ops->gather_rows(c->dev, dst, src, rows, n, width);
}

static void sb_scatter_add(rm_backend * be, float * dst, const float * src, const int32_t * rows, const float * scale,
                           int32_t n, int64_t width) {
    sb_ctx * c = ctx_of(be);
    if (!c->err && index_up(be, n, 1)) c->dev->ops->scatter_add(c->dev, dst, src, rows, scale, n, width);
}

/* The router on the device; its choices come down to the host, where the policy decides. */
static void sb_route(rm_backend * be, const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm,
                     rm_route * out) {
    sb_ctx * c = ctx_of(be);
    if (c->err) return;
    c->dev->ops->route(c->dev, logits, n_tok, n_expert, k, norm, (rm_route *) c->routes_d);
    sb_download(be, out, c->routes_d, sizeof(rm_route) * (uint64_t) n_tok * (uint64_t) k);
}

static void sb_route_gated(rm_backend * be, const float * logits, const rm_weight * bias, const rm_gating_params * g,
                           int32_t n_tok, int32_t n_expert, int32_t k, rm_route * out) {
    sb_ctx * c = ctx_of(be);
    rm_weight db;
    if (c->err || (bias && !dev_weight(c, bias, 0, &db))) return;
    c->dev->ops->route_gated(c->dev, logits, bias ? &db : NULL, g, n_tok, n_expert, k, (rm_route *) c->routes_d);
    sb_download(be, out, c->routes_d, sizeof(rm_route) * (uint64_t) n_tok * (uint64_t) k);
}

/* ---- the split's device operations (split.h), on the device's buffers -------------------- */

static int sd_fail(rm_backend * be, rm_status st, const char * msg) {
    set_error(ctx_of(be), st, msg);
    return 0;
}

static int sd_has_error(rm_backend * be) { return ctx_of(be)->err != RM_OK; }

static void sd_dev_free(rm_backend * be, void * p, uint64_t bytes) { sb_release(be, p); }

static void * sd_host_alloc(rm_backend * be, uint64_t bytes) {
    void * p = malloc(bytes ? bytes : 1);
    if (!p) set_error(ctx_of(be), RM_E_OOM, "stand-in backend: out of host memory for the split's scratch");
    return p;
}

static void sd_host_free(rm_backend * be, void * p) { free(p); }

static int sd_can_stage(rm_backend * be, const rm_layer * L) { return L->gate_res.data != NULL; }

/* Copies across the bus; the sequence counts them. */
static int sd_copy(rm_backend * be, void * dst, const void * src, uint64_t bytes, const char * what) {
    if (ctx_of(be)->err) return 0;
    if (bytes) memcpy(dst, src, bytes);
    return 1;
}

static int sd_gather(rm_backend * be, float * dst, const float * src, const int32_t * rows, int32_t n, int64_t width,
                     const char * what) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->gather_rows(c->dev, dst, src, rows, n, width);
    return !c->err;
}

static int sd_experts_matmul(rm_backend * be, const rm_weight * w, int il, int which, int64_t n_in, int64_t n_out,
                             const rm_split_group * g, int32_t n_groups, int32_t max_rows, const float * x, int64_t xs,
                             float * y, int64_t ys, const char * what) {
    sb_ctx * c = ctx_of(be);
    for (int32_t k = 0; k < n_groups; k++) {
        dev_matmul(c, w, g[k].mat, x + g[k].row0 * xs, xs, g[k].n, y + g[k].row0 * ys, ys, 0);
    }
    return !c->err;
}

static int sd_staged_matmul(rm_backend * be, const rm_weight * w, const uint8_t * data, int64_t n_in, int64_t n_out,
                            int32_t n, const float * x, int64_t xs, float * y, int64_t ys, const char * what) {
    sb_ctx * c = ctx_of(be);
    rm_weight dw = *w;
    dw.data = data;
    dw.ne[2] = 1;
    rm_matmul_args a = {&dw, 0, x, xs, n, y, ys, 1};
    if (!c->err) c->dev->ops->matmul(c->dev, &a);
    return !c->err;
}

static int sd_swiglu(rm_backend * be, float * g, const float * u, int64_t n, const char * what) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->swiglu(c->dev, g, u, n);
    return !c->err;
}

static int sd_geglu(rm_backend * be, float * g, const float * u, int64_t n, const char * what) {
    sb_geglu(be, g, n, u, n, n, 1);
    return !ctx_of(be)->err;
}

static int sd_swiglu_clamp(rm_backend * be, float * g, const float * u, int64_t n, float alpha, float limit,
                           const char * what) {
    sb_ctx * c = ctx_of(be);
    if (!c->err) c->dev->ops->swiglu_clamp(c->dev, g, u, n, alpha, limit);
    return !c->err;
}

/* Each group's rows get their expert's bias row, read from the device's copy of b. */
static int sd_experts_bias(rm_backend * be, const rm_weight * b, const rm_split_group * g, int32_t n_groups,
                           int32_t max_rows, float * y, int64_t ys, const char * what) {
    sb_ctx * c = ctx_of(be);
    rm_weight db;
    if (c->err || !dev_weight(c, b, 0, &db)) return 0;
    for (int32_t k = 0; k < n_groups; k++) {
        rm_weight row = db;
        row.data = db.data + (uint64_t) g[k].mat * db.row_bytes;
        row.ne[1] = 1;
        for (int32_t j = 0; j < g[k].n; j++) {
            c->dev->ops->add_bias(c->dev, y + (g[k].row0 + j) * ys, &row, 1, db.ne[0]);
        }
    }
    return !c->err;
}

/* The GPU's k_combine (rm_split_device_ops.combine): a token's places in order, each one add of
 * w * v as the CPU backend's scatter_add makes it, so that the sum is the CPU's. */
static int sd_combine(rm_backend * be, float * out, const float * dev, const float * fix, const float * host,
                      const int32_t * dev_row, const int32_t * fix_row, const int32_t * host_row, const float * w,
                      int32_t n_tok, int32_t K, int64_t E, const char * what) {
    if (ctx_of(be)->err) return 0;
    for (int32_t t = 0; t < n_tok; t++) {
        float * y = out + (int64_t) t * E;
        for (int32_t k = 0; k < K; k++) {
            const int32_t s = t * K + k;
            if (dev_row[s] >= 0) {
                const float * x = dev + (int64_t) dev_row[s] * E;
                for (int64_t i = 0; i < E; i++) y[i] += w[s] * x[i];
            } else if (fix_row[s] >= 0) {
                const float * b = fix + (int64_t) fix_row[s] * E, * r = host + (int64_t) host_row[s] * E;
                for (int64_t i = 0; i < E; i++) {
                    const float v = b[i] + r[i];
                    y[i] += w[s] * v;
                }
            } else if (host_row[s] >= 0) {
                const float * x = host + (int64_t) host_row[s] * E;
                for (int64_t i = 0; i < E; i++) y[i] += w[s] * x[i];
            }
        }
    }
    return 1;
}

/* The device's work has run when it was queued: a mark is the time, a wait has nothing to wait for. */
static int sd_record(rm_backend * be, int ev, int il, const char * what) {
    sb_ctx * c = ctx_of(be);
    if (ev == RM_SPLIT_EV_BASE0) c->base_t0 = now_us();
    if (ev == RM_SPLIT_EV_BASE1) c->base_t1 = now_us();
    return !c->err;
}

static int sd_wait(rm_backend * be, int ev, const char * what) { return !ctx_of(be)->err; }

static void sd_layer_timed(rm_backend * be, int il, double host_us) {
    sb_ctx * c = ctx_of(be);
    const double dev_us = c->base_t1 - c->base_t0;
    c->dev_us[il] = (float) dev_us;
    be->stats.device_ms += dev_us / 1000.0;
    be->stats.n_stalls += host_us > dev_us;
}

static const rm_split_device_ops STANDIN_SPLIT_OPS = {
    .dev_alloc      = sb_alloc,
    .dev_free       = sd_dev_free,
    .host_alloc     = sd_host_alloc,
    .host_free      = sd_host_free,
    .fail           = sd_fail,
    .has_error      = sd_has_error,
    .can_stage      = sd_can_stage,
    .upload         = sd_copy,
    .download       = sd_copy,
    .gather         = sd_gather,
    .experts_matmul = sd_experts_matmul,
    .staged_matmul  = sd_staged_matmul,
    .swiglu         = sd_swiglu,
    .swiglu_clamp   = sd_swiglu_clamp,
    .geglu          = sd_geglu,
    .experts_bias   = sd_experts_bias,
    .combine        = sd_combine,
    .record         = sd_record,
    .wait           = sd_wait,
    .layer_timed    = sd_layer_timed,
};

static void sb_moe_experts(rm_backend * be, const rm_moe_args * a) { rm_split_run(be, &ctx_of(be)->sp, a); }

/* ---- lifetime ------------------------------------------------------------------------------- */

static void sb_free(rm_backend * be) {
    if (!be) {
        return;
    }
    sb_ctx * c = ctx_of(be);
    if (c) {
        rm_split_free(be, &c->sp);
        while (c->n_allocs > 0) {
            sb_release(be, c->allocs[c->n_allocs - 1].p);
        }
        free(c->allocs);
        if (c->dev) c->dev->ops->free(c->dev);
        if (c->host) c->host->ops->free(c->host);
        free(c->cpu_us);
        free(c->dev_us);
        free(c);
    }
    free(be);
}

static const rm_backend_ops STANDIN_OPS = {
    .name        = "standin",
    .alloc       = sb_alloc,
    .release     = sb_release,
    .upload      = sb_upload,
    .download    = sb_download,
    .copy        = sb_copy,
    .zero        = sb_zero,
    .status      = sb_status,
    .matmul      = sb_matmul,
    .attention   = sb_attention,
    .rmsnorm     = sb_rmsnorm,
    .rope        = sb_rope,
    .add         = sb_add,
    .add_bias    = sb_add_bias,
    .add_gated   = sb_add_gated,
    .swiglu      = sb_swiglu,
    .rope_yarn   = sb_rope_yarn,
    .swiglu_clamp = sb_swiglu_clamp,
    .gather_rows = sb_gather_rows,
    .scatter_add = sb_scatter_add,
    .route       = sb_route,
    .route_gated = sb_route_gated,
    .mla_attention = sb_mla_attention,
    .gdn         = sb_gdn,
    .copy_rows   = sb_copy_rows,
    .mul_sigmoid = sb_mul_sigmoid,
    .geglu       = sb_geglu,
    .scale       = sb_scale,
    .rope_div    = sb_rope_div,
    .moe_experts = sb_moe_experts,
    .free        = sb_free,
};

/* The routing and index buffers, then the split's scratch: what the CUDA backend allocates, in
 * the same order and of the sizes sizes.h gives (so the planner's sums and a budget's first
 * failure hold for both). */
static int split_init(rm_backend * be) {
    sb_ctx * c = ctx_of(be);
    const rm_size_params p = rm_size_params_of(&c->m->hp, 0, c->n_batch, 0);
    uint64_t bytes[RM_SPLIT_BUF_COUNT];
    rm_split_buf_bytes(&p, bytes);
    if (!(c->routes_d = sb_alloc(be, bytes[RM_SPLIT_BUF_ROUTES])) || !(c->idx_d = sb_alloc(be, bytes[RM_SPLIT_BUF_IDX])) ||
        !(c->scale_d = sb_alloc(be, bytes[RM_SPLIT_BUF_SCALE]))) {
        return 0;
    }
    return rm_split_init(be, &c->sp, c->m, c->n_batch);
}

static rm_backend * standin_backend_new(void * dev, const rm_model * m, int32_t n_batch, int64_t max_in, int32_t n_ctx,
                                        rm_status * st) {
    rm_standin * d = dev;
    rm_pool * pool = m->pool;
    *st = RM_E_OOM;
    rm_backend * be = calloc(1, sizeof(*be));
    sb_ctx * c = calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for the stand-in backend");
        return NULL;
    }
    be->ops = &STANDIN_OPS;
    be->ctx = c;
    snprintf(be->stats.backend, sizeof(be->stats.backend), "standin");
    be->stats.auto_budget = -1.0f;
    c->d = d;
    c->m = m;
    c->n_batch = n_batch;
    c->sp.dev = &STANDIN_SPLIT_OPS;
    c->sp.exp_tab = d->exp_tab;
    c->sp.upload_min_tokens = d->upload_min_tokens;
    c->sp.who = "stand-in backend";
    c->sp.max_slots = (int64_t) n_batch * m->hp.n_expert_used;
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
    c->sp.host = c->host;
    if (!split_init(be)) {
        *st = c->err;
        rm_fail(c->err, "%s", c->msg);
        sb_free(be);
        return NULL;
    }
    *st = RM_OK;
    return be;
}

const rm_device_ops rm_device_standin = {
    .name        = "standin",
    .kind        = RM_GPU_STANDIN,
    .open        = standin_open,
    .describe    = standin_describe,
    .close       = standin_close,
    .backend_new = standin_backend_new,
};
