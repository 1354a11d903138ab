/* backend.cu - the CUDA backend: the rm_backend table (backend.h) over one stream.
 *
 * Activations live in device memory for the whole forward pass; what crosses the bus per token
 * is the embedded tokens going up, the routing coming down (the residual policy runs on the
 * host), the split's activations (split.cu) and the logits. Every copy is counted in be->stats.
 * Weights stay where load put them (gpu.cu); a product over a matrix that is not on the device
 * runs on the host CPU backend, moving its activations only.
 *
 * Errors never abort: the first failing CUDA call becomes the backend's sticky error
 * (RM_E_CUDA with the call and CUDA's message), later ops return at once, and be->ops->status()
 * reports it. status() also waits for the stream, so a kernel's asynchronous fault is caught at
 * the end of each forward pass at the latest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "add.cuh"
#include "attention.cuh"
#include "gdn.cuh"
#include "backend.cuh"
#include "matmul.cuh"
#include "mla.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "route.cuh"
#include "rows.cuh"
#include "swiglu.cuh"

static cuda_be * ctx_of(rm_backend * be) { return (cuda_be *) be->ctx; }

static void set_error(cuda_be * c, rm_status st, const char * msg) {
    if (c->err == RM_OK) {
        c->err = st;
        snprintf(c->msg, sizeof(c->msg), "%s", msg);
    }
}

/* Reads the device times of the layers whose events were recorded (the stream is idle). */
static void resolve_timings(rm_backend * be) {
    cuda_be * c = ctx_of(be);
    for (int il = 0; il < c->g->n_layer; il++) {
        if (!c->pending[il]) {
            continue;
        }
        c->pending[il] = 0;
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, c->ev_t0[il], c->ev_t1[il]) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        c->gpu_us[il] = 1000.0f * ms;
        be->stats.device_ms += ms;
        if (c->cpu_us[il] > c->gpu_us[il]) {
            be->stats.n_stalls++;
        }
    }
}

/* ---- memory ------------------------------------------------------------------------------- */

static void * cu_alloc(rm_backend * be, uint64_t bytes) {
    cuda_be * c = ctx_of(be);
    if (c->err) {
        return NULL;
    }
    if (c->n_allocs == c->cap_allocs) {
        const int64_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        cuda_alloc * a = (cuda_alloc *) realloc(c->allocs, sizeof(*a) * (size_t) cap);
        if (!a) {
            set_error(c, RM_E_OOM, "cuda backend: out of host memory");
            return NULL;
        }
        c->allocs = a;
        c->cap_allocs = cap;
    }
    void * p = rm_gpu_malloc(c->g, bytes, "cuda backend: session buffers");
    if (!p) {
        set_error(c, RM_E_OOM, rm_last_error());
        return NULL;
    }
    if (!rm_cuda_check(c, cudaMemsetAsync(p, 0, bytes, c->st), "zeroing a new buffer")) {
        rm_gpu_free(c->g, p, bytes);
        return NULL;
    }
    c->allocs[c->n_allocs++] = cuda_alloc{p, bytes};
    return p;
}

static void cu_release(rm_backend * be, void * p) {
    cuda_be * c = ctx_of(be);
    for (int64_t i = 0; i < c->n_allocs; i++) {
        if (c->allocs[i].p == p) {
            rm_gpu_free(c->g, p, c->allocs[i].bytes);
            c->allocs[i] = c->allocs[--c->n_allocs];
            return;
        }
    }
}

static void cu_upload(rm_backend * be, void * dst, const void * src, uint64_t bytes) {
    cuda_be * c = ctx_of(be);
    if (c->err || !bytes) return;
    /* from pageable memory the runtime stages the bytes before returning: src may change after */
    rm_cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st), "upload");
    be->stats.h2d_bytes += bytes;
}

static void cu_download(rm_backend * be, void * dst, const void * src, uint64_t bytes) {
    cuda_be * c = ctx_of(be);
    if (c->err || !bytes) return;
    if (rm_cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st), "download") &&
        rm_cuda_check(c, cudaStreamSynchronize(c->st), "waiting for a download")) {
        be->stats.d2h_bytes += bytes;
        be->stats.n_syncs++;
        resolve_timings(be);
    }
}

static void cu_copy(rm_backend * be, void * dst, const void * src, uint64_t bytes) {
    cuda_be * c = ctx_of(be);
    if (c->err || !bytes || dst == src) return;
    rm_cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st), "copy");
}

