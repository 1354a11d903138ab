/* backend.cuh - internal to native/cuda: the device state of a model (rm_gpu, made by gpu.cu)
 * and of a session (cuda_be, the CUDA backend of backend.cu, whose MoE blocks run the split of
 * split.h over the steps of split.cu). */
#ifndef RM_CUDA_BACKEND_CUH
#define RM_CUDA_BACKEND_CUH

#include <stdio.h>

#include <atomic>

#include "common.cuh"

extern "C" {
#include "gpu.h"
}
#include "devweights.h"
#include "sizes.h"
#include "split.h"

struct rm_gpu {
    int                   device;
    char                  name[128];
    uint64_t              budget;          /* 0: no cap */
    std::atomic<uint64_t> used;            /* device bytes held: the arena and every session's */
    uint8_t *             arena;           /* all weights, one allocation */
    uint64_t              arena_bytes;
    rm_dev_weights        weights;         /* what the arena holds (devweights.h) */
    /* n_layer * 3 * n_expert device pointers (gate, up, down of each expert; NULL: in host
     * memory), layer-major; the host copy tells the split which experts the host computes */
    const uint8_t **      exp_tab_dev;
    const uint8_t **      exp_tab_host;
    int32_t               n_layer, n_expert;
    int32_t               n_experts_on_gpu;
    int32_t               upload_min_tokens;
};

/* Device memory under the budget; NULL with the error set (RM_E_OOM or RM_E_CUDA). */
void * rm_gpu_malloc(rm_gpu * g, uint64_t bytes, const char * what);
void   rm_gpu_free(rm_gpu * g, void * p, uint64_t bytes);
/* The device copy of host weight bytes starting at host; NULL when not on the device. */
const uint8_t * rm_gpu_weight(const rm_gpu * g, const uint8_t * host);
/* The device table entry of (layer, which, expert), which one of RM_EXP_*. */
static inline int64_t rm_gpu_tab_index(const rm_gpu * g, int il, int which, int e) {
    return rm_dev_expert_index(g->n_expert, il, which, e);
}

typedef struct cuda_alloc {
    void *   p;
    uint64_t bytes;
} cuda_alloc;

typedef struct cuda_be {
    rm_gpu *         g;
    const rm_model * m;
    cudaStream_t     st;
    rm_backend *     host;                /* the CPU backend on the model's threads */
    rm_status        err;                 /* sticky: the first error */
    char             msg[512];
    cuda_alloc *     allocs;
    int64_t          n_allocs, cap_allocs;
    int32_t          n_batch, n_ctx;
    int64_t          max_in;
    rm_route *       routes_d;            /* n_batch * n_expert_used */
    int32_t *        idx_d;               /* indices for gather/scatter: n_batch * n_expert_used */
    float *          scale_d;
    rm_gdn_seq *     gdn_seqs_d;          /* a Gated DeltaNet step's sequences (64 at most); NULL without the layers */
    /* host fallback for matrices not on the device */
    float *          fb_x, * fb_y;
    uint64_t         fb_cap;
    /* timing of the split, per layer */
    cudaEvent_t      ev_x, ev_gu;
    cudaEvent_t *    ev_t0, * ev_t1;
    uint8_t *        pending;             /* layer's events not read yet */
    float *          cpu_us, * gpu_us;
    rm_split_state   sp;                  /* the split of the MoE blocks (split.h) */
} cuda_be;

/* Records a failed CUDA call as the backend's sticky error; 1 when e is cudaSuccess. Inline so
 * the backend (backend.cu) and its split steps (split.cu) share it without calling each other. */
static inline int rm_cuda_check(cuda_be * c, cudaError_t e, const char * what) {
    if (e == cudaSuccess) {
        return 1;
    }
    cudaGetLastError();
    if (c->err == RM_OK) {
        c->err = e == cudaErrorMemoryAllocation ? RM_E_OOM : RM_E_CUDA;
        snprintf(c->msg, sizeof(c->msg), "cuda backend (device %d, %s): %s: %s (%s)", c->g->device, c->g->name, what,
                 cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return 0;
}

/* The CUDA device's steps of the split (split.cu), which rm_split_run queues. */
extern const rm_split_device_ops rm_cuda_split_ops;

#endif
