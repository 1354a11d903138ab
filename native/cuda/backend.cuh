/* backend.cuh - internal to native/cuda: the device state of a model (rm_gpu, made by gpu.cu)
 * and of a session (cuda_be, the CUDA backend of backend.cu, whose MoE stage is split.cu). */
#ifndef RM_CUDA_BACKEND_CUH
#define RM_CUDA_BACKEND_CUH

#include <atomic>

#include "common.cuh"

extern "C" {
#include "gpu.h"
}
#include "devweights.h"
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

/* Up to this many experts' residuals are copied to the device per MoE block in prefill. */
#define RM_CU_STAGE_EXPERTS RM_SPLIT_STAGE_MAX

typedef struct cuda_alloc {
    void *   p;
    uint64_t bytes;
} cuda_alloc;

/* The split's per-block plan and scratch (split.cu). Slots are (token, choice) pairs, S = n *
 * n_expert_used; rows are the slots in expert order ("compact" rows). */
typedef struct cuda_split {
    int64_t   max_slots;
    /* device */
    float *   xc, * gc, * uc, * dc;       /* compact rows: inputs, gate, up (then h), down */
    float *   gf, * uf;                   /* the fix rows' base gate/up, gathered to go to the host */
    float *   hf, * df;                   /* the fix rows' corrected h (from the host) and B_d h */
    float *   hr;                         /* host results, already weighted, rows of n_embd */
    uint8_t * tab;                        /* the plan's tables */
    uint8_t * stage;                      /* residual matrices copied for prefill */
    uint64_t  stage_bytes;
    /* pinned host */
    uint8_t * tab_h;
    uint64_t  tab_cap;
    float *   x_h;                        /* the block input, n_batch rows of n_embd */
    float *   gf_h, * uf_h;               /* from the device: base gate/up of the fix rows */
    float *   hf_h;                       /* to the device: corrected h of the fix rows */
    float *   hr_h;                       /* to the device: host results */
    /* plain host scratch for the host's products: rows in host order (fix rows, then the host
     * experts' rows) */
    float *   xs, * gs, * us;
    int32_t * host_groups;                /* n_expert rows of {expert, first row, rows, residual rows} */
} cuda_split;

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
    /* host fallback for matrices not on the device */
    float *          fb_x, * fb_y;
    uint64_t         fb_cap;
    /* timing of the split, per layer */
    cudaEvent_t      ev_x, ev_gu;
    cudaEvent_t *    ev_t0, * ev_t1;
    uint8_t *        pending;             /* layer's events not read yet */
    float *          cpu_us, * gpu_us;
    cuda_split       sp;
} cuda_be;

/* Records a failed CUDA call as the backend's sticky error; 1 when e is cudaSuccess. */
int  rm_cuda_check(cuda_be * c, cudaError_t e, const char * what);
/* Waits for an event (counted as a host sync). */
int  rm_cuda_wait(rm_backend * be, cudaEvent_t ev, const char * what);

void rm_cuda_moe_experts(rm_backend * be, const rm_moe_args * a);
int  rm_cuda_split_init(cuda_be * c);     /* 0 on failure (error recorded) */
void rm_cuda_split_free(cuda_be * c);

#endif