static void cu_zero(rm_backend * be, void * dst, uint64_t bytes) {
    cuda_be * c = ctx_of(be);
    if (c->err || !bytes) return;
    rm_cuda_check(c, cudaMemsetAsync(dst, 0, bytes, c->st), "memset");
}

/* Called by rm_session_eval before and after each batch: it also makes the model's device the
 * current one of the calling thread (the runtime keeps one per host thread). */
static rm_status cu_status(rm_backend * be) {
    cuda_be * c = ctx_of(be);
    if (c->err == RM_OK && rm_cuda_check(c, cudaSetDevice(c->g->device), "selecting the device") &&
        rm_cuda_check(c, cudaStreamSynchronize(c->st), "running the queued kernels")) {
        resolve_timings(be);
    }
    if (c->err != RM_OK) {
        return rm_fail(c->err, "%s", c->msg);
    }
    return RM_OK;
}

/* ---- products ----------------------------------------------------------------------------- */

/* y = W x on the host, for a matrix the device lacks: x comes down, y goes up. */
static void host_matmul(rm_backend * be, const rm_matmul_args * a) {
    cuda_be * c = ctx_of(be);
    const int64_t n_in = a->w->ne[0], n_out = a->w->ne[1];
    const uint64_t need = (uint64_t) a->n_tok * (uint64_t) (n_in > n_out ? n_in : n_out);
    if (need > c->fb_cap) {
        free(c->fb_x);
        free(c->fb_y);
        c->fb_x = (float *) malloc(sizeof(float) * need);
        c->fb_y = (float *) malloc(sizeof(float) * need);
        c->fb_cap = c->fb_x && c->fb_y ? need : 0;
        if (!c->fb_cap) {
            set_error(c, RM_E_OOM, "cuda backend: out of host memory for a product on the host");
            return;
        }
    }
    const size_t f = sizeof(float);
    if (!rm_cuda_check(c, cudaMemcpy2DAsync(c->fb_x, f * n_in, a->x, f * a->x_stride, f * n_in, a->n_tok,
                                            cudaMemcpyDeviceToHost, c->st), "host product: input") ||
        (a->accumulate && !rm_cuda_check(c, cudaMemcpy2DAsync(c->fb_y, f * n_out, a->y, f * a->y_stride, f * n_out,
                                                              a->n_tok, cudaMemcpyDeviceToHost, c->st), "host product: output")) ||
        !rm_cuda_check(c, cudaStreamSynchronize(c->st), "host product: waiting")) {
        return;
    }
    be->stats.d2h_bytes += f * (uint64_t) a->n_tok * (uint64_t) (n_in + (a->accumulate ? n_out : 0));
    be->stats.n_syncs++;
    rm_matmul_args h = *a;
    h.x = c->fb_x;
    h.x_stride = n_in;
    h.y = c->fb_y;
    h.y_stride = n_out;
    c->host->ops->matmul(c->host, &h);
    /* waited for: fb_y is reused by the next host product */
    rm_cuda_check(c, cudaMemcpy2DAsync(a->y, f * a->y_stride, c->fb_y, f * n_out, f * n_out, a->n_tok,
                                       cudaMemcpyHostToDevice, c->st), "host product: result") &&
        rm_cuda_check(c, cudaStreamSynchronize(c->st), "host product: waiting for the result");
    be->stats.h2d_bytes += f * (uint64_t) a->n_tok * (uint64_t) n_out;
}

static void cu_matmul(rm_backend * be, const rm_matmul_args * a) {
    cuda_be * c = ctx_of(be);
    if (c->err || a->n_tok <= 0) return;
    const uint8_t * w = rm_gpu_weight(c->g, rm_weight_matrix(a->w, a->mat));
    if (!w || !rm_cu_matmul_supports(a->w->type, a->w->ne[0])) {
        host_matmul(be, a);
        return;
    }
    rm_cuda_check(c, rm_cu_matmul(c->st, a->w->type, a->w->ne[0], a->w->ne[1], a->w->row_bytes, w, NULL, NULL, 1,
                                  a->n_tok, a->x, a->x_stride, a->y, a->y_stride, a->accumulate), "matmul");
}

static const float * dev_vector(cuda_be * c, const rm_weight * w, const char * what);

static void cu_attention(rm_backend * be, const rm_attn_args * a) {
    cuda_be * c = ctx_of(be);
    const float * sinks = NULL;
    if (c->err || (a->sinks && !(sinks = dev_vector(c, a->sinks, "attention sink")))) return;
    rm_cuda_check(c, rm_cu_attention(c->st, a, sinks), "attention");
}

