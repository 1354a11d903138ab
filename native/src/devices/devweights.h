/* devweights.h - internal: which weights a device holds, and where its copies live.
 *
 * Shared by the two devices the forward pass can split over: the CUDA device (native/cuda/gpu.cu)
 * and the CPU stand-in (standin.c), so both place and find weights the same way. A device holds
 * every matrix and vector the forward pass reads per token except the token embeddings (rows are
 * looked up on the host and only the rows travel), and the expert bases the placement marks.
 * Residuals stay in host memory. Each copied range gets its own RM_DEVICE_ALIGN-aligned place in one
 * arena, so the budget check is one comparison and the device holds no fragments. */
#ifndef RM_DEVWEIGHTS_H
#define RM_DEVWEIGHTS_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Host bytes [host, host + bytes) live at dev on the device (dev == NULL until placed). */
typedef struct rm_dev_range {
    const uint8_t * host;
    uint64_t        bytes;
    uint8_t *       dev;
    uint64_t        offset;       /* in the arena */
} rm_dev_range;

/* Whether the device's kernels take matrices of this ggml type with rows of n_in weights. */
typedef int (*rm_dev_supports_fn)(int32_t type, int64_t n_in);

typedef struct rm_dev_weights {
    rm_dev_range * ranges;        /* sorted by host address, one per tensor (experts: per matrix) */
    int64_t        n_ranges;
    uint64_t       bytes;         /* the arena: each range rounded up by rm_dev_round_up */
    int32_t        n_skipped;     /* matrices (or experts) left on the host for their type */
    uint8_t *      arena;         /* where rm_dev_weights_place put them (the caller owns it) */
} rm_dev_weights;

/* Matrices of the three expert tensors of a layer in an expert table. */
enum { RM_EXP_GATE = 0, RM_EXP_UP = 1, RM_EXP_DOWN = 2 };

/* Lists what the device holds: the dense weights, and the bases of the experts on_dev marks
 * (n_layer * n_expert bytes, layer-major; NULL: all), of the types supports() accepts (NULL:
 * all). Tied tensors are listed once. 0 when out of host memory. */
int rm_dev_weights_list(const rm_model * m, const uint8_t * on_dev, rm_dev_supports_fn supports, rm_dev_weights * out);
/* Sets every range's dev pointer inside arena (w->bytes long). */
void rm_dev_weights_place(rm_dev_weights * w, uint8_t * arena);
/* Sorts the ranges by host address, as rm_dev_weights_find needs them. */
void rm_dev_weights_sort(rm_dev_weights * w);
/* The device copy of the host bytes starting at host; NULL when the device does not hold them. */
const uint8_t * rm_dev_weights_find(const rm_dev_weights * w, const uint8_t * host);
/* Fills tab (n_layer * 3 * n_expert entries, rm_dev_expert_index order) with the device copies of
 * every expert matrix, NULL where the host keeps it; returns the experts the device holds whole. */
int32_t rm_dev_expert_table(const rm_dev_weights * w, const rm_model * m, const uint8_t ** tab);
void rm_dev_weights_free(rm_dev_weights * w);

/* "1.50 GiB", "12.3 MiB", "4.0 KiB" */
void rm_dev_format_bytes(char * buf, size_t cap, uint64_t bytes);
/* Records the RM_E_OOM error of an allocation of `bytes` past a device budget, naming `what`. */
void rm_dev_budget_error(const char * what, uint64_t bytes, uint64_t held, uint64_t budget);

/* What `bytes` take in a device's arena (and, rounded the same way, in a staging buffer). */
static inline uint64_t rm_dev_round_up(uint64_t bytes) {
    return (bytes + RM_DEVICE_ALIGN - 1) / RM_DEVICE_ALIGN * RM_DEVICE_ALIGN;
}

static inline int64_t rm_dev_expert_index(int32_t n_expert, int il, int which, int e) {
    return ((int64_t) il * 3 + which) * n_expert + e;
}

#ifdef __cplusplus
}
#endif

#endif
