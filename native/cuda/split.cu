/* split.cu - the CUDA device's operations for the split of a MoE block (split.h, docs/SPLIT.md).
 *
 * The sequence of a block is rm_split_run (split.c), the same the CPU stand-in runs; here are the
 * steps it queues, on the backend's one stream: copies, the grouped expert products, gathers,
 * swiglu, the combine, and events. The GPU computes every activated slot's base, x.B, for the
 * experts whose bases it holds; host threads compute the residual work next to the residuals in
 * host memory while it runs. Only activations cross: the block input and the fix rows' base
 * gate/up go down, the fix rows' h' and the host results come up, plus the plan's tables. In
 * prefill, an expert whose residual is needed by at least residual_upload_min_tokens rows has
 * its residual matrices copied to the GPU instead (up to RM_SPLIT_STAGE_MAX per block).
 *
 * Layer times (host compute vs the GPU's base work, from events) feed residual_budget = "auto".
 * The pinned buffers are reused every block without waiting for their copies: the routing of
 * the next block (cu_route) waits for the whole stream first, so the copies have run. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.cuh"
#include "matmul.cuh"
extern "C" {
#include "split.h"
}
#include "add.cuh"
#include "rows.cuh"
#include "swiglu.cuh"

static cuda_be * ctx_of(rm_backend * be) { return (cuda_be *) be->ctx; }

/* ---- scratch -------------------------------------------------------------------------------- */

static void * cs_dev_alloc(rm_backend * be, uint64_t bytes) {
    cuda_be * c = ctx_of(be);
    void * p = rm_gpu_malloc(c->g, bytes, "cuda backend: the split's scratch");
    if (!p && c->err == RM_OK) {
        c->err = RM_E_OOM;
        snprintf(c->msg, sizeof(c->msg), "%s", rm_last_error());
    }
    return p;
}

static void cs_dev_free(rm_backend * be, void * p, uint64_t bytes) { rm_gpu_free(ctx_of(be)->g, p, bytes); }

/* Pinned, so the copies run asynchronously. */
static void * cs_host_alloc(rm_backend * be, uint64_t bytes) {
    void * p = NULL;
    return rm_cuda_check(ctx_of(be), cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault), "pinned host memory") ? p
                                                                                                                         : NULL;
}

static void cs_host_free(rm_backend * be, void * p) { cudaFreeHost(p); }

static int cs_fail(rm_backend * be, rm_status st, const char * msg) {
    cuda_be * c = ctx_of(be);
    if (c->err == RM_OK) {
        c->err = st;
        snprintf(c->msg, sizeof(c->msg), "%s", msg);
    }
    return 0;
}

static int cs_has_error(rm_backend * be) { return ctx_of(be)->err != RM_OK; }

static int cs_can_stage(rm_backend * be, const rm_layer * L) {
    return L->gate_res.data && rm_cu_matmul_supports(L->gate_res.type, L->gate_res.ne[0]) &&
           rm_cu_matmul_supports(L->up_res.type, L->up_res.ne[0]) && rm_cu_matmul_supports(L->down_res.type, L->down_res.ne[0]);
}

/* ---- the queued steps ----------------------------------------------------------------------- */

static int cs_upload(rm_backend * be, void * dst, const void * src, uint64_t bytes, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st), what);
}

static int cs_download(rm_backend * be, void * dst, const void * src, uint64_t bytes, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st), what);
}

static int cs_gather(rm_backend * be, float * dst, const float * src, const int32_t * rows, int32_t n, int64_t width,
                     const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, rm_cu_gather_rows(c->st, dst, src, rows, n, width), what);
}