/* Multi-head latent attention in the absorbed form for every sequence (its floats differ from the
 * CPU's expanded prefill only in the order of sums): per head, the query's latent Kb_h^T q_nope
 * (a product over matrix h of attn_k_b) beside its rotary part, attention over the cached latents
 * (mla.cu), then Vb_h on the weighted latent sum. */
static void cu_mla_attention(rm_backend * be, const rm_mla_args * a) {
    cuda_be * c = ctx_of(be);
    const int64_t H = a->n_head, D = a->head_dim, R = a->n_rot, C = a->kv_lora_rank, LA = C + R, DV = a->head_dim_v;
    for (int32_t r = 0; r < a->n_seqs && !c->err; r++) {
        const rm_mla_seq * sq = &a->seqs_host[r];
        const float * q = a->q + (int64_t) sq->row0 * H * D;
        float * qlat = a->qlat + (int64_t) sq->row0 * H * LA, * olat = a->olat + (int64_t) sq->row0 * H * C;
        for (int64_t h = 0; h < H; h++) {
            const rm_matmul_args m = {a->wk_b, h, q + h * D, H * D, sq->n, qlat + h * LA, H * LA, 0};
            cu_matmul(be, &m);
        }
        if (c->err || !rm_cuda_check(c, rm_cu_mla_rope_part(c->st, q, qlat, sq->n, (int32_t) H, (int32_t) D, (int32_t) R,
                                                            (int32_t) C), "mla: rotary part") ||
            !rm_cuda_check(c, rm_cu_mla_latent_attention(c->st, qlat, (const float *) sq->cache, olat, sq->n, sq->pos, (int32_t) H,
                                                         (int32_t) C, (int32_t) R, a->scale), "mla: latent attention")) {
            return;
        }
        for (int64_t h = 0; h < H; h++) {
            const rm_matmul_args m = {a->wv_b, h, olat + h * C, H * C, sq->n, a->out + ((int64_t) sq->row0 * H + h) * DV,
                                      H * DV, 0};
            cu_matmul(be, &m);
        }
    }
}

/* The middle of a Gated DeltaNet layer (gdn.cu), the sequences' state pointers sent up first. */
static void cu_gdn(rm_backend * be, const rm_gdn_args * a) {
    cuda_be * c = ctx_of(be);
    if (c->err || a->n_seqs <= 0) return;
    const uint8_t * filters = rm_gpu_weight(c->g, a->conv1d->data);
    const float * A = dev_vector(c, a->a, "the delta rule's decay"), * dt = A ? dev_vector(c, a->dt_bias, "dt_bias") : NULL;
    const float * norm = dt ? dev_vector(c, a->norm, "the gated norm") : NULL;
    if (!norm) return;
    if (!filters || !c->gdn_seqs_d || a->n_seqs > 64) {
        set_error(c, RM_E_INTERNAL, !filters ? "cuda backend: the conv filters are not on the device"
                                             : "cuda backend: a Gated DeltaNet step of more sequences than it has room for");
        return;
    }
    cu_upload(be, c->gdn_seqs_d, a->seqs_host, sizeof(rm_gdn_seq) * (uint64_t) a->n_seqs);
    rm_cuda_check(c, rm_cu_gdn(c->st, a, c->gdn_seqs_d, filters, a->conv1d->type, a->conv1d->row_bytes, A, dt, norm),
                  "gated delta net");
}

static void cu_copy_rows(rm_backend * be, float * dst, int64_t dst_stride, const float * src, int64_t src_stride,
                         int64_t width, int64_t n_rows) {
    cuda_be * c = ctx_of(be);
    if (!c->err) rm_cuda_check(c, rm_cu_copy_rows(c->st, dst, dst_stride, src, src_stride, width, n_rows), "copy rows");
}

static void cu_mul_sigmoid(rm_backend * be, float * y, const float * gate, int64_t n, int64_t width) {
    cuda_be * c = ctx_of(be);
    if (!c->err) rm_cuda_check(c, rm_cu_mul_sigmoid(c->st, y, gate, n, width), "output gate");
}

/* ---- small ops ---------------------------------------------------------------------------- */

static const float * dev_vector(cuda_be * c, const rm_weight * w, const char * what) {
    const float * d = (const float *) rm_gpu_weight(c->g, w->data);
    if (!d) {
        char msg[128];
        snprintf(msg, sizeof(msg), "cuda backend: %s weights are not on the device", what);
        set_error(c, RM_E_INTERNAL, msg);
    }
    return d;
}

static void cu_rmsnorm(rm_backend * be, float * y, const float * x, const rm_weight * w, int64_t n_rows, int64_t n,
                       float eps) {
    cuda_be * c = ctx_of(be);
    const float * wd = NULL;
    if (c->err || (w && !(wd = dev_vector(c, w, "norm")))) return;
    rm_cuda_check(c, rm_cu_rmsnorm(c->st, y, x, wd, n_rows, n, eps), "rmsnorm");
}

static void cu_geglu(rm_backend * be, float * g, int64_t g_stride, const float * u, int64_t u_stride, int64_t width,
                     int64_t n_rows) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_geglu(c->st, g, g_stride, u, u_stride, width, n_rows), "geglu");
}

static void cu_scale(rm_backend * be, float * x, int64_t n, float f) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_scale(c->st, x, n, f), "scale");
}

static void cu_rope_div(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                        int32_t pos0, float base, int neox, const rm_weight * div) {
    cuda_be * c = ctx_of(be);
    const float * dd;
    if (c->err || !(dd = dev_vector(c, div, "rope_freqs"))) return;
    rm_cuda_check(c, rm_cu_rope_div(c->st, x, n_tok, n_head, head_dim, n_rot, pos0, base, neox, dd), "rope_div");
}

static void cu_rope(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                    int32_t pos0, float base, int neox) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_rope(c->st, x, n_tok, n_head, head_dim, n_rot, pos0, base, neox), "rope");
}

static void cu_rope_yarn(rm_backend * be, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                         int32_t pos0, const rm_rope_yarn * y, int neox) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_rope_yarn(c->st, x, n_tok, n_head, head_dim, n_rot, pos0, *y, neox), "rope_yarn");
}

static void cu_swiglu_clamp(rm_backend * be, float * g, const float * u, int64_t n, float alpha, float limit) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_swiglu_clamp(c->st, g, u, n, alpha, limit), "swiglu_clamp");
}

static void cu_add(rm_backend * be, float * y, const float * x, int64_t n) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_add(c->st, y, x, n), "add");
}

static void cu_add_bias(rm_backend * be, float * y, const rm_weight * b, int64_t n_rows, int64_t n) {
    cuda_be * c = ctx_of(be);
    const float * bd;
    if (c->err || !(bd = dev_vector(c, b, "bias"))) return;
    rm_cuda_check(c, rm_cu_add_bias(c->st, y, bd, n_rows, n), "add_bias");
}

static void cu_add_gated(rm_backend * be, float * y, const float * x, const float * gate, int64_t n_rows, int64_t n) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_add_gated(c->st, y, x, gate, n_rows, n), "add_gated");
}

static void cu_swiglu(rm_backend * be, float * g, const float * u, int64_t n) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    rm_cuda_check(c, rm_cu_swiglu(c->st, g, u, n), "swiglu");
}

static int upload_index(rm_backend * be, const int32_t * rows, const float * scale, int32_t n) {
    cuda_be * c = ctx_of(be);
    const int64_t cap = (int64_t) c->n_batch * c->m->hp.n_expert_used;
    if (n > cap) {
        set_error(c, RM_E_INTERNAL, "cuda backend: more rows than a batch has slots");
        return 0;
    }
    cu_upload(be, c->idx_d, rows, sizeof(int32_t) * (uint64_t) n);
    if (scale) {
        cu_upload(be, c->scale_d, scale, sizeof(float) * (uint64_t) n);
    }
    return c->err == RM_OK;
}

static void cu_gather_rows(rm_backend * be, float * dst, const float * src, const int32_t * rows, int32_t n,
                           int64_t width) {
    cuda_be * c = ctx_of(be);
    if (c->err || !upload_index(be, rows, NULL, n)) return;
    rm_cuda_check(c, rm_cu_gather_rows(c->st, dst, src, c->idx_d, n, width), "gather_rows");
}

static void cu_scatter_add(rm_backend * be, float * dst, const float * src, const int32_t * rows, const float * scale,
                           int32_t n, int64_t width) {
    cuda_be * c = ctx_of(be);
    if (c->err || !upload_index(be, rows, scale, n)) return;
    rm_cuda_check(c, rm_cu_scatter_add(c->st, dst, src, c->idx_d, c->scale_d, n, width), "scatter_add");
}