/* One launch over all groups; each group's matrix from the layer's device expert table. */
static int cs_experts_matmul(rm_backend * be, const rm_weight * w, int il, int which, int64_t n_in, int64_t n_out,
                             const rm_split_group * groups, int32_t n_groups, int32_t max_rows, const float * x,
                             int64_t xs, float * y, int64_t ys, const char * what) {
    cuda_be * c = ctx_of(be);
    const uint8_t * const * tab = c->g->exp_tab_dev + rm_gpu_tab_index(c->g, il, which, 0);
    return rm_cuda_check(c, rm_cu_matmul(c->st, w->type, n_in, n_out, w->row_bytes, NULL, tab, (const rm_cu_group *) groups,
                                         n_groups, max_rows, x, xs, y, ys, 0), what);
}

static int cs_staged_matmul(rm_backend * be, const rm_weight * w, const uint8_t * data, int64_t n_in, int64_t n_out,
                            int32_t n, const float * x, int64_t xs, float * y, int64_t ys, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, rm_cu_matmul(c->st, w->type, n_in, n_out, w->row_bytes, data, NULL, NULL, 1, n, x, xs, y, ys, 1),
                         what);
}

static int cs_swiglu(rm_backend * be, float * g, const float * u, int64_t n, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, rm_cu_swiglu(c->st, g, u, n), what);
}

static int cs_geglu(rm_backend * be, float * g, const float * u, int64_t n, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, rm_cu_geglu(c->st, g, n, u, n, n, 1), what);
}

static int cs_swiglu_clamp(rm_backend * be, float * g, const float * u, int64_t n, float alpha, float limit,
                           const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, rm_cu_swiglu_clamp(c->st, g, u, n, alpha, limit), what);
}

/* The bias tensor (ne = {width, n_expert}, F32) is a dense weight: the device holds all of it. */
static int cs_experts_bias(rm_backend * be, const rm_weight * b, const rm_split_group * groups, int32_t n_groups,
                           int32_t max_rows, float * y, int64_t ys, const char * what) {
    cuda_be * c = ctx_of(be);
    const float * bd = (const float *) rm_gpu_weight(c->g, b->data);
    if (!bd) {
        char msg[160];
        snprintf(msg, sizeof(msg), "cuda backend: %s: the expert biases are not on the device", what);
        return cs_fail(be, RM_E_INTERNAL, msg);
    }
    return rm_cuda_check(c, rm_cu_add_expert_bias(c->st, y, ys, bd, b->ne[0], groups, n_groups, max_rows), what);
}

static int cs_combine(rm_backend * be, float * out, const float * dev, const float * fix, const float * host,
                      const int32_t * dev_row, const int32_t * fix_row, const int32_t * host_row, const float * w,
                      int32_t n_tok, int32_t K, int64_t E, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, rm_cu_combine(c->st, out, dev, fix, host, dev_row, fix_row, host_row, w, n_tok, K, E), what);
}

static cudaEvent_t event_of(cuda_be * c, int ev, int il) {
    switch (ev) {
    case RM_SPLIT_EV_INPUT: return c->ev_x;
    case RM_SPLIT_EV_FIX: return c->ev_gu;
    case RM_SPLIT_EV_BASE0: return c->ev_t0[il];
    default: return c->ev_t1[il];
    }
}

static int cs_record(rm_backend * be, int ev, int il, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, cudaEventRecord(event_of(c, ev, il), c->st), what);
}

static int cs_wait(rm_backend * be, int ev, const char * what) {
    cuda_be * c = ctx_of(be);
    return rm_cuda_check(c, cudaEventSynchronize(event_of(c, ev, 0)), what);
}

/* The device time comes from the layer's events once the stream has passed them
 * (resolve_timings in backend.cu). */
static void cs_layer_timed(rm_backend * be, int il, double host_us) { ctx_of(be)->pending[il] = 1; }

extern const rm_split_device_ops rm_cuda_split_ops = {
    cs_dev_alloc, cs_dev_free, cs_host_alloc, cs_host_free, cs_fail, cs_has_error, cs_can_stage,
    cs_upload, cs_download, cs_gather, cs_experts_matmul, cs_staged_matmul, cs_swiglu, cs_geglu, cs_swiglu_clamp,
    cs_experts_bias, cs_combine,
    cs_record, cs_wait, cs_layer_timed,
};