/* The router on the device; its choices come to the host, where the residual policy decides. */
static void cu_route(rm_backend * be, const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm,
                     rm_route * out) {
    cuda_be * c = ctx_of(be);
    if (c->err) return;
    if (rm_cuda_check(c, rm_cu_route(c->st, logits, n_tok, n_expert, k, norm, c->routes_d), "route")) {
        cu_download(be, out, c->routes_d, sizeof(rm_route) * (uint64_t) n_tok * (uint64_t) k);
    }
}

static void cu_route_gated(rm_backend * be, const float * logits, const rm_weight * bias, const rm_gating_params * g,
                           int32_t n_tok, int32_t n_expert, int32_t k, rm_route * out) {
    cuda_be * c = ctx_of(be);
    const float * b = NULL;
    if (g->gating == RM_GATING_SQRT_SOFTPLUS || g->hash) {
        set_error(c, RM_E_UNSUPPORTED_ARCH, "cu_route_gated: DeepSeek-V4's sqrt(softplus) and hash routing run on the CPU "
                  "backend only");
        return;
    }
    if (c->err || (bias && !(b = dev_vector(c, bias, "the router's selection bias")))) return;
    if (rm_cuda_check(c, rm_cu_route_gated(c->st, logits, b, g, n_tok, n_expert, k, c->routes_d), "grouped route")) {
        cu_download(be, out, c->routes_d, sizeof(rm_route) * (uint64_t) n_tok * (uint64_t) k);
    }
}

/* The routed experts: the split's sequence (split.c) over this device's steps (split.cu). */
static void cu_moe_experts(rm_backend * be, const rm_moe_args * a) { rm_split_run(be, &ctx_of(be)->sp, a); }

/* ---- lifetime ----------------------------------------------------------------------------- */

static void cu_free(rm_backend * be) {
    if (!be) {
        return;
    }
    cuda_be * c = ctx_of(be);
    if (c->st) {
        cudaStreamSynchronize(c->st);
    }
    rm_split_free(be, &c->sp);
    while (c->n_allocs > 0) {
        cu_release(be, c->allocs[c->n_allocs - 1].p);
    }
    free(c->allocs);
    for (int il = 0; il < c->g->n_layer; il++) {
        if (c->ev_t0 && c->ev_t0[il]) cudaEventDestroy(c->ev_t0[il]);
        if (c->ev_t1 && c->ev_t1[il]) cudaEventDestroy(c->ev_t1[il]);
    }
    if (c->ev_x) cudaEventDestroy(c->ev_x);
    if (c->ev_gu) cudaEventDestroy(c->ev_gu);
    if (c->st) cudaStreamDestroy(c->st);
    cudaGetLastError();
    free(c->ev_t0);
    free(c->ev_t1);
    free(c->pending);
    free(c->cpu_us);
    free(c->gpu_us);
    free(c->fb_x);
    free(c->fb_y);
    if (c->host) {
        c->host->ops->free(c->host);
    }
    delete c;
    free(be);
}

static const rm_backend_ops CUDA_OPS = {
    .name        = "cuda",
    .alloc       = cu_alloc,
    .release     = cu_release,
    .upload      = cu_upload,
    .download    = cu_download,
    .copy        = cu_copy,
    .zero        = cu_zero,
    .status      = cu_status,
    .matmul      = cu_matmul,
    .attention   = cu_attention,
    .rmsnorm     = cu_rmsnorm,
    .rope        = cu_rope,
    .add         = cu_add,
    .add_bias    = cu_add_bias,
    .add_gated   = cu_add_gated,
    .swiglu      = cu_swiglu,
    .rope_yarn   = cu_rope_yarn,
    .swiglu_clamp = cu_swiglu_clamp,
    .gather_rows = cu_gather_rows,
    .scatter_add = cu_scatter_add,
    .route       = cu_route,
    .route_gated = cu_route_gated,
    .mla_attention = cu_mla_attention,
    .gdn         = cu_gdn,
    .copy_rows   = cu_copy_rows,
    .mul_sigmoid = cu_mul_sigmoid,
    .geglu       = cu_geglu,
    .scale       = cu_scale,
    .rope_div    = cu_rope_div,
    .moe_experts = cu_moe_experts,
    .free        = cu_free,
};

static rm_backend * cuda_backend_new(void * dev, const rm_model * m, int32_t n_batch, int64_t max_in, int32_t n_ctx,
                                     rm_status * st_out) {
    rm_gpu * g = (rm_gpu *) dev;
    rm_pool * pool = m->pool;
    *st_out = RM_E_OOM;
    rm_backend * be = (rm_backend *) calloc(1, sizeof(*be));
    cuda_be * c = new (std::nothrow) cuda_be();
    if (!be || !c) {
        free(be);
        delete c;
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for the CUDA backend");
        return NULL;
    }
    be->ops = &CUDA_OPS;
    be->ctx = c;
    snprintf(be->stats.backend, sizeof(be->stats.backend), "cuda");
    be->stats.auto_budget = -1.0f;
    c->g = g;
    c->m = m;
    c->n_batch = n_batch;
    c->n_ctx = n_ctx;
    c->max_in = max_in;
    const int nl = g->n_layer;
    c->ev_t0 = (cudaEvent_t *) calloc((size_t) nl, sizeof(cudaEvent_t));
    c->ev_t1 = (cudaEvent_t *) calloc((size_t) nl, sizeof(cudaEvent_t));
    c->pending = (uint8_t *) calloc((size_t) nl, 1);
    c->cpu_us = (float *) calloc((size_t) nl, sizeof(float));
    c->gpu_us = (float *) calloc((size_t) nl, sizeof(float));
    c->host = rm_backend_cpu_new(pool, n_batch, max_in, n_ctx);
    if (!c->ev_t0 || !c->ev_t1 || !c->pending || !c->cpu_us || !c->gpu_us || !c->host) {
        cu_free(be);
        rm_fail(RM_E_OOM, "rm_session_new: out of memory for the CUDA backend");
        return NULL;
    }
    be->layer_cpu_us = c->cpu_us;
    be->layer_gpu_us = c->gpu_us;
    c->sp.dev = &rm_cuda_split_ops;
    c->sp.host = c->host;
    c->sp.exp_tab = g->exp_tab_host;
    c->sp.upload_min_tokens = g->upload_min_tokens;
    c->sp.who = "cuda backend";
    int ok = rm_cuda_check(c, cudaSetDevice(g->device), "selecting the device") &&
             rm_cuda_check(c, cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking), "creating a stream") &&
             rm_cuda_check(c, cudaEventCreateWithFlags(&c->ev_x, cudaEventDisableTiming), "creating an event") &&
             rm_cuda_check(c, cudaEventCreateWithFlags(&c->ev_gu, cudaEventDisableTiming), "creating an event");
    for (int il = 0; ok && il < nl; il++) {
        ok = rm_cuda_check(c, cudaEventCreate(&c->ev_t0[il]), "creating an event") &&
             rm_cuda_check(c, cudaEventCreate(&c->ev_t1[il]), "creating an event");
    }
    const rm_size_params sizes = rm_size_params_of(&m->hp, n_ctx, n_batch, 0);
    uint64_t bytes[RM_SPLIT_BUF_COUNT];
    rm_split_buf_bytes(&sizes, bytes);
    ok = ok && (c->routes_d = (rm_route *) cu_alloc(be, bytes[RM_SPLIT_BUF_ROUTES])) &&
         (c->idx_d = (int32_t *) cu_alloc(be, bytes[RM_SPLIT_BUF_IDX])) &&
         (c->scale_d = (float *) cu_alloc(be, bytes[RM_SPLIT_BUF_SCALE])) && rm_split_init(be, &c->sp, m, n_batch) &&
         (m->hp.ssm_n_v <= 0 || (c->gdn_seqs_d = (rm_gdn_seq *) cu_alloc(be, 64 * sizeof(rm_gdn_seq))));
    if (!ok) {
        *st_out = c->err != RM_OK ? c->err : RM_E_CUDA;
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", c->msg);
        cu_free(be);
        rm_fail(*st_out, "%s", msg);
        return NULL;
    }
    *st_out = RM_OK;
    return be;
}

/* ---- the device (device.h) ---------------------------------------------------------------- */

static rm_status cuda_open(const rm_model * m, const rm_model_params * p, void ** out, char * note, size_t note_cap) {
    rm_gpu * g = NULL;
    rm_status st = rm_gpu_open(m, p, &g, note, note_cap);
    *out = g;
    return st;
}

static void cuda_describe(const void * dev, rm_gpu_info * info) { rm_gpu_describe((const rm_gpu *) dev, info); }

static void cuda_close(void * dev) { rm_gpu_close((rm_gpu *) dev); }

extern "C" const rm_device_ops rm_device_cuda = {
    "cuda", RM_GPU_CUDA, cuda_open, cuda_describe, cuda_close, cuda_backend_new,
};
